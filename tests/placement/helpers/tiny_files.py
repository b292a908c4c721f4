"""Model files with the real key layouts, for metadata tests.

Layouts are {name: (safetensors dtype, shape)}. `write_header_file` writes a valid
safetensors file whose data section is a sparse hole (real-size layouts cost no disk
and no time); `write_random_file` writes small random weights through the safetensors
library itself, to prove the header reader agrees with the real writer.
"""
import json
import os
import struct

import numpy as np

ITEM_BITS = {"F64": 64, "F32": 32, "F16": 16, "BF16": 16, "F8_E4M3": 8, "F8_E5M2": 8,
             "I64": 64, "I32": 32, "I16": 16, "I8": 8, "U8": 8, "BOOL": 8}


def nbytes(dtype, shape):
    n = 1
    for d in shape:
        n *= d
    return n * ITEM_BITS[dtype] // 8


def header_bytes(layout, metadata=None):
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape) in layout.items():
        size = nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return raw, offset


def write_header_file(path, layout, metadata=None):
    raw, data = header_bytes(layout, metadata)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.truncate(8 + len(raw) + data)
    return os.fspath(path)


def write_random_file(path, layout):
    from safetensors.numpy import save_file
    rng = np.random.default_rng(0)
    np_types = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
                "U8": np.uint8, "I8": np.int8, "F64": np.float64, "BOOL": np.bool_}
    arrays = {name: rng.standard_normal(shape).astype(np_types[dtype])
              for name, (dtype, shape) in layout.items()}
    save_file(arrays, os.fspath(path))
    return os.fspath(path)


def total(layout):
    return sum(nbytes(d, s) for d, s in layout.values())


def prefixed(prefix, layout):
    return {prefix + k: v for k, v in layout.items()}


# -- layouts (ComfyUI / original key names) -------------------------------------------
def flux(hidden=3072, double=19, single=38, dtype="BF16", mlp=4, in_ch=64, txt=4096, vec=768,
         guidance=True, chroma=False):
    h, m = hidden, hidden * mlp
    head = 128 if hidden >= 128 else hidden // 2
    L = {}
    L["img_in.weight"], L["img_in.bias"] = (dtype, (h, in_ch)), (dtype, (h,))
    L["txt_in.weight"], L["txt_in.bias"] = (dtype, (h, txt)), (dtype, (h,))
    if chroma:
        L["distilled_guidance_layer.in_proj.weight"] = (dtype, (h, 64))
    else:
        L["time_in.in_layer.weight"] = (dtype, (h, 256))
        L["time_in.out_layer.weight"] = (dtype, (h, h))
        L["vector_in.in_layer.weight"] = (dtype, (h, vec))
        L["vector_in.out_layer.weight"] = (dtype, (h, h))
        if guidance:
            L["guidance_in.in_layer.weight"] = (dtype, (h, 256))
            L["guidance_in.out_layer.weight"] = (dtype, (h, h))
    for i in range(double):
        for s in ("img", "txt"):
            p = f"double_blocks.{i}.{s}_"
            if not chroma:
                L[p + "mod.lin.weight"], L[p + "mod.lin.bias"] = (dtype, (6 * h, h)), (dtype, (6 * h,))
            L[p + "attn.qkv.weight"], L[p + "attn.qkv.bias"] = (dtype, (3 * h, h)), (dtype, (3 * h,))
            L[p + "attn.norm.query_norm.scale"] = (dtype, (head,))
            L[p + "attn.norm.key_norm.scale"] = (dtype, (head,))
            L[p + "attn.proj.weight"], L[p + "attn.proj.bias"] = (dtype, (h, h)), (dtype, (h,))
            L[p + "mlp.0.weight"], L[p + "mlp.0.bias"] = (dtype, (m, h)), (dtype, (m,))
            L[p + "mlp.2.weight"], L[p + "mlp.2.bias"] = (dtype, (h, m)), (dtype, (h,))
    for i in range(single):
        p = f"single_blocks.{i}."
        L[p + "linear1.weight"], L[p + "linear1.bias"] = (dtype, (3 * h + m, h)), (dtype, (3 * h + m,))
        L[p + "linear2.weight"], L[p + "linear2.bias"] = (dtype, (h, h + m)), (dtype, (h,))
        L[p + "norm.query_norm.scale"] = (dtype, (head,))
        L[p + "norm.key_norm.scale"] = (dtype, (head,))
        if not chroma:
            L[p + "modulation.lin.weight"] = (dtype, (3 * h, h))
    L["final_layer.linear.weight"] = (dtype, (in_ch, h))
    L["final_layer.adaLN_modulation.1.weight"] = (dtype, (2 * h, h))
    return L


def sd3(hidden=64, depth=3, dtype="F16"):
    h = hidden
    L = {"x_embedder.proj.weight": (dtype, (h, 16, 2, 2)), "pos_embed": (dtype, (1, 36, h)),
         "context_embedder.weight": (dtype, (h, 32)), "t_embedder.mlp.0.weight": (dtype, (h, 256))}
    for i in range(depth):
        for part in ("x_block", "context_block"):
            p = f"joint_blocks.{i}.{part}."
            if part == "context_block" and i == depth - 1:   # the last context block is pre-only
                L[p + "adaLN_modulation.1.weight"] = (dtype, (2 * h, h))
                continue
            L[p + "attn.qkv.weight"] = (dtype, (3 * h, h))
            L[p + "attn.proj.weight"] = (dtype, (h, h))
            L[p + "mlp.fc1.weight"] = (dtype, (4 * h, h))
            L[p + "mlp.fc2.weight"] = (dtype, (h, 4 * h))
            L[p + "adaLN_modulation.1.weight"] = (dtype, (6 * h, h))
    L["final_layer.linear.weight"] = (dtype, (64, h))
    return L


def wan(hidden=64, depth=3, dtype="BF16", in_ch=16):
    h = hidden
    L = {"patch_embedding.weight": (dtype, (h, in_ch, 1, 2, 2)), "text_embedding.0.weight": (dtype, (h, 64)),
         "time_embedding.0.weight": (dtype, (h, 32)), "head.head.weight": (dtype, (64, h))}
    for i in range(depth):
        p = f"blocks.{i}."
        for a in ("self_attn", "cross_attn"):
            for x in "qkvo":
                L[f"{p}{a}.{x}.weight"] = (dtype, (h, h))
        L[p + "ffn.0.weight"], L[p + "ffn.2.weight"] = (dtype, (3 * h, h)), (dtype, (h, 3 * h))
        L[p + "modulation"] = (dtype, (1, 6, h))
    return L


def unet(ch=32, ctx=768, dtype="F16", sdxl=False):
    L = {"time_embed.0.weight": (dtype, (4 * ch, ch)), "input_blocks.0.0.weight": (dtype, (ch, 4, 3, 3))}
    if sdxl:
        L["label_emb.0.0.weight"] = (dtype, (4 * ch, 2816))
    for i in range(1, 4):
        L[f"input_blocks.{i}.0.in_layers.2.weight"] = (dtype, (ch * i, ch, 3, 3))
        L[f"input_blocks.{i}.1.transformer_blocks.0.attn2.to_k.weight"] = (dtype, (ch * i, ctx))
    for j in range(3):
        L[f"middle_block.{j}.weight"] = (dtype, (ch * 3, ch * 3))
    for i in range(4):
        L[f"output_blocks.{i}.0.in_layers.2.weight"] = (dtype, (ch, ch, 3, 3))
    L["out.2.weight"] = (dtype, (4, ch, 3, 3))
    return L


def vae(ch=8, dtype="F16", levels=3):
    L = {"encoder.conv_in.weight": (dtype, (ch, 3, 3, 3)), "decoder.conv_in.weight": (dtype, (ch * 4, 4, 3, 3))}
    for i in range(levels):
        L[f"encoder.down.{i}.block.0.conv1.weight"] = (dtype, (ch * (i + 1), ch, 3, 3))
        L[f"decoder.up.{i}.block.0.conv1.weight"] = (dtype, (ch * (i + 1), ch, 3, 3))
    for part in ("encoder", "decoder"):
        L[f"{part}.mid.block_1.conv1.weight"] = (dtype, (ch * 4, ch * 4, 3, 3))
        L[f"{part}.mid.attn_1.q.weight"] = (dtype, (ch * 4, ch * 4, 1, 1))
    L["decoder.conv_out.weight"] = (dtype, (3, ch, 3, 3))
    L["quant_conv.weight"] = (dtype, (8, 8, 1, 1))
    return L


def taesd(ch=8, dtype="F16"):
    L = {}
    for part in ("encoder", "decoder"):
        for i in range(4):
            L[f"{part}.layers.{i}.conv.0.weight"] = (dtype, (ch, ch, 3, 3))
    return L


def t5(hidden=64, ffn=160, depth=3, dtype="BF16", umt5=False, vocab=100):
    L = {"shared.weight": (dtype, (vocab, hidden)), "encoder.final_layer_norm.weight": (dtype, (hidden,))}
    for i in range(depth):
        p = f"encoder.block.{i}.layer."
        for x in "qkvo":
            L[f"{p}0.SelfAttention.{x}.weight"] = (dtype, (hidden, hidden))
        if i == 0 or umt5:
            L[f"{p}0.SelfAttention.relative_attention_bias.weight"] = (dtype, (32, hidden // 8))
        L[p + "0.layer_norm.weight"] = (dtype, (hidden,))
        L[p + "1.DenseReluDense.wi_0.weight"] = (dtype, (ffn, hidden))
        L[p + "1.DenseReluDense.wi_1.weight"] = (dtype, (ffn, hidden))
        L[p + "1.DenseReluDense.wo.weight"] = (dtype, (hidden, ffn))
        L[p + "1.layer_norm.weight"] = (dtype, (hidden,))
    return L


def clip_text(hidden=768, depth=2, dtype="F16", vocab=100, prefix="text_model."):
    L = {prefix + "embeddings.token_embedding.weight": (dtype, (vocab, hidden)),
         prefix + "embeddings.position_embedding.weight": (dtype, (77, hidden)),
         prefix + "final_layer_norm.weight": (dtype, (hidden,))}
    for i in range(depth):
        p = f"{prefix}encoder.layers.{i}."
        for x in ("q_proj", "k_proj", "v_proj", "out_proj"):
            L[f"{p}self_attn.{x}.weight"] = (dtype, (hidden, hidden))
        L[p + "mlp.fc1.weight"], L[p + "mlp.fc2.weight"] = (dtype, (4 * hidden, hidden)), (dtype, (hidden, 4 * hidden))
        L[p + "layer_norm1.weight"] = (dtype, (hidden,))
    return L


def open_clip(width=1280, depth=2, dtype="F16"):
    L = {"model.token_embedding.weight": (dtype, (100, width)), "model.ln_final.weight": (dtype, (width,))}
    for i in range(depth):
        p = f"model.transformer.resblocks.{i}."
        L[p + "attn.in_proj_weight"] = (dtype, (3 * width, width))
        L[p + "attn.out_proj.weight"] = (dtype, (width, width))
        L[p + "mlp.c_fc.weight"], L[p + "mlp.c_proj.weight"] = (dtype, (4 * width, width)), (dtype, (width, 4 * width))
    return L


def llm(hidden=64, ffn=160, depth=3, dtype="BF16"):
    L = {"model.embed_tokens.weight": (dtype, (100, hidden)), "model.norm.weight": (dtype, (hidden,))}
    for i in range(depth):
        p = f"model.layers.{i}."
        for x in ("q_proj", "k_proj", "v_proj", "o_proj"):
            L[f"{p}self_attn.{x}.weight"] = (dtype, (hidden, hidden))
        for x in ("gate_proj", "up_proj"):
            L[f"{p}mlp.{x}.weight"] = (dtype, (ffn, hidden))
        L[p + "mlp.down_proj.weight"] = (dtype, (hidden, ffn))
    return L


def clip_vision(hidden=64, depth=2, dtype="F16"):
    L = {"vision_model.embeddings.patch_embedding.weight": (dtype, (hidden, 3, 14, 14)),
         "vision_model.post_layernorm.weight": (dtype, (hidden,))}
    for i in range(depth):
        p = f"vision_model.encoder.layers.{i}."
        for x in ("q_proj", "k_proj", "v_proj", "out_proj"):
            L[f"{p}self_attn.{x}.weight"] = (dtype, (hidden, hidden))
        L[p + "mlp.fc1.weight"], L[p + "mlp.fc2.weight"] = (dtype, (4 * hidden, hidden)), (dtype, (hidden, 4 * hidden))
    return L


def controlnet(ch=32, dtype="F16"):
    L = {"input_hint_block.0.weight": (dtype, (16, 3, 3, 3)), "time_embed.0.weight": (dtype, (4 * ch, ch)),
         "input_blocks.0.0.weight": (dtype, (ch, 4, 3, 3))}
    for i in range(1, 3):
        L[f"input_blocks.{i}.0.in_layers.2.weight"] = (dtype, (ch, ch, 3, 3))
        L[f"zero_convs.{i}.0.weight"] = (dtype, (ch, ch, 1, 1))
    L["middle_block.0.in_layers.2.weight"] = (dtype, (ch, ch, 3, 3))
    L["middle_block_out.0.weight"] = (dtype, (ch, ch, 1, 1))
    return L


def esrgan(nf=16, blocks=3, dtype="F32"):
    L = {"conv_first.weight": (dtype, (nf, 3, 3, 3)), "trunk_conv.weight": (dtype, (nf, nf, 3, 3)),
         "upconv1.weight": (dtype, (nf, nf, 3, 3)), "upconv2.weight": (dtype, (nf, nf, 3, 3)),
         "HRconv.weight": (dtype, (nf, nf, 3, 3)), "conv_last.weight": (dtype, (3, nf, 3, 3))}
    for i in range(blocks):
        for r in (1, 2, 3):
            L[f"RRDB_trunk.{i}.RDB{r}.conv1.weight"] = (dtype, (nf // 2, nf, 3, 3))
    return L


def repeated(groups, extra=(), dtype="BF16", hidden=32):
    """A layout of numbered groups: groups = {'double_stream_blocks': 2, ...}, each block
    two matrices; `extra` top-level names get one matrix each."""
    L = {f"{name}.weight": (dtype, (hidden, hidden)) for name in extra}
    for group, count in groups.items():
        for i in range(count):
            L[f"{group}.{i}.attn.qkv.weight"] = (dtype, (3 * hidden, hidden))
            L[f"{group}.{i}.mlp.fc.weight"] = (dtype, (4 * hidden, hidden))
    return L

"""Runs inside ComfyUI's own Python, with ComfyUI-GGUF installed: GGUF models loaded by
ComfyUI-GGUF's "Unet Loader (GGUF)" go through Apply Placement (streamed from host
memory and from the file, layer split, row split, with LoRA), and each image is compared
with ComfyUI-GGUF's own run without placement.

Started by test_comfy_gguf.py as `PYTHON gguf_driver.py --comfyui DIR --pack DIR --work DIR`.
It reuses comfy_driver.py's headless ComfyUI, prompts and observers, writes tiny GGUF
files of the real Flux architecture (the driver's tiny random Flux models, quantized
Q8_0 and Q4_K by the pack's writer), and prints one JSON object. It asserts nothing.

ComfyUI-GGUF's weights are GGMLTensors (a tensor subclass): the runs are under the
simulated device's check and working-memory meter like any model's. Two test nodes see
it: PlacementTestForwardBytes records the bytes copied host-to-device after each model
call, and PlacementTestSkipArrival runs one double block with no hook on it or inside
it, so that block never arrives (the check must refuse its resting weights).
"""
import asyncio
import collections
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import comfy_driver as cd  # noqa: E402  (parses the same arguments, sets ComfyUI up)

import torch  # noqa: E402
import safetensors.torch  # noqa: E402

import comfy.patcher_extension  # noqa: E402
import execution  # noqa: E402
import nodes  # noqa: E402
import server  # noqa: E402

RESULTS = {"errors": []}
# each device holds the ring or a split's share and the working memory, which the meter
# counts: every layer dequantizes its weight in float32 (up to 448 KiB here; a LoRA patch
# adds as much again). The plans also leave room for the working memory estimated before
# the first call, larger than that, so these devices are several times the quantized
# models (Q8_0 tiny Flux 1.9 MB, Q4_K wide one 2.3 MB); the stream plans still stream
# every block. The simulated device allocates no kernel workspace beside what it meters:
# plans for it reserve none (placement/devices.py '@workspace=SIZE').
NO_WORKSPACE = "@workspace=0"
STREAM_INVENTORY = f"cuda0=16MiB{NO_WORKSPACE}"
SPLIT_INVENTORY = f"cuda0=16MiB{NO_WORKSPACE},cuda1=16MiB{NO_WORKSPACE}"
WIDE_INVENTORY = f"cuda0=32MiB{NO_WORKSPACE},cuda1=32MiB{NO_WORKSPACE}"


# -- test-only nodes ----------------------------------------------------------------
FORWARD_H2D = {}        # tag -> host-to-device bytes of every device after each model call


class PlacementTestForwardBytes:
    """A clone of MODEL that records, after each model call, the bytes the placement has
    copied host-to-device so far (all devices together): what each forward moved."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "tag": ("STRING", {"default": ""})}}
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, model, tag):
        m = model.clone()
        session = m.get_attachment("placement")
        seen = FORWARD_H2D.setdefault(tag, [])

        def after_call(executor, *args, **kwargs):
            out = executor(*args, **kwargs)
            placed = getattr(session, "placed", None)
            if placed is not None:
                seen.append(sum(d["h2d_bytes"] for d in placed.stats()["devices"].values()))
            return out
        m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.APPLY_MODEL,
                               "placement_test_bytes", after_call)
        return (m,)


class PlacementTestSkipArrival:
    """A clone of MODEL whose single block `index` runs with no hook on it or on any
    module inside it, as a loop calling a block's own code would: it never arrives.
    (A single block: the last ones stream whatever prefix the free memory keeps.)"""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "index": ("INT", {"default": 1})}}
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, model, index):
        session = model.get_attachment("placement")

        def block(args, extra):
            blk = session.placed.module.single_blocks[index]       # the network placed
            saved = [(m, m._forward_pre_hooks, m._forward_hooks) for m in blk.modules()]
            for m, _, _ in saved:
                m._forward_pre_hooks = collections.OrderedDict()
                m._forward_hooks = collections.OrderedDict()
            try:
                return extra["original_block"](args)
            finally:
                for m, pre, post in saved:
                    m._forward_pre_hooks, m._forward_hooks = pre, post
        m = model.clone()
        m.set_model_patch_replace(block, "dit", "single_block", index)
        return (m,)


cd.TEST_NODES.update({"PlacementTestForwardBytes": PlacementTestForwardBytes,
                      "PlacementTestSkipArrival": PlacementTestSkipArrival})


# llama.cpp's T5 names, as ComfyUI-GGUF's T5_SD_MAP reads them back (applied in order)
T5_NAMES = (("enc.", "encoder."), (".blk.", ".block."), ("token_embd", "shared"),
            ("output_norm", "final_layer_norm"), ("attn_q", "layer.0.SelfAttention.q"),
            ("attn_k", "layer.0.SelfAttention.k"), ("attn_v", "layer.0.SelfAttention.v"),
            ("attn_o", "layer.0.SelfAttention.o"), ("attn_norm", "layer.0.layer_norm"),
            ("attn_rel_b", "layer.0.SelfAttention.relative_attention_bias"),
            ("ffn_up", "layer.1.DenseReluDense.wi_1"), ("ffn_down", "layer.1.DenseReluDense.wo"),
            ("ffn_gate", "layer.1.DenseReluDense.wi_0"), ("ffn_norm", "layer.1.layer_norm"))
# CLIP-L + Q8_0 T5: 4.1 MiB non-block + 0.9 in blocks, and working memory: the T5's
# token table dequantized (32128 x 32, float32 then float16: 5.9 MiB) and its attention
# (planned in float32, the dtype ComfyUI computes these encoders in on the CPU the
# simulated devices run on: 18.5 MiB, hence 28 MiB devices)
TE_STREAM_INVENTORY = f"cuda0=28MiB{NO_WORKSPACE}"
TE_SPLIT_INVENTORY = f"cuda0=28MiB{NO_WORKSPACE},cuda1=28MiB{NO_WORKSPACE}"


def t5_gguf_name(key):
    for short, long in reversed(T5_NAMES):
        key = key.replace(long, short)
    return key


def build_t5_gguf(work):
    """comfy_driver's tiny T5 as a llama.cpp-named 't5encoder' GGUF, 2-D weights Q8_0."""
    from comfyui_placement.runtime.gguf.write import write_gguf
    d = os.path.join(work, "models", "text_encoders")
    sd = safetensors.torch.load_file(os.path.join(d, "tiny_t5.safetensors"))
    renamed = {t5_gguf_name(k): v.float() for k, v in sd.items()}
    for short, k in zip(renamed, sd):                   # the loader's map gives the keys back
        back = short
        for a, b in T5_NAMES:
            back = back.replace(a, b)
        assert back == k, (short, back, k)
    path = os.path.join(d, "tiny_t5_q8_0.gguf")
    written = write_gguf(path, renamed, "Q8_0", arch="t5encoder")
    from comfyui_placement.runtime.gguf import GGUFTensors
    with GGUFTensors(path) as table:
        blocks = sum(t.nbytes for t in table if ".blk." in t.name)
    return {"quantized": sum(1 for k in written.values() if k == "Q8_0"),
            "tensors": len(written), "block_bytes": blocks,
            "float16_block_bytes": sum(v.numel() * 2 for k, v in sd.items() if ".block." in k)}


def build_gguf_files(work):
    """The driver's tiny Flux models as GGUF, named and laid out as ComfyUI-GGUF expects."""
    from comfyui_placement.runtime.gguf.write import write_gguf
    from comfyui_placement.runtime.gguf import GGUFTensors
    d = os.path.join(work, "models", "diffusion_models")
    out = {}
    for src, qtype, dst in (("tiny_flux.safetensors", "Q8_0", "tiny_flux_q8_0.gguf"),
                            ("tiny_flux_wide.safetensors", "Q4_K", "tiny_flux_wide_q4_k.gguf")):
        sd = safetensors.torch.load_file(os.path.join(d, src))
        written = write_gguf(os.path.join(d, dst), sd, qtype, arch="flux")
        table = GGUFTensors(os.path.join(d, dst))
        out[dst] = {"types": table.types(), "bytes": sum(t.nbytes for t in table),
                    "float32_bytes": sum(v.numel() * 4 for v in sd.values()),
                    "block_bytes": sum(t.nbytes for t in table if "blocks." in t.name),
                    # each block's bytes in the engine's order (double, then single)
                    "per_block": [sum(t.nbytes for t in table
                                      if t.name.startswith(f"{kind}.{i}."))
                                  for kind in ("double_blocks", "single_blocks")
                                  for i in range(len({t.name.split(".")[1] for t in table
                                                      if t.name.startswith(kind + ".")}))],
                    "quantized": sum(1 for k in written.values() if k != "F32")}
        table.close()
    return out


async def start(pack, work):
    """comfy_driver's headless ComfyUI, with ComfyUI-GGUF linked next to the pack."""
    custom = os.path.join(work, "custom_nodes")
    os.makedirs(custom, exist_ok=True)
    src = os.path.join(cd.ARGS.comfyui, "custom_nodes", "ComfyUI-GGUF")
    RESULTS["comfyui_gguf_installed"] = os.path.isfile(os.path.join(src, "nodes.py"))
    if RESULTS["comfyui_gguf_installed"]:
        link = os.path.join(custom, "ComfyUI-GGUF")
        if not os.path.lexists(link):
            os.symlink(src, link)
    await cd.start_comfy(pack, work)
    RESULTS["registered"] = {n: n in nodes.NODE_CLASS_MAPPINGS
                             for n in ("UnetLoaderGGUF", "DualCLIPLoaderGGUF", "PlacementApply")}


def gguf_pipeline(unet, count_bytes=False, skip_arrival=None, **kw):
    """comfy_driver's pipeline from Unet Loader (GGUF); `count_bytes`: the sampler's model
    records what each call copied (FORWARD_H2D under the tag); `skip_arrival`: that
    double block never arrives."""
    prompt = cd.pipeline(**kw)
    prompt["1"] = {"class_type": "UnetLoaderGGUF", "inputs": {"unet_name": unet}}
    if skip_arrival is not None:
        prompt["51"] = {"class_type": "PlacementTestSkipArrival", "inputs": {
            "model": prompt["6"]["inputs"]["model"], "index": skip_arrival}}
        prompt["6"]["inputs"]["model"] = ["51", 0]
    if count_bytes:
        prompt["50"] = {"class_type": "PlacementTestForwardBytes", "inputs": {
            "model": prompt["6"]["inputs"]["model"], "tag": kw["tag"]}}
        prompt["6"]["inputs"]["model"] = ["50", 0]
    return prompt


def ggml_weights(model):
    """The loader's GGMLTensors as plain uint8/float copies with their patches count."""
    out = {}
    for k, v in model.model.diffusion_model.named_parameters():
        out[k] = torch.Tensor(v.detach()).to("cpu", copy=True) if hasattr(v, "tensor_type") \
            else v.detach().to("cpu", copy=True)
    return out


def patches_left(model):
    return sum(len(getattr(p, "patches", []) or []) for p in model.model.parameters())


async def run(executor, name, prompt, ref=None):
    rec = await cd.run_prompt(executor, prompt, name)
    rec["session"] = cd.session_facts(name)
    rec["forward_h2d"] = FORWARD_H2D.get(name)
    if ref:
        rec["image"] = cd.compare(name, ref)
    RESULTS[name] = rec
    return rec


async def scenarios(executor, q8, wide):
    base = {"backend": "diffusion=cuda0,vae=cpu", "stream_layers": True}
    # ComfyUI-GGUF's own runs: the references
    await run(executor, "reference", gguf_pipeline(q8, placed=False, tag="reference",
                                                   keep=True))
    loader_model = cd.KEPT["reference"]["model"]
    weights_before = ggml_weights(loader_model)
    RESULTS["loader_patcher"] = type(loader_model).__name__
    await run(executor, "lora_reference", gguf_pipeline(q8, placed=False, lora="before",
                                                        tag="lora_reference"))
    RESULTS["lora_changes_image"] = cd.compare("lora_reference", "reference")
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = STREAM_INVENTORY
    try:
        for residency in ("cpu", "disk"):
            tag = f"stream_{residency}"
            await run(executor, tag, gguf_pipeline(
                q8, params_backend=f"diffusion={residency}", tag=tag, keep_placed=True,
                count_bytes=True, **base), "reference")
        for where, residency in (("before", "cpu"), ("after", "disk")):
            tag = f"lora_{where}_{residency}"
            await run(executor, tag, gguf_pipeline(
                q8, params_backend=f"diffusion={residency}", lora=where, tag=tag,
                keep_placed=True, **base), "lora_reference")
        # single block 1 (the last) never arrives: a GPU refuses its weights, so must
        # the check
        await run(executor, "skip_arrival", gguf_pipeline(
            q8, params_backend="diffusion=cpu", tag="skip_arrival", skip_arrival=1, **base))
    finally:
        del os.environ["COMFYUI_PLACEMENT_SIMULATE"]
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = SPLIT_INVENTORY
    try:
        await run(executor, "split_layer", gguf_pipeline(
            q8, backend="diffusion=cuda0&cuda1,vae=cpu", params_backend="diffusion=cpu",
            split_mode="layer", tag="split_layer", keep_placed=True, count_bytes=True),
            "reference")
        await run(executor, "split_layer_lora", gguf_pipeline(
            q8, backend="diffusion=cuda0&cuda1,vae=cpu", params_backend="diffusion=cpu",
            split_mode="layer", lora="before", tag="split_layer_lora", keep_placed=True),
            "lora_reference")
        await run(executor, "split_layer_disk", gguf_pipeline(
            q8, backend="diffusion=cuda0&cuda1,vae=cpu", params_backend="diffusion=disk",
            split_mode="layer", tag="split_layer_disk", keep_placed=True, count_bytes=True),
            "reference")
    finally:
        del os.environ["COMFYUI_PLACEMENT_SIMULATE"]
    RESULTS["loader_weights_unchanged"] = cd.same_weights(weights_before,
                                                          ggml_weights(loader_model))
    RESULTS["loader_patches_left"] = patches_left(loader_model)
    # the wide Q4_K model: row split shards its block Linears (256 wide and more)
    wide_lora = "tiny_flux_wide_lora.safetensors"
    await run(executor, "wide_reference", gguf_pipeline(wide, placed=False,
                                                        tag="wide_reference"))
    await run(executor, "wide_lora_reference", gguf_pipeline(
        wide, placed=False, lora="before", lora_name=wide_lora, tag="wide_lora_reference"))
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = WIDE_INVENTORY
    try:
        await run(executor, "wide_row", gguf_pipeline(
            wide, backend="diffusion=cuda0&cuda1,vae=cpu", params_backend="diffusion=cpu",
            split_mode="row", tag="wide_row", keep_placed=True), "wide_reference")
        await run(executor, "wide_row_lora", gguf_pipeline(
            wide, backend="diffusion=cuda0&cuda1,vae=cpu", params_backend="diffusion=cpu",
            split_mode="row", lora="before", lora_name=wide_lora, tag="wide_row_lora",
            keep_placed=True), "wide_lora_reference")
        RESULTS["wide_row_lora_vs_plain"] = cd.compare("wide_row_lora", "wide_reference")
    finally:
        del os.environ["COMFYUI_PLACEMENT_SIMULATE"]


def te_pipeline(**kw):
    """comfy_driver's pipeline with Flux's text encoders from DualCLIPLoader (GGUF): the
    tiny CLIP-L (safetensors) and the tiny T5 (Q8_0 GGUF)."""
    prompt = cd.pipeline(text=("tiny_clip_l.safetensors", "tiny_t5_q8_0.gguf"), **kw)
    prompt["40"] = {"class_type": "DualCLIPLoaderGGUF", "inputs": {
        "clip_name1": "tiny_clip_l.safetensors", "clip_name2": "tiny_t5_q8_0.gguf",
        "type": "flux"}}
    return prompt


def te_checks(tag):
    """Per text-encoder call of the placed CLIP kept under `tag`: the device check, the
    metered working memory and the bytes copied host-to-device."""
    clip = cd.KEPT.get(tag, {}).get("clip")
    session = clip.patcher.get_attachment("placement") if clip is not None else None
    if session is None:
        return None
    out = []
    for c in session.calls:
        st = c["stats"]
        out.append({"device_check": st.get("device_check"),
                    "working_peak_bytes": {n: d.get("working_peak_bytes")
                                           for n, d in st["devices"].items()},
                    "h2d_bytes": sum(d["h2d_bytes"] for d in st["devices"].values()),
                    "resident_weight_bytes": st.get("resident_weight_bytes")})
    return out


async def te_scenarios(executor):
    await run(executor, "te_reference", te_pipeline(placed=False, tag="te_reference"))
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = TE_STREAM_INVENTORY
    try:
        tag = "te_stream"
        rec = await run(executor, tag, te_pipeline(
            backend="diffusion=cpu,vae=cpu,te=cuda0", stream_layers=True, tag=tag,
            keep_placed=True), "te_reference")
        rec["calls"] = cd.clip_calls(tag + "_clip")
        rec["checks"] = te_checks(tag + "_clip")
    finally:
        del os.environ["COMFYUI_PLACEMENT_SIMULATE"]
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = TE_SPLIT_INVENTORY
    try:
        tag = "te_split"
        rec = await run(executor, tag, te_pipeline(
            backend="diffusion=cpu,vae=cpu,te=cuda0&cuda1", tag=tag, keep_placed=True),
            "te_reference")
        rec["calls"] = cd.clip_calls(tag + "_clip")
        rec["checks"] = te_checks(tag + "_clip")
    finally:
        del os.environ["COMFYUI_PLACEMENT_SIMULATE"]


async def main():
    work = cd.ARGS.work
    cd.build_models(work)
    RESULTS["files"] = build_gguf_files(work)
    RESULTS["t5_file"] = build_t5_gguf(work)
    await start(cd.ARGS.pack, work)
    if not RESULTS["registered"]["UnetLoaderGGUF"]:
        return                                  # the pytest side says what is missing
    executor = execution.PromptExecutor(server.PromptServer.instance,
                                        cache_type=execution.CacheType.CLASSIC,
                                        cache_args={"ram": 16.0, "ram_inactive": 16.0})
    if os.environ.get("PLACEMENT_GGUF_ONLY") != "te":     # quicker while developing
        await scenarios(executor, "tiny_flux_q8_0.gguf", "tiny_flux_wide_q4_k.gguf")
    await te_scenarios(executor)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
    print("PLACEMENT_GGUF_RESULTS " + json.dumps(cd.jsonable(RESULTS)))

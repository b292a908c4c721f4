"""Runs inside ComfyUI's own Python: a headless, in-process ComfyUI with this pack.

Started by test_comfyui.py as `PYTHON comfy_driver.py --comfyui DIR --pack DIR --work DIR`.
It builds tiny random models (a Flux-architecture diffusion model and a TAESD VAE),
runs real API-format prompts through ComfyUI's validator and executor, records facts
(what ran where, what the prompts returned, the state of the loaders' objects before
and after) and prints them as one JSON object on the last line. It asserts nothing:
the pytest side does.
"""
import argparse
import asyncio
import json
import os
import sys
import traceback

PACK_NODE_IDS = ("PlacementDevices", "PlacementBackendAssignment", "PlacementApply")
WIDTH = HEIGHT = 64


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--comfyui", required=True)
    ap.add_argument("--pack", required=True)
    ap.add_argument("--work", required=True)
    return ap.parse_args()


ARGS = parse_args()
sys.path.insert(0, ARGS.comfyui)
os.chdir(ARGS.comfyui)
# pytorch attention, as ComfyUI picks on NVIDIA: the simulated device meters what each
# operation allocates, and the CPU's split attention would allocate score matrices no GPU run does
sys.argv = [sys.argv[0], "--cpu", "--disable-dynamic-vram", "--use-pytorch-cross-attention",
            "--output-directory",
            os.path.join(ARGS.work, "output"), "--temp-directory", os.path.join(ARGS.work, "tmp")]

import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()

import torch  # noqa: E402
import safetensors.torch  # noqa: E402

import folder_paths  # noqa: E402
import comfy.model_management  # noqa: E402
import comfy.ops  # noqa: E402
import comfy.ldm.flux.model  # noqa: E402
import comfy.taesd.taesd  # noqa: E402
import execution  # noqa: E402
import nodes  # noqa: E402
import server  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import headless  # noqa: E402
# drivers use cd.pack_module, cd.validate, cd.run_prompt, cd.PLANS
from headless import (PLANS, PlacementTestPlanSink, pack_module, run_prompt,  # noqa: E402,F401
                      validate)

RESULTS = {"errors": []}


# -- tiny random models, saved where ComfyUI's loaders look --------------------------
def build_models(work):
    torch.manual_seed(0)
    diffusion_dir = os.path.join(work, "models", "diffusion_models")
    vae_dir = os.path.join(work, "models", "vae")
    os.makedirs(diffusion_dir, exist_ok=True)
    os.makedirs(vae_dir, exist_ok=True)
    flux = comfy.ldm.flux.model.Flux(
        operations=comfy.ops.disable_weight_init, dtype=torch.float32,
        in_channels=16, out_channels=16, vec_in_dim=32, context_in_dim=32, hidden_size=128,
        mlp_ratio=4.0, num_heads=1, depth=2, depth_single_blocks=2, axes_dim=[16, 56, 56],
        theta=10000, patch_size=2, qkv_bias=True, guidance_embed=False, txt_ids_dims=[])
    with torch.no_grad():
        for p in flux.parameters():
            p.normal_(0.0, 0.02)
    safetensors.torch.save_file({k: v.contiguous() for k, v in flux.state_dict().items()},
                                os.path.join(diffusion_dir, "tiny_flux.safetensors"))
    # a wider one whose block Linears (256 wide and more) row split can shard
    wide = comfy.ldm.flux.model.Flux(
        operations=comfy.ops.disable_weight_init, dtype=torch.float32,
        in_channels=16, out_channels=16, vec_in_dim=32, context_in_dim=32, hidden_size=256,
        mlp_ratio=4.0, num_heads=2, depth=1, depth_single_blocks=1, axes_dim=[16, 56, 56],
        theta=10000, patch_size=2, qkv_bias=True, guidance_embed=False, txt_ids_dims=[])
    with torch.no_grad():
        for p in wide.parameters():
            p.normal_(0.0, 0.02)
    safetensors.torch.save_file({k: v.contiguous() for k, v in wide.state_dict().items()},
                                os.path.join(diffusion_dir, "tiny_flux_wide.safetensors"))
    taesd = comfy.taesd.taesd.TAESD(latent_channels=16)   # its convs skip init as well
    with torch.no_grad():
        for name, p in taesd.named_parameters():
            if name in ("vae_scale", "vae_shift"):
                continue
            p.normal_(0.0, 0.05) if name.endswith("weight") else p.zero_()
    safetensors.torch.save_file({k: v.contiguous() for k, v in taesd.state_dict().items()},
                                os.path.join(vae_dir, "tiny_taesd.safetensors"))
    # a random LoRA for every Linear of the blocks (ComfyUI's generic key format)
    lora_dir = os.path.join(work, "models", "loras")
    os.makedirs(lora_dir, exist_ok=True)
    lora, rank = {}, 4
    for name, mod in flux.named_modules():
        if isinstance(mod, torch.nn.Linear) and "blocks." in name:
            base = f"diffusion_model.{name}"
            lora[f"{base}.lora_down.weight"] = torch.randn(rank, mod.in_features) * 0.1
            lora[f"{base}.lora_up.weight"] = torch.randn(mod.out_features, rank) * 0.1
            lora[f"{base}.alpha"] = torch.tensor(float(rank))
    safetensors.torch.save_file(lora, os.path.join(lora_dir, "tiny_flux_lora.safetensors"))
    # the wide model's: a plain LoRA on every block Linear (all row-splittable), and on
    # one of them the kinds row split cannot slice: LoHa, DoRA, a bias diff
    wide_lora = {}
    for name, mod in wide.named_modules():
        if isinstance(mod, torch.nn.Linear) and "blocks." in name:
            base = f"diffusion_model.{name}"
            wide_lora[f"{base}.lora_down.weight"] = torch.randn(rank, mod.in_features) * 0.1
            wide_lora[f"{base}.lora_up.weight"] = torch.randn(mod.out_features, rank) * 0.1
            wide_lora[f"{base}.alpha"] = torch.tensor(float(rank))
    safetensors.torch.save_file(wide_lora, os.path.join(lora_dir, "tiny_flux_wide_lora.safetensors"))
    base, (n_out, n_in) = ("diffusion_model.double_blocks.0.img_attn.proj",
                           wide.double_blocks[0].img_attn.proj.weight.shape)
    loha = {f"{base}.hada_w1_a": torch.randn(n_out, rank) * 0.1,
            f"{base}.hada_w1_b": torch.randn(rank, n_in) * 0.1,
            f"{base}.hada_w2_a": torch.randn(n_out, rank) * 0.1,
            f"{base}.hada_w2_b": torch.randn(rank, n_in) * 0.1,
            f"{base}.alpha": torch.tensor(float(rank))}
    dora = {f"{base}.lora_down.weight": torch.randn(rank, n_in) * 0.1,
            f"{base}.lora_up.weight": torch.randn(n_out, rank) * 0.1,
            f"{base}.dora_scale": torch.ones(n_out, 1)}
    bias = {f"{base}.diff_b": torch.randn(n_out) * 0.1}
    for kind, sd in (("loha", loha), ("dora", dora), ("bias_diff", bias)):
        safetensors.torch.save_file(sd, os.path.join(lora_dir, f"tiny_flux_wide_{kind}.safetensors"))
    # and one for the tiny CLIP's attention and MLP layers (ComfyUI's text-encoder keys)
    clip_lora, hidden, inter = {}, TINY_CLIP_CONFIG["hidden_size"], TINY_CLIP_CONFIG["intermediate_size"]
    for layer in range(TINY_CLIP_CONFIG["num_hidden_layers"]):
        for name, (n_in, n_out) in {"self_attn.q_proj": (hidden, hidden),
                                    "self_attn.v_proj": (hidden, hidden),
                                    "mlp.fc1": (hidden, inter), "mlp.fc2": (inter, hidden)}.items():
            base = f"text_encoders.clip_l.transformer.text_model.encoder.layers.{layer}.{name}"
            clip_lora[f"{base}.lora_down.weight"] = torch.randn(rank, n_in) * 0.2
            clip_lora[f"{base}.lora_up.weight"] = torch.randn(n_out, rank) * 0.2
            clip_lora[f"{base}.alpha"] = torch.tensor(float(rank))
    safetensors.torch.save_file(clip_lora, os.path.join(lora_dir, "tiny_clip_lora.safetensors"))
    folder_paths.add_model_folder_path("loras", lora_dir, is_default=True)
    folder_paths.add_model_folder_path("diffusion_models", diffusion_dir, is_default=True)
    folder_paths.add_model_folder_path("vae", vae_dir, is_default=True)
    build_clip_files(work)


def build_clip_files(work):
    """The tiny CLIP-L saved where Load CLIP looks: in float16, the dtype ComfyUI loads
    text encoders in here (so the engine can stream it from the file), and in float32
    (ComfyUI casts it at load: no exact match for disk residency)."""
    import comfy.clip_model
    te_dir = os.path.join(work, "models", "text_encoders")
    os.makedirs(te_dir, exist_ok=True)
    g = torch.Generator().manual_seed(7)
    shapes = comfy.clip_model.CLIPTextModel(dict(TINY_CLIP_CONFIG), torch.float32, "cpu",
                                            comfy.ops.manual_cast).state_dict()
    sd = {k: torch.randn(v.shape, generator=g) * 0.05 for k, v in shapes.items()}
    for name, dtype in (("tiny_clip_l.safetensors", torch.float16),
                        ("tiny_clip_l_fp32.safetensors", torch.float32)):
        safetensors.torch.save_file({k: v.to(dtype).contiguous() for k, v in sd.items()},
                                    os.path.join(te_dir, name))
    # a tiny T5 (width 32: with CLIP-L, Flux's pair through DualCLIPLoader)
    import comfy.text_encoders.t5
    shapes = comfy.text_encoders.t5.T5(dict(TINY_T5_CONFIG), torch.float32, "cpu",
                                       comfy.ops.manual_cast).state_dict()
    safetensors.torch.save_file(
        {k: (torch.randn(v.shape, generator=g) * 0.05).half() for k, v in shapes.items()},
        os.path.join(te_dir, "tiny_t5.safetensors"))
    folder_paths.add_model_folder_path("text_encoders", te_dir, is_default=True)
    use_tiny_clip_config_for_loaders()


def use_tiny_clip_config_for_loaders():
    """Test-only: a CLIP-L that core's Load CLIP builds (no config given) gets the tiny
    config, so the real loader path (file, cached_patcher_init, key renames) runs on the
    tiny file. Only this driver process is affected."""
    import comfy.sd1_clip
    original = comfy.sd1_clip.SDClipModel.__init__

    def init(self, *args, textmodel_json_config=None, **kwargs):
        if textmodel_json_config is None:
            textmodel_json_config = dict(TINY_CLIP_CONFIG)
        elif str(textmodel_json_config).endswith("t5_config_xxl.json"):
            textmodel_json_config = dict(TINY_T5_CONFIG)
        original(self, *args, textmodel_json_config=textmodel_json_config, **kwargs)
    comfy.sd1_clip.SDClipModel.__init__ = init


# -- test-only nodes (never shipped in the pack) -------------------------------------
KEPT = {}
SINK = {}


class PlacementTestConditioning:
    """Random CONDITIONING in place of a text encoder (there is no tiny one)."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0})}}
    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, seed):
        g = torch.Generator().manual_seed(seed)
        return ([[torch.randn(1, 8, 32, generator=g),
                  {"pooled_output": torch.randn(1, 32, generator=g)}]],)


class PlacementTestKeep:
    """Keeps references to the loaders' MODEL and VAE and snapshots their state."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "vae": ("VAE",), "tag": ("STRING", {"default": ""})}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def run(self, model, vae, tag):
        KEPT[tag] = {"model": model, "vae": vae, "model_state": model_state(model),
                     "vae_state": vae_state(vae)}
        return {}


class PlacementTestImageSink:
    """Records the decoded image so prompts can be compared."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE",), "tag": ("STRING", {"default": ""})}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def run(self, images, tag):
        SINK[tag] = images.detach().to("cpu", copy=True)
        return {}


TINY_CLIP_CONFIG = {
    "num_hidden_layers": 3, "hidden_size": 32, "num_attention_heads": 2,
    "intermediate_size": 64, "hidden_act": "quick_gelu", "max_position_embeddings": 77,
    "eos_token_id": 49407, "bos_token_id": 49406, "pad_token_id": 1, "vocab_size": 49408,
    "projection_dim": 32, "layer_norm_eps": 1e-5, "model_type": "clip_text_model"}


TINY_T5_CONFIG = {
    "d_ff": 2048, "d_kv": 16, "d_model": 32, "num_heads": 2, "num_layers": 4,
    "vocab_size": 32128, "is_gated_act": True, "dense_act_fn": "gelu_pytorch_tanh",
    "relative_attention_num_buckets": 32, "layer_norm_epsilon": 1e-6, "model_type": "t5",
    "eos_token_id": 1, "pad_token_id": 0}


class PlacementTestTinyClip:
    """A random CLIP-L-architecture text encoder (3 layers, width 32: its conditioning fits
    the tiny Flux) with ComfyUI's own CLIP object, tokenizer and patcher."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0})}}
    RETURN_TYPES = ("CLIP",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, seed):
        import comfy.sd
        import comfy.sd1_clip

        class TinyClipL(comfy.sd1_clip.SDClipModel):
            def __init__(self, device="cpu", dtype=None, model_options={}, **kw):
                super().__init__(device=device, dtype=dtype, model_options=model_options,
                                 textmodel_json_config=dict(TINY_CLIP_CONFIG), **kw)

        class Target:
            params = {"clip_model": TinyClipL}
            clip = comfy.sd1_clip.SD1ClipModel
            tokenizer = comfy.sd1_clip.SD1Tokenizer
        clip = comfy.sd.CLIP(target=Target())
        g = torch.Generator().manual_seed(seed)
        for p in clip.cond_stage_model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        return (clip,)


class PlacementTestKeepModel:
    """Keeps a reference to a MODEL (e.g. Apply Placement's output) for inspection."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "tag": ("STRING", {"default": ""})}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def run(self, model, tag):
        KEPT[tag] = {"model": model}
        return {}


class PlacementTestKeepVae:
    """Keeps a reference to a VAE (e.g. Apply Placement's output) for inspection."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"vae": ("VAE",), "tag": ("STRING", {"default": ""})}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def run(self, vae, tag):
        KEPT[tag] = {"vae": vae}
        return {}


class PlacementTestKeepClip:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"clip": ("CLIP",), "tag": ("STRING", {"default": ""})}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def run(self, clip, tag):
        KEPT[tag] = {"clip": clip}
        return {}


class PlacementTestInterrupt:
    """A clone of MODEL whose second double block asks ComfyUI to stop on its Nth call,
    the way the UI's cancel button does (the flag, then ComfyUI's own check): an
    interrupt in the middle of a step, with streamed blocks in flight."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "at_call": ("INT", {"default": 3})}}
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, model, at_call):
        calls = [0]

        def block(args, extra):
            calls[0] += 1
            if calls[0] == at_call:
                comfy.model_management.interrupt_current_processing(True)
                comfy.model_management.throw_exception_if_processing_interrupted()
            out = extra["original_block"](args)
            return out
        m = model.clone()
        m.set_model_patch_replace(block, "dit", "double_block", 1)
        return (m,)


TEST_NODES = {"PlacementTestConditioning": PlacementTestConditioning,
              "PlacementTestPlanSink": PlacementTestPlanSink,
              "PlacementTestKeepModel": PlacementTestKeepModel,
              "PlacementTestTinyClip": PlacementTestTinyClip,
              "PlacementTestKeepVae": PlacementTestKeepVae,
              "PlacementTestKeepClip": PlacementTestKeepClip,
              "PlacementTestInterrupt": PlacementTestInterrupt,
              "PlacementTestKeep": PlacementTestKeep,
              "PlacementTestImageSink": PlacementTestImageSink}


# -- what we observe ------------------------------------------------------------------
def patcher_state(p):
    return {
        "class": type(p).__name__, "load_device": str(p.load_device),
        "offload_device": str(p.offload_device), "module_id": id(p.model),
        "patches": sorted(p.patches), "patches_uuid": str(p.patches_uuid),
        "object_patches": sorted(p.object_patches),
        "wrappers": {k: {k1: len(v1) for k1, v1 in v.items()} for k, v in p.wrappers.items() if v},
        "callbacks": {k: {k1: len(v1) for k1, v1 in v.items()} for k, v in p.callbacks.items() if v},
        "model_options": repr(p.model_options), "attachments": sorted(p.attachments),
        "additional_models": sorted(p.additional_models),
        "force_cast_weights": p.force_cast_weights,
    }


def model_state(model):
    return {"id": id(model), **patcher_state(model)}


def vae_state(vae):
    return {"id": id(vae), "device": str(vae.device), "output_device": str(vae.output_device),
            "first_stage_model": id(vae.first_stage_model), "patcher_id": id(vae.patcher),
            "patcher": patcher_state(vae.patcher)}


class ForwardRecorder:
    """Global forward pre-hook: parameter devices of the Flux and TAESD modules each
    time they compute, and what ComfyUI's loader was asked to load."""
    WATCH = ("Flux", "Decoder")

    def __init__(self):
        self.seen = []
        self.loads = []
        self.rehearsals = 0
        self._hook = None
        self._orig_load = None

    def __enter__(self):
        def hook(module, args):
            name = type(module).__name__
            if name in self.WATCH:
                devices = sorted({str(p.device) for p in module.parameters()})
                inputs = sorted({str(a.device) for a in args if torch.is_tensor(a)})
                if devices == ["meta"]:     # a weightless copy rehearsing the working
                    self.rehearsals += 1    # memory (rehearse_call.py): nothing computed
                    return
                self.seen.append({"module": name, "param_devices": devices,
                                  "input_devices": inputs})
        self._hook = torch.nn.modules.module.register_module_forward_pre_hook(hook)
        self._orig_load = comfy.model_management.load_models_gpu
        recorder = self

        def recording_load(models, *a, **kw):
            for m in models:
                recorder.loads.append({"module": type(m.model).__name__, "patcher_id": id(m),
                                       "module_id": id(m.model),
                                       "load_device": str(m.load_device),
                                       "offload_device": str(m.offload_device)})
            return recorder._orig_load(models, *a, **kw)
        comfy.model_management.load_models_gpu = recording_load   # test instrumentation only
        return self

    def __exit__(self, *exc):
        self._hook.remove()
        comfy.model_management.load_models_gpu = self._orig_load

    def summary(self):
        out = {}
        for s in self.seen:
            entry = out.setdefault(s["module"], {"calls": 0, "param_devices": set(),
                                                 "input_devices": set()})
            entry["calls"] += 1
            entry["param_devices"].update(s["param_devices"])
            entry["input_devices"].update(s["input_devices"])
        return {k: {"calls": v["calls"], "param_devices": sorted(v["param_devices"]),
                    "input_devices": sorted(v["input_devices"])} for k, v in out.items()}


# -- a headless ComfyUI (headless.py, shared with the other drivers) --------------------
async def start_comfy(pack_dir, work):
    await headless.start_comfy(pack_dir, work, TEST_NODES)


def pipeline(backend="", params_backend="", strict=False, placed=True, tag="run", keep=False,
             lora=None, interrupt_at=None, keep_placed=False, batch=1, keep_placed_vae=False,
             tiled_decode=False, text=False, te_lora=False, unet="tiny_flux.safetensors",
             lora_name="tiny_flux_lora.safetensors", keep_loader_clip=False,
             weight_dtype="default", **flags):
    """UNETLoader + VAELoader -> [Backend Assignment -> Apply Placement] -> KSampler ->
    VAEDecode -> sink, plus the keep node on the loaders' own outputs."""
    model, vae = ["1", 0], ["2", 0]
    prompt = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": unet,
                                                     "weight_dtype": weight_dtype}},
        "2": {"class_type": "VAELoader", "inputs": {"vae_name": "tiny_taesd.safetensors"}},
        "3": {"class_type": "PlacementTestConditioning", "inputs": {"seed": 1}},
        "4": {"class_type": "PlacementTestConditioning", "inputs": {"seed": 2}},
        "5": {"class_type": "EmptySD3LatentImage",
              "inputs": {"width": WIDTH, "height": HEIGHT, "batch_size": batch}},
    }
    if keep:
        prompt["20"] = {"class_type": "PlacementTestKeep",
                        "inputs": {"model": model, "vae": vae, "tag": tag}}
    if lora == "before":
        prompt["30"] = {"class_type": "LoraLoaderModelOnly", "inputs": {
            "model": model, "lora_name": lora_name, "strength_model": 0.8}}
        model = ["30", 0]
    clip = None
    if text:       # a real text encoder instead of random conditioning
        prompt["40"] = {"class_type": "PlacementTestTinyClip", "inputs": {"seed": 5}}
        if isinstance(text, str):      # the tiny CLIP-L from its file, through Load CLIP
            prompt["40"] = {"class_type": "CLIPLoader", "inputs": {
                "clip_name": text, "type": "stable_diffusion", "device": "default"}}
        elif isinstance(text, tuple):  # Flux's pair (CLIP-L, T5) through DualCLIPLoader
            prompt["40"] = {"class_type": "DualCLIPLoader", "inputs": {
                "clip_name1": text[0], "clip_name2": text[1], "type": "flux",
                "device": "default"}}
        clip = ["40", 0]
        if keep_loader_clip:
            prompt["24"] = {"class_type": "PlacementTestKeepClip",
                            "inputs": {"clip": clip, "tag": tag + "_loader_clip"}}
        if te_lora:
            prompt["41"] = {"class_type": "LoraLoader", "inputs": {
                "model": model, "clip": clip, "lora_name": "tiny_clip_lora.safetensors",
                "strength_model": 0.0, "strength_clip": 0.9}}
            clip = ["41", 1]
    if placed:
        inputs = {"backend": backend, "params_backend": params_backend, "max_vram": "",
                  "split_mode": "", "stream_layers": False, "auto_fit": False,
                  "offload_mode": "auto", "offload_to_cpu": False, "clip_on_cpu": False,
                  "vae_on_cpu": False, "control_net_cpu": False, "strict": strict}
        inputs.update(flags)
        prompt["10"] = {"class_type": "PlacementBackendAssignment", "inputs": inputs}
        prompt["11"] = {"class_type": "PlacementApply",
                        "inputs": {"placement": ["10", 0], "model": model, "vae": vae}}
        if clip is not None:
            prompt["11"]["inputs"]["clip"] = clip
            clip = ["11", 1]
            if keep_placed:
                prompt["23"] = {"class_type": "PlacementTestKeepClip",
                                "inputs": {"clip": clip, "tag": tag + "_clip"}}
        model, vae = ["11", 0], ["11", 2]
        if keep_placed_vae:
            prompt["22"] = {"class_type": "PlacementTestKeepVae",
                            "inputs": {"vae": vae, "tag": tag + "_vae"}}
        if keep_placed:
            prompt["21"] = {"class_type": "PlacementTestKeepModel",
                            "inputs": {"model": model, "tag": tag}}
    if lora == "after":
        prompt["31"] = {"class_type": "LoraLoaderModelOnly", "inputs": {
            "model": model, "lora_name": lora_name, "strength_model": 0.8}}
        model = ["31", 0]
    if interrupt_at is not None:
        prompt["32"] = {"class_type": "PlacementTestInterrupt",
                        "inputs": {"model": model, "at_call": interrupt_at}}
        model = ["32", 0]
    if clip is not None:
        prompt["3"] = {"class_type": "CLIPTextEncode", "inputs": {"clip": clip,
                                                                 "text": "a tiny red fox"}}
        prompt["4"] = {"class_type": "CLIPTextEncode", "inputs": {"clip": clip, "text": ""}}
    prompt["6"] = {"class_type": "KSampler", "inputs": {
        "model": model, "seed": 3, "steps": 2, "cfg": 2.0, "sampler_name": "euler",
        "scheduler": "simple", "positive": ["3", 0], "negative": ["4", 0],
        "latent_image": ["5", 0], "denoise": 1.0}}
    prompt["7"] = {"class_type": "VAEDecode", "inputs": {"samples": ["6", 0], "vae": vae}}
    if tiled_decode:   # the tiles VAE.decode falls back to: 64 latents, overlap 16
        prompt["7"] = {"class_type": "VAEDecodeTiled", "inputs": {
            "samples": ["6", 0], "vae": vae, "tile_size": 512, "overlap": 128,
            "temporal_size": 64, "temporal_overlap": 8}}
    prompt["8"] = {"class_type": "PlacementTestImageSink", "inputs": {"images": ["7", 0],
                                                                      "tag": tag}}
    return prompt


def devices_prompt():
    return {"1": {"class_type": "PlacementDevices", "inputs": {}}}


def adapter_facts(model, vae):
    comps = pack_module("runtime.comfy.apply.placed_copies")
    patcher_devices = pack_module("runtime.comfy.patchers.patcher_devices")
    placement = pack_module("placement")
    facts = {}
    model_before, vae_before = model_state(model), vae_state(vae)
    cuda1, cpu = torch.device("cuda", 1), torch.device("cpu")
    rest_cpu = patcher_devices.PatcherDevices("diffusion", "cuda1", "cpu", cuda1, cpu)
    resident = patcher_devices.PatcherDevices("diffusion", "cuda1", "cuda1", cuda1, cuda1)
    placed, notes = comps.place_model(model, rest_cpu)
    facts["model_rest_cpu"] = {"state": patcher_state(placed), "notes": notes,
                               "is_new": placed is not model}
    placed, notes = comps.place_model(model, resident)
    facts["model_resident"] = {"state": patcher_state(placed), "notes": notes}
    vtarget = patcher_devices.PatcherDevices("vae", "cuda1", "cpu", cuda1, cpu)
    placed_vae, notes = comps.place_vae(vae, vtarget)
    facts["vae"] = {"state": vae_state(placed_vae), "is_new": placed_vae is not vae,
                    "patcher_is_new": placed_vae.patcher is not vae.patcher}
    facts["original_unchanged"] = {"model": model_state(model) == model_before,
                                   "vae": vae_state(vae) == vae_before}
    refusals, engine = {}, {}
    inv = placement.Inventory.simulated("cuda0=8GiB,cuda1=8GiB")
    for label, spec in (("split", placement.PlacementSpec(backend="cuda0&cuda1")),
                        ("disk", placement.PlacementSpec(params_backend="disk")),
                        ("stream", placement.PlacementSpec(backend="cuda0", stream_layers=True)),
                        ("simulated", placement.PlacementSpec(backend="cuda1"))):
        plan = placement.plan(spec, inv)
        engine[label] = patcher_devices.needs_engine(plan.components["diffusion"], inv)
        for comp in ("te", "vae"):
            try:
                patcher_devices.check_executable(plan.components[comp], inv)
                refusals[f"{comp}_{label}"] = None
            except ValueError as exc:
                refusals[f"{comp}_{label}"] = f"{type(exc).__name__}: {exc}"
    facts["engine"] = engine
    facts["refusals"] = refusals
    return facts


class FakeDynamicPatcher:
    """Stands in for a DynamicVRAM patcher (DynamicVRAM is off on a CPU-only machine):
    records what the adapter asks of it."""
    def __init__(self, factory=True, dynamic=True, load=torch.device("cuda", 0)):
        self.factory, self.dynamic = factory, dynamic
        self.load_device = load
        self.offload_device = torch.device("cpu")
        self.patches_uuid = "original"
        self.model = torch.nn.Linear(2, 2)
        self.registered = []

    def is_dynamic(self):
        return self.dynamic

    def clone(self, disable_dynamic=False):
        if disable_dynamic and not self.factory:
            raise RuntimeError("Cannot create non-dynamic delegate: cached_patcher_init is "
                               "not initialized.")
        n = FakeDynamicPatcher(self.factory, self.dynamic and not disable_dynamic,
                               self.load_device)
        n.model = torch.nn.Linear(2, 2) if disable_dynamic else self.model
        return n

    def register_load_device(self, device):
        self.registered.append(str(device))

    def remove_wrappers_with_key(self, kind, key):
        pass

    def remove_callbacks_with_key(self, kind, key):
        pass

    def remove_attachments(self, key):
        pass


def adapter_type_facts():
    """Each ComfyUI type the adapter places, on small real core objects where they are
    cheap to build (CLIP, ControlNet, T2IAdapter) and stand-ins where they are not."""
    import comfy.sd
    import comfy.controlnet
    import comfy.clip_vision
    import comfy.model_patcher
    comps = pack_module("runtime.comfy.apply.placed_copies")
    patchers = pack_module("runtime.comfy.patchers.retarget")
    patcher_devices = pack_module("runtime.comfy.patchers.patcher_devices")
    cpu, cuda1 = torch.device("cpu"), torch.device("cuda", 1)
    T = patcher_devices.PatcherDevices
    facts = {}

    def err(fn, *a):
        try:
            fn(*a)
            return None
        except ValueError as exc:
            return f"{type(exc).__name__}: {exc}"

    # CLIP
    clip = comfy.sd.CLIP(no_init=True)
    clip.cond_stage_model = torch.nn.Linear(4, 4)
    clip.patcher = comfy.model_patcher.ModelPatcher(clip.cond_stage_model, cpu, cpu)
    clip.tokenizer, clip.layer_idx, clip.tokenizer_options = None, None, {}
    clip.use_clip_schedule, clip.apply_hooks_to_conds = False, None
    before = patcher_state(clip.patcher)
    placed, _ = comps.place_clip(clip, T("te", "cuda1", "cpu", cuda1, cpu))
    facts["clip"] = {"new": placed is not clip and placed.patcher is not clip.patcher,
                     "devices": [str(placed.patcher.load_device), str(placed.patcher.offload_device)],
                     "shares_weights": placed.cond_stage_model is clip.cond_stage_model,
                     "original_unchanged": patcher_state(clip.patcher) == before}
    # CONTROL_NET (ControlNet with its own patcher; T2IAdapter without one)
    cn = comfy.controlnet.ControlNet(torch.nn.Linear(4, 4), load_device=cpu)
    before = patcher_state(cn.control_model_wrapped)
    placed, _ = comps.place_controlnet(cn, T("controlnet", "cpu", "cpu", cpu, cpu), "cpu")
    facts["controlnet"] = {
        "new": placed is not cn and placed.control_model_wrapped is not cn.control_model_wrapped,
        "devices": [str(placed.control_model_wrapped.load_device),
                    str(placed.control_model_wrapped.offload_device), str(placed.load_device)],
        "shares_weights": placed.control_model is cn.control_model,
        "original_unchanged": patcher_state(cn.control_model_wrapped) == before,
        "other_device_than_diffusion": err(comps.place_controlnet, cn,
                                           T("controlnet", "cpu", "cpu", cpu, cpu), "cuda0")}
    # apart from the diffusion model: a proxy that hops (runtime/comfy/sampling/control_hops.py)
    apart, notes = comps.place_controlnet(cn, T("controlnet", "cpu", "cpu", cpu, cpu), "cuda0")
    again = apart.copy()                 # what Apply ControlNet does with it
    x = torch.randn(2, 4)
    fun = comfy.controlnet.QwenFunControlNet(torch.nn.Linear(4, 4), load_device=cpu)
    facts["controlnet_apart"] = {
        "proxy": type(apart.control_model).__name__,
        "copy_keeps_it": again.control_model is apart.control_model,
        "same_values": bool(torch.equal(apart.control_model(x), cn.control_model(x))),
        "attribute": apart.control_model.weight is cn.control_model.weight,
        "original_untouched": type(cn.control_model) is torch.nn.Linear
        and not cn.control_model._forward_pre_hooks and not cn.control_model._forward_hooks,
        "notes": notes,
        "fun": err(comps.place_controlnet, fun, T("controlnet", "cpu", "cpu", cpu, cpu),
                   "cuda0"),
        "t2i": err(comps.place_controlnet,
                   comfy.controlnet.T2IAdapter(torch.nn.Linear(4, 4), 3, 8, "nearest-exact",
                                               device=cpu),
                   T("controlnet", "cpu", "cpu", cpu, cpu), "cuda0")}
    t2i = comfy.controlnet.T2IAdapter(torch.nn.Linear(4, 4), 3, 8, "nearest-exact", device=cpu)
    placed, _ = comps.place_controlnet(t2i, T("controlnet", "cuda1", "cpu", cuda1, cpu), "cuda1")
    facts["t2i"] = {"device": str(placed.device), "original_device": str(t2i.device),
                    "resident_refused": err(comps.place_controlnet, t2i,
                                            T("controlnet", "cuda1", "cuda1", cuda1, cuda1),
                                            "cuda1")}
    lora = comfy.controlnet.ControlLora({})
    placed, notes = comps.place_controlnet(lora, T("controlnet", "cpu", "cpu", cpu, cpu), "cpu")
    facts["control_lora"] = {"new": placed is not lora, "notes": notes,
                             "elsewhere": err(comps.place_controlnet, lora,
                                              T("controlnet", "cuda1", "cpu", cuda1, cpu),
                                              "cuda1")}
    # CLIP_VISION (a real ClipVisionModel needs a full CLIP-L config: built by hand here)
    cv = object.__new__(comfy.clip_vision.ClipVisionModel)
    cv.model = torch.nn.Linear(4, 4)
    cv.load_device = cpu
    cv.patcher = comfy.model_patcher.ModelPatcher(cv.model, cpu, cpu)
    placed, _ = comps.place_clip_vision(cv, T("clip_vision", "cuda1", "cpu", cuda1, cpu))
    facts["clip_vision"] = {"load_device": str(placed.load_device),
                            "patcher": [str(placed.patcher.load_device),
                                        str(placed.patcher.offload_device)],
                            "original": [str(cv.load_device), str(cv.patcher.load_device)]}

    # UPSCALE_MODEL (a spandrel descriptor carrying the patcher core's loader adds)
    class Descriptor:
        def __init__(self):
            self.model = torch.nn.Conv2d(3, 3, 1)
            self.patcher = comfy.model_patcher.ModelPatcher(self.model, cpu, cpu)
    up = Descriptor()
    placed, _ = comps.place_upscale_model(up, T("upscaler", "cuda1", "cpu", cuda1, cpu))
    facts["upscaler"] = {"patcher": [str(placed.patcher.load_device),
                                     str(placed.patcher.offload_device)],
                         "original": str(up.patcher.load_device),
                         "shares_weights": placed.model is up.model}
    # PHOTOMAKER (core's encoder is CLIP-L sized: a module with its attribute stands in)
    pm = torch.nn.Linear(4, 4)
    pm.load_device = cpu
    placed, _ = comps.place_photomaker(pm, T("photomaker", "cuda1", "cpu", cuda1, cpu))
    facts["photomaker"] = {"load_device": str(placed.load_device),
                           "original": str(pm.load_device),
                           "shares_weights": placed.weight is pm.weight,
                           "params_elsewhere": err(comps.place_photomaker, pm,
                                                   T("photomaker", "cuda1", "cuda1", cuda1, cuda1))}
    # DynamicVRAM branches
    dyn = FakeDynamicPatcher()
    out, notes = patchers.retarget(dyn, T("diffusion", "cpu", "cpu", cpu, cpu), "diffusion")
    facts["dynamic_to_cpu"] = {"dynamic": out.is_dynamic(), "new_weights": out.model is not dyn.model,
                               "notes": notes}
    facts["dynamic_no_factory"] = err(patchers.retarget, FakeDynamicPatcher(factory=False),
                                      T("diffusion", "cpu", "cpu", cpu, cpu), "diffusion")
    out, notes = patchers.retarget(dyn, T("diffusion", "cuda1", "cuda1", cuda1, cuda1), "diffusion")
    facts["dynamic_gpu"] = {"dynamic": out.is_dynamic(), "registered": out.registered,
                            "shares_weights": out.model is dyn.model, "notes": notes,
                            "original_load": str(dyn.load_device),
                            "original_uuid": dyn.patches_uuid}
    # the engine's clone: always a plain patcher (DynamicVRAM rebuilt), engine load policy
    engine = pack_module("runtime.comfy.sampling.sampling_session")
    out, notes = engine.engine_clone(dyn, cuda1, cpu, "diffusion")
    facts["engine_dynamic"] = {"dynamic": out.is_dynamic(), "new_weights": out.model is not dyn.model,
                               "engine": getattr(out, "placement_engine", False),
                               "devices": [str(out.load_device), str(out.offload_device)],
                               "fresh_uuid": out.patches_uuid != dyn.patches_uuid,
                               "original_dynamic": dyn.is_dynamic(), "notes": notes}
    facts["engine_dynamic_no_factory"] = err(engine.engine_clone, FakeDynamicPatcher(factory=False),
                                             cuda1, cpu, "diffusion")
    # row split takes ComfyUI's LoRA patches as (up, down, scale): on ComfyUI's own
    # adapters and LowVramPatch, the converted delta equals calculate_weight's
    import comfy.model_patcher
    import comfy.weight_adapter as adapters
    row_lora = pack_module("runtime.comfy.patchers.row_lora")

    class Rows(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(
                [torch.nn.Sequential(comfy.ops.manual_cast.Linear(256, 512)) for _ in range(2)])
    rows = Rows()
    lin = rows.layers[0][0]
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(512, 256, generator=gen))
    key = "diffusion_model.layers.0.0.weight"
    patches = {key: [
        (0.7, adapters.LoRAAdapter(set(), (torch.randn(512, 4, generator=gen),
                                           torch.randn(4, 256, generator=gen), 2.0,
                                           None, None, None)), 1.0, None, None),
        # on rows 256..511 only (as a LoRA on k of a fused qkv), no alpha
        (1.2, adapters.LoRAAdapter(set(), (torch.randn(256, 2, generator=gen),
                                           torch.randn(2, 256, generator=gen), None,
                                           None, None, None)), 1.0, (0, 256, 256), None)]}
    lin.weight_function = [comfy.model_patcher.LowVramPatch(key, patches)]
    converted, _ = row_lora.comfy_lora_for_rows(rows, "diffusion")
    w = lin.weight.detach().clone()
    comfy_w = lin.weight_function[0](w.clone())
    ours = w + sum(s * (u @ d) for u, d, s in converted["layers.0.0"])
    facts["row_lora_vs_calculate_weight"] = {
        "entries": len(converted["layers.0.0"]),
        "max_abs_diff": float((comfy_w - ours).abs().max()),
        "max_abs_delta": float((comfy_w - w).abs().max())}
    rank = 3
    patches[key] = [(1.0, adapters.LoHaAdapter(set(), (
        torch.randn(512, rank), torch.randn(rank, 256), None, torch.randn(512, rank),
        torch.randn(rank, 256), None, None, None)), 1.0, None, None)]
    try:
        row_lora.comfy_lora_for_rows(rows, "diffusion")
        facts["row_lora_loha"] = None
    except Exception as exc:
        facts["row_lora_loha"] = f"{type(exc).__name__}: {exc}"
    return facts


# -- simulated devices sized from the models and the plan's working memory -------------
# Every plan keeps its working memory and one margin inside each device (placement/
# room.py), so a device a test wants just big enough is sized from what the plan holds
# there, never a constant. '@workspace=0': the runtime's simulated device allocates no
# kernel workspace, so its plans reserve none either.
MiB = 1024 ** 2
ROOMY = "cuda0=1GiB@workspace=0,cuda1=1GiB@workspace=0"


def device_size(room: int) -> int:
    """The smallest simulated device (whole KiB) whose room holds `room` bytes: its
    memory less the margin (a sixteenth of it, at most 512 MiB)."""
    kib = -(-room * 16 // 15 // 1024)
    while kib * 1024 - min(512 * MiB, kib * 1024 // 16) < room:
        kib += 1
    return kib * 1024


def simulated(sizes) -> str:
    """A --simulate inventory of devices of `sizes` ({name: bytes}) without workspace."""
    return ",".join(f"{d}={b // 1024}KiB@workspace=0" for d, b in sizes.items())


async def planned_on(executor, tag, devices, **kw):
    """Apply Placement's node-time plan for pipeline(**kw) on roomy simulated devices:
    ({device: planned bytes} for `devices`: weights, ring and working memory at its
    busiest phase; the plan JSON)."""
    prompt = pipeline(tag=tag, **kw)
    prompt["60"] = {"class_type": "PlacementTestPlanSink",
                    "inputs": {"plan_json": ["11", 7], "tag": tag}}
    saved = os.environ.get("COMFYUI_PLACEMENT_SIMULATE")
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = ROOMY
    try:
        await run_prompt(executor, prompt, tag)
    finally:
        if saved is None:
            del os.environ["COMFYUI_PLACEMENT_SIMULATE"]
        else:
            os.environ["COMFYUI_PLACEMENT_SIMULATE"] = saved
    plan = PLANS[tag]
    return {d["name"]: int(d["planned_bytes"]) for d in plan["devices"]
            if d["name"] in devices}, plan


async def sized_inventory(executor, tag, devices, slack=256 * 1024, **kw):
    """Equal simulated `devices` just big enough for what the plan of pipeline(**kw)
    holds on the busiest of them (plus `slack`), streaming every block where it streams;
    (inventory, plan on roomy devices)."""
    planned, plan = await planned_on(executor, tag, devices, **kw)
    extra = resident_prefix_bytes(plan, kw.get("unet", "tiny_flux.safetensors"))
    busiest = max(max([phases.get("sample", 0) - extra,
                       *(b for p, b in phases.items() if p != "sample")])
                  for d, phases in plan["device_phases"].items() if d in devices) \
        if extra else max(planned.values())
    size = device_size(busiest + slack)
    return simulated({d: size for d in devices}), plan


def resident_prefix_bytes(plan, unet) -> int:
    """What the streamed diffusion model's resident prefix adds beyond streaming every
    block: with no budget a plan keeps the blocks the device's room holds (on the roomy
    devices, all but the last), and these tests size a device that holds none."""
    from comfyui_placement.placement.layout import prefix_and_ring
    from comfyui_placement.placement.metadata import describe_component
    cp = plan["components"]["diffusion"]
    stream = cp.get("stream") or {}
    k = stream.get("resident_blocks") or 0
    if not k or stream.get("per_device"):
        return 0
    info = describe_component("diffusion", os.path.join(ARGS.work, "models",
                                                        "diffusion_models", unet))
    sizes, depth = [b.nbytes for b in info.blocks], stream["prefetch_depth"]
    return prefix_and_ring(sizes, k, depth) - prefix_and_ring(sizes, 0, depth)


def working_memory(plan, component="diffusion") -> int:
    return int(plan["components"][component]["headroom_bytes"] or 0)


def session_facts(tag):
    """The engine session of a placed MODEL kept under `tag`: runs and ledger figures."""
    model = KEPT.get(tag, {}).get("model")
    if model is None:
        return None
    session = model.get_attachment("placement")
    if session is None:
        return {"session": False}
    stats = session.last_stats or {}
    cast_layers = [m for m in model.model.modules() if hasattr(m, "comfy_cast_weights")]
    return {"session": True, "runs": session.runs, "open": session.placed is not None,
            # what ComfyUI's own load put on the device: nothing, every layer left to cast
            "comfy_loaded_bytes": model.loaded_size(),
            "comfy_lowvram": bool(model.model.model_lowvram),
            "layers_cast": all(m.comfy_cast_weights for m in cast_layers),
            "layers_loaded_by_comfy": sum(bool(getattr(m, "comfy_patched_weights", False))
                                          for m in cast_layers),
            "patcher_class": type(model).__name__,
            "load_device": str(model.load_device), "offload_device": str(model.offload_device),
            "stats": jsonable(stats)}


TE_INVENTORY = "cuda0=5MiB@workspace=0,cuda1=1MiB@workspace=0"   # the tiny CLIP: 3.1 MiB, most of it the token table
# CLIP-L 3.2 MiB + T5 3.7 MiB (1.6 MiB of it in blocks), and the T5's working memory
# planned in float32 (ComfyUI computes it so on the CPU the simulated device runs on)
TE_PAIR_INVENTORY = "cuda0=28MiB@workspace=0"
# and their working memory (T5's attention with its position bias: several MiB), metered


def clip_calls(tag):
    clip = KEPT.get(tag, {}).get("clip")
    session = clip.patcher.get_attachment("placement") if clip is not None else None
    if session is None:
        return None
    out = []
    for c in session.calls:
        st = c["stats"]
        if "split_mode" in st:
            out.append({"method": c["method"], "outcome": c["outcome"],
                        "split_mode": st["split_mode"], "ranges": st["ranges"],
                        "hops": st["hops"], "devices": st["devices"]})
            continue
        dev = st["devices"]["cuda0"]
        out.append({"method": c["method"], "outcome": c["outcome"], "mode": st["mode"],
                    "streamed_blocks": st["streamed_blocks"],
                    "resident_blocks": st.get("resident_blocks"), "peak": dev["peak_bytes"],
                    "capacity": dev["capacity_bytes"], "h2d": dev["h2d_bytes"],
                    "streamed_bytes": st["streamed_bytes_per_forward"]})
    return out


def clip_weights(tag):
    clip = KEPT.get(tag, {}).get("clip")
    if clip is None:
        return None
    return {k: v.detach().to("cpu", copy=True)
            for k, v in clip.cond_stage_model.state_dict().items()}


def loader_clip_matches_file(tag, file_name):
    """The loader's CLIP still holds exactly the file's tensors (under ComfyUI's names)."""
    weights = clip_weights(tag)
    if weights is None:
        return None
    path = os.path.join(ARGS.work, "models", "text_encoders", file_name)
    stored = safetensors.torch.load_file(path)
    prefix = "clip_l.transformer."
    found = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
    return stored.keys() <= found.keys() and all(torch.equal(stored[k], found[k])
                                                  for k in stored)


def te_file_facts(clip):
    """The exact-match rules of te_files on the loader's CLIP-L against files derived from
    its own: a checkpoint-style prefix maps; two layers swapped (same names and shapes,
    other values), the encoder stored twice (ambiguous) and a key-less file are refused."""
    te_files = pack_module("runtime.comfy.files.te_files")
    placement = pack_module("placement")
    src = os.path.join(ARGS.work, "models", "text_encoders", "tiny_clip_l.safetensors")
    sd = safetensors.torch.load_file(src)
    swapped = dict(sd)
    for suffix in ("mlp.fc1.weight", "mlp.fc1.bias"):
        a, b = (f"text_model.encoder.layers.{i}.{suffix}" for i in (0, 1))
        swapped[a], swapped[b] = sd[b], sd[a]
    variants = {
        "checkpoint": {f"text_encoders.clip_l.transformer.{k}": v for k, v in sd.items()},
        "swapped": swapped,
        "twice": {**{f"a.{k}": v for k, v in sd.items()}, **{f"b.{k}": v.clone() for k, v in sd.items()}},
        "unrelated": {"model.diffusion_model.img_in.weight": torch.zeros(4, 4)}}
    facts = {}
    for label, tensors in variants.items():
        path = os.path.join(ARGS.work, "tmp", f"te_{label}.safetensors")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        safetensors.torch.save_file({k: v.contiguous() for k, v in tensors.items()}, path)
        try:
            chosen, key_map = te_files.clip_disk_source(clip.patcher.model, [path])
            name = "clip_l.transformer.text_model.encoder.layers.2.mlp.fc2.weight"
            facts[label] = {"file": os.path.basename(chosen), "key": key_map(name)}
        except placement.PlacementError as exc:
            facts[label] = {"error": str(exc)}
    return facts


async def te_disk_scenarios(executor):
    """The tiny CLIP-L from its file (Load CLIP), streamed from that file on a simulated
    cuda0 smaller than it, against the same CLIP without placement."""
    out = {}
    out["te_file_reference"] = await run_prompt(executor, pipeline(
        placed=False, text="tiny_clip_l.safetensors", keep_loader_clip=True,
        tag="te_file_reference"), "te_file_reference")
    loader_state = patcher_state(KEPT["te_file_reference_loader_clip"]["clip"].patcher)
    out["te_disk"] = await run_prompt(executor, pipeline(
        backend="diffusion=cpu,vae=cpu,te=cuda0", params_backend="te=disk",
        stream_layers=True, text="tiny_clip_l.safetensors", keep_loader_clip=True,
        tag="te_disk", keep_placed=True), "te_disk")
    out["te_disk_image"] = compare("te_disk", "te_file_reference")
    out["te_disk_calls"] = clip_calls("te_disk_clip")
    session = KEPT.get("te_disk_clip", {}).get("clip")
    session = session.patcher.get_attachment("placement") if session is not None else None
    out["te_disk_file"] = os.path.basename(session.weights_file) \
        if session is not None and session.weights_file else None
    loader = KEPT.get("te_disk_loader_clip", {}).get("clip")
    out["te_disk_same_loader_clip"] = loader is KEPT["te_file_reference_loader_clip"]["clip"]
    out["te_disk_loader_state_unchanged"] = loader is not None and \
        patcher_state(loader.patcher) == loader_state
    out["te_disk_loader_weights_are_the_file"] = loader_clip_matches_file(
        "te_disk_loader_clip", "tiny_clip_l.safetensors")
    if loader is not None:
        out["te_file_rules"] = te_file_facts(loader)
    # a layer split over cuda0 and cuda1, each device's blocks read from the file
    out["te_disk_split"] = await run_prompt(executor, pipeline(
        backend="diffusion=cpu,vae=cpu,te=cuda0&cuda1", params_backend="te=disk",
        text="tiny_clip_l.safetensors", tag="te_disk_split", keep_placed=True),
        "te_disk_split")
    out["te_disk_split_image"] = compare("te_disk_split", "te_file_reference")
    out["te_disk_split_calls"] = clip_calls("te_disk_split_clip")
    # ComfyUI casts the float32 file to float16 at load: nothing to stream from it
    out["te_disk_fp32"] = await run_prompt(executor, pipeline(
        backend="diffusion=cpu,vae=cpu,te=cuda0", params_backend="te=disk",
        stream_layers=True, text="tiny_clip_l_fp32.safetensors", tag="te_disk_fp32"),
        "te_disk_fp32")
    # Flux's pair from two files: the T5 blocks stream from the T5 file, CLIP-L rests
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = TE_PAIR_INVENTORY
    pair = ("tiny_clip_l.safetensors", "tiny_t5.safetensors")
    out["te_pair_reference"] = await run_prompt(executor, pipeline(
        placed=False, text=pair, tag="te_pair_reference"), "te_pair_reference")
    out["te_pair_disk"] = await run_prompt(executor, pipeline(
        backend="diffusion=cpu,vae=cpu,te=cuda0", params_backend="te=disk",
        stream_layers=True, text=pair, tag="te_pair_disk", keep_placed=True), "te_pair_disk")
    out["te_pair_disk_image"] = compare("te_pair_disk", "te_pair_reference")
    out["te_pair_disk_calls"] = clip_calls("te_pair_disk_clip")
    session = KEPT.get("te_pair_disk_clip", {}).get("clip")
    session = session.patcher.get_attachment("placement") if session is not None else None
    out["te_pair_disk_file"] = os.path.basename(session.weights_file) \
        if session is not None and session.weights_file else None
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = TE_INVENTORY
    # a CLIP built without a file (no core loader's record)
    out["te_disk_no_file"] = await run_prompt(executor, pipeline(
        backend="diffusion=cpu,vae=cpu,te=cuda0", params_backend="te=disk",
        stream_layers=True, text=True, tag="te_disk_no_file"), "te_disk_no_file")
    return out


def te_bytes():
    clip = KEPT.get("te_stream_clip", {}).get("clip")
    return sum(p.numel() * p.element_size() for p in clip.patcher.model.parameters()) \
        if clip is not None else None


VAE_ONE_LATENT = {}      # the working memory of decoding one latent, metered (probe below)


def vae_budget_kib():
    """A device (KiB) whose room holds TAESD's weights plus decoding one latent and a
    half (the working memory the simulated device metered for one: runtime/
    workmeter.py), or the plan's working memory for the decode where that is more (the
    plan is refused otherwise), never four latents."""
    path = os.path.join(ARGS.work, "models", "vae", "tiny_taesd.safetensors")
    weights = sum(v.numel() * v.element_size()
                  for v in safetensors.torch.load_file(path).values())
    work = max(VAE_ONE_LATENT["bytes"] * 3 // 2, VAE_ONE_LATENT["planned"])
    return device_size(weights + work) // 1024


def vae_calls(tag):
    vae = KEPT.get(tag, {}).get("vae")
    session = vae.patcher.get_attachment("placement") if vae is not None else None
    if session is None:
        return None
    return [{"method": c["method"], "outcome": c["outcome"],
             "peak": c["stats"]["devices"]["cuda1"]["peak_bytes"],
             "capacity": c["stats"]["devices"]["cuda1"]["capacity_bytes"],
             "working": c["stats"]["devices"]["cuda1"].get("working_peak_bytes", 0)}
            for c in session.calls if c.get("stats")]


def module_weights(model):
    return {k: v.detach().to("cpu", copy=True)
            for k, v in model.model.diffusion_model.state_dict().items()}


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def compare(tag, ref_tag):
    if tag not in SINK or ref_tag not in SINK:
        return None
    ref, got = SINK[ref_tag], SINK[tag]
    return {"equal": bool(torch.equal(ref, got)), "max_abs_diff": float((ref - got).abs().max()),
            "finite": bool(torch.isfinite(got).all()), "std": float(got.std())}


async def streaming_scenarios(executor, loader_model):
    """Apply Placement streaming ComfyUI's own Flux through the pack's engine on a
    simulated cuda0 smaller than the model (the diagnostic inventory)."""
    out = {}
    weights_before = module_weights(loader_model)
    state_before = model_state(loader_model)
    base = {"backend": "diffusion=cuda0,vae=cpu", "stream_layers": True}
    # cuda0 holds the ring (no prefix: no budget) and the working memory, not the whole
    # model beside it; each split device its range and the working memory
    stream_inventory, plan = await sized_inventory(
        executor, "size_stream", ["cuda0"], params_backend="diffusion=cpu", **base)
    out["stream_working_memory"] = working_memory(plan)
    split_inventory, plan = await sized_inventory(
        executor, "size_split", ["cuda0", "cuda1"], backend="diffusion=cuda0&cuda1,vae=cpu",
        params_backend="diffusion=cpu")
    out["split_working_memory"] = working_memory(plan)
    wide_inventory, plan = await sized_inventory(
        executor, "size_wide", ["cuda0", "cuda1"], backend="diffusion=cuda0&cuda1,vae=cpu",
        params_backend="diffusion=cpu", split_mode="row", unet="tiny_flux_wide.safetensors")
    out["wide_working_memory"] = working_memory(plan)
    out["inventories"] = {"stream": stream_inventory, "split": split_inventory,
                          "wide": wide_inventory}
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = stream_inventory
    try:
        for residency in ("cpu", "disk"):
            tag = f"stream_{residency}"
            out[tag] = await run_prompt(executor, pipeline(
                params_backend=f"diffusion={residency}", tag=tag, keep_placed=True, **base), tag)
            out[tag + "_session"] = session_facts(tag)
            out[tag + "_image"] = compare(tag, "reference")
        # LoRA: ComfyUI's own (fused, resident) run is the reference
        out["lora_reference"] = await run_prompt(executor, pipeline(
            placed=False, lora="before", tag="lora_reference"), "lora_reference")
        for where, residency in (("before", "cpu"), ("after", "disk")):
            tag = f"lora_{where}_{residency}"
            out[tag] = await run_prompt(executor, pipeline(
                params_backend=f"diffusion={residency}", lora=where, tag=tag, keep_placed=True,
                **base), tag)
            out[tag + "_session"] = session_facts(tag)
            out[tag + "_image"] = compare(tag, "lora_reference")
            out[tag + "_vs_plain"] = compare(tag, "reference")
            # the LoRA was applied to arriving blocks only: the resting weights are the file's
            out[tag + "_resting_unpatched"] = same_weights(weights_before,
                                                           module_weights(loader_model))
        # fp8 weights with a LoRA: ComfyUI's full load rounds each patched weight back to
        # fp8 (stochastic rounding seeded by its key); the engine's run-time patch must
        # give the same weights (engine_patcher.RoundAsLoaded)
        out["lora_fp8_reference"] = await run_prompt(executor, pipeline(
            placed=False, lora="before", weight_dtype="fp8_e4m3fn", tag="lora_fp8_reference"),
            "lora_fp8_reference")
        tag = "lora_fp8_stream"
        out[tag] = await run_prompt(executor, pipeline(
            params_backend="diffusion=cpu", lora="before", weight_dtype="fp8_e4m3fn", tag=tag,
            **base), tag)
        out[tag + "_image"] = compare(tag, "lora_fp8_reference")
        # lora_mode runtime on a resident model (cpu, nothing streamed): ComfyUI would fuse;
        # the engine keeps the weights unpatched and ComfyUI's cast path patches each forward
        tag = "lora_runtime_resident"
        out[tag] = await run_prompt(executor, pipeline(
            backend="diffusion=cpu,vae=cpu", lora="before", lora_mode="runtime", tag=tag,
            keep_placed=True), tag)
        out[tag + "_session"] = session_facts(tag)
        out[tag + "_image"] = compare(tag, "lora_reference")
        out[tag + "_vs_plain"] = compare(tag, "reference")
        out[tag + "_resting_unpatched"] = same_weights(weights_before,
                                                       module_weights(loader_model))
        # lora_mode fuse where it would bake into streamed weights: a node error at queue time
        out["lora_fuse_streamed"] = await run_prompt(executor, pipeline(
            params_backend="diffusion=cpu", lora="before", lora_mode="fuse",
            tag="lora_fuse_streamed", **base), "lora_fuse_streamed")
        # an interrupt in the middle of a step, then a rerun of the same placement
        out["interrupted"] = await run_prompt(executor, pipeline(
            params_backend="diffusion=cpu", interrupt_at=2, tag="interrupted", keep_placed=True,
            **base), "interrupted")
        out["interrupted_session"] = session_facts("interrupted")
        out["interrupted_messages"] = [e for e, _ in server.PromptServer.instance.messages
                                       if e.startswith("execution_")]
        out["weights_after_interrupt"] = same_weights(weights_before,
                                                      module_weights(loader_model))
        out["rerun"] = await run_prompt(executor, pipeline(
            params_backend="diffusion=cpu", tag="rerun", keep_placed=True, **base), "rerun")
        out["rerun_session"] = session_facts("rerun")
        out["rerun_image"] = compare("rerun", "reference")
        # placing the placed model again: only the new plan's engine (or none) remains
        adapter = pack_module("runtime.comfy")
        placement = pack_module("placement")
        inv = placement.Inventory.simulated(stream_inventory)
        placed_model = KEPT["rerun"]["model"]
        again = {}
        for label, spec in (("plain", placement.PlacementSpec(backend="cpu")),
                            ("engine", placement.PlacementSpec(
                                backend="diffusion=cuda0", stream_layers=True))):
            plan = placement.plan(spec, inv)
            obj = adapter.place_objects(plan, inv, {"diffusion": placed_model})[0]["diffusion"]
            again[label] = {"class": type(obj).__name__,
                            "wrappers": {k: len(v.get("placement", [])) for k, v in obj.wrappers.items()},
                            "session_new": obj.get_attachment("placement") is not
                            placed_model.get_attachment("placement")}
        out["placed_again"] = again
        # core's MultiGPU CFG Split copies the model per GPU: refused for an engine model
        try:
            KEPT["rerun"]["model"].deepclone_multigpu(torch.device("cpu"))
            out["multigpu_deepclone"] = None
        except ValueError as exc:
            out["multigpu_deepclone"] = f"{type(exc).__name__}: {exc}"
    finally:
        del os.environ["COMFYUI_PLACEMENT_SIMULATE"]
    # a split over two simulated devices, each holding its range and the working memory
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = split_inventory
    try:
        for mode in ("layer", "row"):
            tag = f"split_{mode}"
            out[tag] = await run_prompt(executor, pipeline(
                backend="diffusion=cuda0&cuda1,vae=cpu", params_backend="diffusion=cpu",
                split_mode=mode, tag=tag, keep_placed=True), tag)
            out[tag + "_session"] = session_facts(tag)
            out[tag + "_image"] = compare(tag, "reference")
            # what the node was sent after the run (nodes/measured.py's record)
            out[tag + "_measured"] = [d for e, d in server.PromptServer.instance.messages
                                      if e == "placement.measured"]
        out["split_layer_lora"] = await run_prompt(executor, pipeline(
            backend="diffusion=cuda0&cuda1,vae=cpu", params_backend="diffusion=cpu",
            lora="before", tag="split_layer_lora", keep_placed=True), "split_layer_lora")
        out["split_layer_lora_image"] = compare("split_layer_lora", "lora_reference")
        out["split_row_lora"] = await run_prompt(executor, pipeline(
            backend="diffusion=cuda0&cuda1,vae=cpu", params_backend="diffusion=cpu",
            split_mode="row", lora="before", tag="split_row_lora"), "split_row_lora")
        out["split_row_lora_image"] = compare("split_row_lora", "lora_reference")
    finally:
        del os.environ["COMFYUI_PLACEMENT_SIMULATE"]
    # row split for real: the wide model (about 14 MiB) over two devices, each holding
    # its shards and working memory, not the whole model beside it
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = wide_inventory
    try:
        wide = "tiny_flux_wide.safetensors"
        out["wide_reference"] = await run_prompt(executor, pipeline(
            placed=False, unet=wide, tag="wide_reference"), "wide_reference")
        out["wide_row"] = await run_prompt(executor, pipeline(
            backend="diffusion=cuda0&cuda1,vae=cpu", params_backend="diffusion=cpu",
            split_mode="row", unet=wide, tag="wide_row", keep_placed=True), "wide_row")
        out["wide_row_session"] = session_facts("wide_row")
        out["wide_row_image"] = compare("wide_row", "wide_reference")
        out["wide_model_bytes"] = sum(v.numel() * v.element_size() for v in
                                      safetensors.torch.load_file(os.path.join(
                                          ARGS.work, "models", "diffusion_models", wide)).values())
        # with ComfyUI's LoRA patches, sliced by rows; against ComfyUI's own fused run
        wide_lora = "tiny_flux_wide_lora.safetensors"
        out["wide_lora_reference"] = await run_prompt(executor, pipeline(
            placed=False, unet=wide, lora="before", lora_name=wide_lora,
            tag="wide_lora_reference"), "wide_lora_reference")
        out["wide_lora_changes_image"] = compare("wide_lora_reference", "wide_reference")
        for where in ("before", "after"):
            tag = f"wide_row_lora_{where}"
            out[tag] = await run_prompt(executor, pipeline(
                backend="diffusion=cuda0&cuda1,vae=cpu", params_backend="diffusion=cpu",
                split_mode="row", unet=wide, lora=where, lora_name=wide_lora, tag=tag,
                keep_placed=True), tag)
            out[tag + "_session"] = session_facts(tag)
            out[tag + "_image"] = compare(tag, "wide_lora_reference")
        # the shared module holds the file's weights after the runs (LoRA never baked in)
        wide_file = safetensors.torch.load_file(os.path.join(
            ARGS.work, "models", "diffusion_models", wide))
        kept = KEPT.get("wide_row_lora_before", {}).get("model")
        out["wide_weights_unchanged_by_row_lora"] = kept is not None and same_weights(
            module_weights(kept), wide_file)
        # patch kinds row split cannot slice exactly: refused, never dropped
        for kind in ("loha", "dora", "bias_diff"):
            tag = f"wide_row_{kind}"
            out[tag] = await run_prompt(executor, pipeline(
                backend="diffusion=cuda0&cuda1,vae=cpu", params_backend="diffusion=cpu",
                split_mode="row", unet=wide, lora="after",
                lora_name=f"tiny_flux_wide_{kind}.safetensors", tag=tag), tag)
    finally:
        del os.environ["COMFYUI_PLACEMENT_SIMULATE"]
    out["original_unchanged"] = model_state(loader_model) == state_before
    out["original_weights_unchanged"] = same_weights(weights_before, module_weights(loader_model))
    out["model_bytes"] = sum(p.numel() * p.element_size()
                             for p in loader_model.model.diffusion_model.parameters())
    return out


def jsonable(x):
    return json.loads(json.dumps(x, default=str))


async def main():
    work = ARGS.work
    build_models(work)
    await start_comfy(ARGS.pack, work)
    RESULTS["comfyui_version"] = __import__("comfyui_version").__version__
    RESULTS["registered"] = {n: n in nodes.NODE_CLASS_MAPPINGS for n in PACK_NODE_IDS}
    RESULTS["display_names"] = {n: nodes.NODE_DISPLAY_NAME_MAPPINGS.get(n) for n in PACK_NODE_IDS}
    RESULTS["web_dirs"] = {k: os.path.relpath(os.path.realpath(v), os.path.realpath(ARGS.pack))
                           for k, v in nodes.EXTENSION_WEB_DIRS.items() if "placement" in k}
    RESULTS["input_types"] = {n: {k: sorted(v) for k, v in
                                  nodes.NODE_CLASS_MAPPINGS[n].INPUT_TYPES().items()
                                  if isinstance(v, dict)}
                              for n in PACK_NODE_IDS if n in nodes.NODE_CLASS_MAPPINGS}
    # the widgets' order, which a saved workflow's widgets_values follow
    RESULTS["input_order"] = {n: [k for section in ("required", "optional") for k in
                                  nodes.NODE_CLASS_MAPPINGS[n].INPUT_TYPES().get(section, {})]
                              for n in PACK_NODE_IDS if n in nodes.NODE_CLASS_MAPPINGS}
    RESULTS["dynamic_vram"] = bool(getattr(comfy.memory_management, "aimdo_enabled", False)) \
        if hasattr(comfy, "memory_management") else None

    executor = execution.PromptExecutor(server.PromptServer.instance,
                                        cache_type=execution.CacheType.CLASSIC,
                                        cache_args={"ram": 16.0, "ram_inactive": 16.0})

    RESULTS["devices"] = await run_prompt(executor, devices_prompt(), "devices")

    # 1. a reference run without placement (same seeds) and the loaders' objects before
    RESULTS["reference"] = await run_prompt(executor, pipeline(placed=False, tag="reference", keep=True),
                                            "reference")
    if os.environ.get("PLACEMENT_DRIVER_ONLY") == "streaming":     # quicker while developing
        RESULTS["streaming"] = await streaming_scenarios(executor, KEPT["reference"]["model"])
        return
    # 2. the placed run: diffusion and VAE on chosen devices, params on cpu
    with ForwardRecorder() as rec:
        RESULTS["placed"] = await run_prompt(
            executor, pipeline(backend="diffusion=cpu,vae=cpu", params_backend="*=cpu",
                               tag="placed", keep=True), "placed")
    RESULTS["placed_forward"] = rec.summary()
    RESULTS["placed_rehearsals"] = rec.rehearsals
    RESULTS["placed_loads"] = rec.loads
    before, after = KEPT.get("reference"), KEPT.get("placed")
    if before and after:
        RESULTS["same_objects"] = {"model": before["model"] is after["model"],
                                   "vae": before["vae"] is after["vae"]}
        RESULTS["original_before"] = {"model": before["model_state"], "vae": before["vae_state"]}
        RESULTS["original_after"] = {"model": model_state(before["model"]),
                                     "vae": vae_state(before["vae"])}
    if "reference" in SINK and "placed" in SINK:
        ref, got = SINK["reference"], SINK["placed"]
        RESULTS["image"] = {"shape": list(got.shape), "finite": bool(torch.isfinite(got).all()),
                            "reference_finite": bool(torch.isfinite(ref).all()),
                            "std": float(got.std()),
                            "equal_to_reference": bool(torch.equal(ref, got)),
                            "max_abs_diff": float((ref - got).abs().max())}

    # 2b. the adapter on its own, for devices this machine lacks (nothing is loaded there)
    if before:
        RESULTS["adapter"] = adapter_facts(before["model"], before["vae"])
    RESULTS["adapter_types"] = adapter_type_facts()

    # 3. validation: a bad spec is a node error before anything runs
    RESULTS["bad_spec"] = await run_prompt(executor, pipeline(backend="diffusion=disk",
                                                              tag="bad"), "bad_spec")
    RESULTS["bad_module"] = await run_prompt(executor, pipeline(backend="unet2=cpu",
                                                                tag="bad2"), "bad_module")
    # 3b. one plan per spec per prompt: validation plans Backend Assignment's whole spec
    # and execute shows and passes on that plan (nodes/planning.spec_plan); Apply Placement
    # plans with the models (not counted here)
    planning = pack_module("nodes.planning")
    spec_plans, real_plan = [], planning.resolve_plan

    def counting(spec, inventory, components=None, **kwargs):
        if not components:
            spec_plans.append(repr(spec))
        return real_plan(spec, inventory, components=components, **kwargs)
    planning.resolve_plan = counting
    try:
        rec = await run_prompt(executor, pipeline(backend="diffusion=cpu", max_vram="6",
                                                  tag="once"), "planned_once")
    finally:
        planning.resolve_plan = real_plan
    RESULTS["planned_once"] = {"valid": rec["valid"], "success": rec.get("success"),
                               "spec_plans": len(spec_plans)}
    # 4. a device this machine lacks: fallback with a warning, or an error when strict
    RESULTS["missing_fallback"] = await run_prompt(
        executor, pipeline(backend="diffusion=cuda7", tag="fallback"), "missing_fallback")
    RESULTS["missing_strict"] = await run_prompt(
        executor, pipeline(backend="diffusion=cuda7", strict=True, tag="strict"),
        "missing_strict")
    # 5. params on disk, computed on the cpu: the engine reads the weights from the file
    RESULTS["disk_params"] = await run_prompt(
        executor, pipeline(params_backend="diffusion=disk", tag="disk", keep_placed=True),
        "disk_params")
    RESULTS["disk_params_image"] = compare("disk", "reference")
    RESULTS["disk_params_session"] = session_facts("disk")
    # 5b. auto-fit decides what is unset, for the models connected to Apply Placement
    RESULTS["auto_fit"] = await run_prompt(executor, pipeline(auto_fit=True, tag="fit"),
                                           "auto_fit")
    # 5c. a second sampling through the same Apply Placement output (other conditioning):
    # its measured seconds per step are recorded against the plan's prediction
    from comfyui_placement.placement import machine_figures
    again = pipeline(auto_fit=True, tag="fit")
    again["3"]["inputs"]["seed"] = 11
    RESULTS["auto_fit_again"] = await run_prompt(executor, again, "auto_fit_again")
    RESULTS["auto_fit_learned"] = {
        key: rec.get("corrections") for key, rec in machine_figures.load_all()["machines"].items()}
    # 6. the diagnostic simulated inventory: the engine runs the diffusion model there
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = "cuda0=1GiB,cuda1=512MiB"
    try:
        RESULTS["simulated_devices"] = await run_prompt(executor, devices_prompt(), "sim_dev")
        RESULTS["simulated_apply"] = await run_prompt(
            executor, pipeline(backend="diffusion=cuda1,vae=cpu", tag="sim", keep_placed=True),
            "sim_apply")
        RESULTS["simulated_apply_image"] = compare("sim", "reference")
        RESULTS["simulated_apply_session"] = session_facts("sim")
        RESULTS["simulated_vae"] = await run_prompt(
            executor, pipeline(backend="diffusion=cuda1,vae=cuda0", tag="sim_vae"), "sim_vae")
        RESULTS["simulated_vae_image"] = compare("sim_vae", "reference")
    finally:
        del os.environ["COMFYUI_PLACEMENT_SIMULATE"]
    # 6b. the VAE on a simulated device whose budget fits its weights and one latent, not
    # four: ComfyUI's decode runs out of memory and retries tiled (one latent per call)
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = "cuda0=6MiB@workspace=0,cuda1=1GiB@workspace=0"
    try:                         # one latent's decode, with room to spare: what it needs
        probe = pipeline(backend="diffusion=cpu,vae=cuda1", batch=1, tag="vae_probe",
                         keep_placed_vae=True)
        probe["60"] = {"class_type": "PlacementTestPlanSink",
                       "inputs": {"plan_json": ["11", 7], "tag": "vae_probe"}}
        RESULTS["vae_probe"] = await run_prompt(executor, probe, "vae_probe")
        VAE_ONE_LATENT["bytes"] = max(c["working"] for c in vae_calls("vae_probe_vae"))
        # what the plan keeps for the decode (its estimate of one sample)
        VAE_ONE_LATENT["planned"] = working_memory(PLANS["vae_probe"], "vae")
    finally:
        del os.environ["COMFYUI_PLACEMENT_SIMULATE"]
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = \
        f"cuda0=6MiB@workspace=0,cuda1={vae_budget_kib()}KiB@workspace=0"
    try:
        RESULTS["vae_reference"] = await run_prompt(executor, pipeline(
            placed=False, batch=4, tiled_decode=True, tag="vae_reference"), "vae_reference")
        RESULTS["vae_tiled"] = await run_prompt(executor, pipeline(
            backend="diffusion=cpu,vae=cuda1", batch=4, tag="vae_tiled", keep_placed_vae=True),
            "vae_tiled")
        RESULTS["vae_tiled_image"] = compare("vae_tiled", "vae_reference")
        RESULTS["vae_tiled_calls"] = vae_calls("vae_tiled_vae")
        RESULTS["vae_budget_kib"] = vae_budget_kib()
    finally:
        del os.environ["COMFYUI_PLACEMENT_SIMULATE"]
    # 6c. the text encoder streamed on a simulated device smaller than it (with a LoRA)
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = TE_INVENTORY
    try:
        for lora in (False, True):
            ref, tag = f"te_reference{'_lora' * lora}", f"te_stream{'_lora' * lora}"
            RESULTS[ref] = await run_prompt(executor, pipeline(
                placed=False, text=True, te_lora=lora, tag=ref), ref)
            RESULTS[tag] = await run_prompt(executor, pipeline(
                backend="diffusion=cpu,vae=cpu,te=cuda0", stream_layers=True, text=True,
                te_lora=lora, tag=tag, keep_placed=True), tag)
            RESULTS[tag + "_image"] = compare(tag, ref)
            RESULTS[tag + "_calls"] = clip_calls(tag + "_clip")
        RESULTS["te_lora_changes_image"] = compare("te_stream_lora", "te_reference")
        RESULTS["te_split"] = await run_prompt(executor, pipeline(
            backend="diffusion=cpu,vae=cpu,te=cuda0&cuda1", text=True, tag="te_split",
            keep_placed=True), "te_split")
        RESULTS["te_split_image"] = compare("te_split", "te_reference")
        RESULTS["te_split_calls"] = clip_calls("te_split_clip")
        RESULTS["te_bytes"] = te_bytes()
        RESULTS["te_disk"] = await te_disk_scenarios(executor)
    finally:
        del os.environ["COMFYUI_PLACEMENT_SIMULATE"]
    # 7. streaming through the pack's engine inside ComfyUI
    if before:
        RESULTS["streaming"] = await streaming_scenarios(executor, before["model"])


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
    text = json.dumps(jsonable(RESULTS))
    if os.environ.get("PLACEMENT_RESULTS_FILE"):          # for a person debugging the driver
        with open(os.environ["PLACEMENT_RESULTS_FILE"], "w") as fh:
            fh.write(text)
    print("PLACEMENT_RESULTS " + text)

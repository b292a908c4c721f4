"""Model-patch stand-ins for the official templates (issue 31 item 3), inside ComfyUI's
Python: tiny random files ModelPatchLoader loads as the real ones (comfy_extras/
nodes_model_patch.py tells them apart by their keys), fitted to the diffusion stand-in
they patch (builders.DIFFUSION).

The loader builds each patch at its released widths (Qwen-Image's DiffSynth block-wise
ControlNet: 60 blocks of 3072); the stand-in records its tiny ones in its metadata
(encoders.TINY_KEY, as constructor overrides) and `install_hook()` applies them while
ModelPatchLoader loads such a file (real files load unchanged).
"""
import functools
import json
import os

import builders
import encoders

BLOCKWISE = "comfy_extras.nodes_model_patch.QwenImageBlockWiseControlNet"
# file name -> (the patch's class, the diffusion stand-in it patches)
FILES = {"qwen_image_canny_diffsynth_controlnet.safetensors": (BLOCKWISE, "qwen_image")}
ARCHITECTURES = {"model_patch:qwen_image_diffsynth_controlnet"}


def build(work, arch, dest):
    import torch
    import comfy.ops
    name = os.path.basename(dest)
    if name not in FILES:
        raise builders.NoBuilder(f"no stand-in builder for the model patch {name!r} yet "
                                 f"(tests/templates/model_patches.py FILES)")
    qualname, base = FILES[name]
    fam, _ = builders.diffusion_family(work, base)
    config = fam.unet_config
    width = config.get("num_attention_heads", 24) * config.get("attention_head_dim", 128)
    # one control block per block of the diffusion stand-in, as wide as its blocks
    over = {qualname: {"dim": width, "num_layers": config["num_layers"]}}
    tiny = json.dumps({"name": name, "init_overrides": over}, sort_keys=True)
    built = os.path.join(work, "standins", f"patch_{name}")
    if not encoders._up_to_date(built, tiny):
        with encoders._overrides(over):
            model = encoders._resolve(qualname)(device="cpu", dtype=torch.float32,
                                                operations=comfy.ops.disable_weight_init)
        sd = encoders._randomize(encoders._state_dict(model), builders.seed_of(name))
        del model
        encoders._save(built, sd, "bfloat16", encoders._spec_metadata(tiny))
    builders._link(built, dest)


def install_hook():
    """ModelPatchLoader builds a stand-in with the constructor overrides it records."""
    import sys
    import folder_paths
    import nodes
    cls = nodes.NODE_CLASS_MAPPINGS["ModelPatchLoader"]
    # ComfyUI loads comfy_extras under their file paths: the override names resolve to
    # the module it loaded, not a second copy
    sys.modules["comfy_extras.nodes_model_patch"] = sys.modules[cls.__module__]
    load = cls.load_model_patch
    if getattr(load, "_placement_tiny", False):
        return

    @functools.wraps(load)
    def tiny_load(self, name):
        spec = encoders.tiny_spec_of(folder_paths.get_full_path_or_raise("model_patches", name))
        with encoders._overrides((spec or {}).get("init_overrides")):
            return load(self, name)
    tiny_load._placement_tiny = True
    cls.load_model_patch = tiny_load

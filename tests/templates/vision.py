"""CLIP vision stand-ins for the official templates (issue 31 item 3), inside ComfyUI's
Python: tiny random image encoders that CLIPVisionLoader loads as the real ones.

ComfyUI picks an image encoder's config from the file's keys (comfy/clip_vision.py
`load_clipvision_from_sd`: CLIP-H by its 31st layer) and then builds the released
widths from a JSON file it ships. A stand-in keeps the keys detection reads and records
in its metadata (encoders.TINY_KEY) which JSON detection must pick and the tiny config
to build instead; `install_hook()` checks the first and applies the second, only while
such a file loads (real files load unchanged), as encoders.install_hooks() does for text
encoders and VAEs.
"""
import contextvars
import functools
import json
import os

import encoders

# architecture -> (the JSON ComfyUI's detection picks, the tiny config built instead).
# Tokens stay those of the released encoder (224 / 14: 16x16 patches and the class
# token), the width is builders.CLIP_VISION_WIDTH.
CONFIGS = {
    "clip_vision_h": ("clip_vision_config_h.json", {
        "attention_dropout": 0.0, "dropout": 0.0, "hidden_act": "gelu", "hidden_size": 32,
        "image_size": 224, "initializer_factor": 1.0, "initializer_range": 0.02,
        "intermediate_size": 64, "layer_norm_eps": 1e-05, "model_type": "clip_vision_model",
        "num_attention_heads": 2, "num_channels": 3, "num_hidden_layers": 32,
        "patch_size": 14, "projection_dim": 32, "torch_dtype": "float32"}),
}

_LOADING = contextvars.ContextVar("comfyui_placement_tiny_clip_vision", default=None)


def install_hook():
    """comfy.clip_vision.load builds a stand-in's tiny config (after checking that
    detection picked the config of the architecture the stand-in is of)."""
    import comfy.clip_vision
    load = comfy.clip_vision.load
    if getattr(load, "_placement_tiny", False):
        return

    @functools.wraps(load)
    def tiny_load(ckpt_path):
        spec = encoders.tiny_spec_of(ckpt_path)
        token = _LOADING.set(spec)
        try:
            return load(ckpt_path)
        finally:
            _LOADING.reset(token)
    tiny_load._placement_tiny = True
    comfy.clip_vision.load = tiny_load

    init = comfy.clip_vision.ClipVisionModel.__init__

    @functools.wraps(init)
    def tiny_init(self, json_config):
        spec = _LOADING.get()
        if spec and "clip_vision" in spec:
            detected, config = spec["clip_vision"]
            if not isinstance(json_config, str) or os.path.basename(json_config) != detected:
                raise RuntimeError(f"ComfyUI's detection picked {json_config!r} for a "
                                   f"{spec.get('name')} stand-in, not {detected}")
            json_config = dict(config)
        init(self, json_config)
    comfy.clip_vision.ClipVisionModel.__init__ = tiny_init


def build(work, name, seed=0):
    """The stand-in file of CLIP vision architecture `name` (kept when up to date)."""
    import comfy.clip_vision
    detected, config = CONFIGS[name]
    spec_json = json.dumps({"name": name, "clip_vision": [detected, config]}, sort_keys=True)
    path = os.path.join(work, "standins", f"clip_vision_{name}.safetensors")
    if encoders._up_to_date(path, spec_json):
        return path
    model = comfy.clip_vision.ClipVisionModel(dict(config))
    sd = encoders._randomize(encoders._state_dict(model.model), seed)
    del model
    encoders._save(path, sd, "float16", encoders._spec_metadata(spec_json))
    return path

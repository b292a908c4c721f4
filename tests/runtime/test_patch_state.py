"""A rehearsal leaves the patches' state as it found it (runtime/comfy/patchers/patch_state.py):
a patch that caches at its first call (Flux's KV cache) must cache the real first call's
tensors, never the meta rehearsal's."""
import importlib.util
from pathlib import Path

import torch
from torch import nn

# the module alone: the package runtime/comfy imports ComfyUI, which the unit tests lack
_PATH = Path(__file__).resolve().parents[2] / "runtime" / "comfy" / "patchers" / "patch_state.py"
_SPEC = importlib.util.spec_from_file_location("placement_patch_state", _PATH)
patch_state = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(patch_state)
kept, patch_objects = patch_state.kept, patch_state.patch_objects


class KVCache:
    """ComfyUI's KV_Attn_Input in small: the first call per block stores its keys."""

    def __init__(self):
        self.cache = {}

    def __call__(self, q, k, v, extra_options):
        key = extra_options["block_index"]
        if key in self.cache:
            self.set_cache = False
            return {"q": q, "k": torch.cat((k, self.cache[key]), 1), "v": v}
        self.cache[key] = k.clone()
        self.set_cache = True
        return {"q": q, "k": k, "v": v}


def options_with(cache, encoder):
    def post_input(inputs):             # holds the cache in its closure, as ComfyUI's does
        return inputs if not cache.cache else {**inputs, "trimmed": True}
    return {"patches": {"attn1_patch": [cache], "post_input": [post_input]},
            "patches_replace": {"dit": {("double_block", 0): encoder.forward}}}


class Encoder:
    def __init__(self):
        self.encoded = torch.ones(2)
        self.net = nn.Linear(2, 2)          # a module: weights, not per-call state

    def forward(self, args, extra):
        return args


def test_a_meta_call_leaves_the_cache_as_it_was():
    cache, encoder = KVCache(), Encoder()
    options = options_with(cache, encoder)
    assert {id(o) for o in patch_objects(options)} == {id(cache), id(encoder)}
    net = encoder.net
    with kept(options):
        meta = torch.empty(1, 3, device="meta")
        cache(meta, meta, meta, {"block_index": 0})
        encoder.encoded = torch.zeros(2, device="meta")
        encoder.extra = 1
        assert cache.cache and cache.set_cache
    assert cache.cache == {} and not hasattr(cache, "set_cache")
    assert not hasattr(encoder, "extra") and encoder.net is net
    assert encoder.encoded.device.type == "cpu" and encoder.encoded.sum() == 2
    # the real first call is the first again: it stores, and the next one reads
    real = torch.ones(1, 3)
    cache(real, real, real, {"block_index": 0})
    out = cache(real, real, real, {"block_index": 0})
    assert out["k"].shape == (1, 6) and out["k"].device.type == "cpu"


def test_state_is_put_back_when_the_call_raises():
    cache = KVCache()
    cache.cache["kept"] = torch.ones(1)
    options = {"patches": {"attn1_patch": [cache]}}
    try:
        with kept(options):
            cache.cache.clear()
            cache.cache[0] = torch.empty(1, device="meta")
            raise RuntimeError("the rehearsal failed")
    except RuntimeError:
        pass
    assert list(cache.cache) == ["kept"]


def test_no_patches_nothing_kept():
    assert patch_objects({}) == [] and patch_objects(None) == []
    with kept(None):
        pass

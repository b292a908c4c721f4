import pytest

from comfyui_placement.placement import PlacementError, PlacementSpec, plan
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo

GiB = 1 << 30


def _info(comp="diffusion", quant=None):
    blocks = tuple(BlockInfo(f"blocks.{i}", GiB, "blocks", i) for i in range(8))
    return ComponentInfo(comp, 8 * GiB + GiB // 4, blocks, arch="flux", quant=quant)


def _lora(seed_inventory, **kw):
    components = kw.pop("components", {"diffusion": _info()})
    p = plan(PlacementSpec(**kw), seed_inventory, components=components)
    return {c: cp.lora for c, cp in p.components.items()}, p


@pytest.mark.parametrize("kwargs,expected", [
    (dict(backend="cuda0"), "fuse"),                                   # resident
    (dict(backend="cuda0", params_backend="cpu"), "fuse"),             # takes turns, whole
    (dict(backend="cuda0", stream_layers=True), "runtime"),            # streamed
    (dict(backend="cuda0", params_backend="disk"), "runtime"),         # re-read from disk
    (dict(backend="cuda0&cuda1"), "runtime"),                          # split
    (dict(backend="cuda0", lora_mode="runtime"), "runtime"),           # forced
    (dict(backend="cuda0", params_backend="cpu", lora_mode="fuse"), "fuse"),
])
def test_auto_rule_and_forced_modes(seed_inventory, kwargs, expected):
    modes, p = _lora(seed_inventory, **kwargs)
    assert modes["diffusion"] == expected
    assert any(r.startswith("LoRA ") for r in p.components["diffusion"].reasons)
    assert p.to_dict()["components"]["diffusion"]["lora"] == expected


def test_quantized_weights_apply_at_runtime(seed_inventory):
    modes, _ = _lora(seed_inventory, backend="cuda0",
                     components={"diffusion": _info(quant="Q8_0")})
    assert modes["diffusion"] == "runtime"


@pytest.mark.parametrize("kwargs", [dict(backend="cuda0", stream_layers=True),
                                    dict(backend="cuda0", params_backend="disk"),
                                    dict(backend="cuda0&cuda1")])
def test_fuse_is_refused_where_it_would_bake_into_resting_weights(seed_inventory, kwargs):
    with pytest.raises(PlacementError, match="lora_mode fuse cannot apply to diffusion"):
        _lora(seed_inventory, lora_mode="fuse", **kwargs)


def test_auto_fit_plans_get_a_lora_mode_too(seed_inventory):
    modes, p = _lora(seed_inventory, auto_fit=True, max_vram="cuda0=4,cuda1=2,vulkan0=1,metal=1")
    cp = p.components["diffusion"]
    assert modes["diffusion"] == ("runtime" if (cp.stream or cp.is_split) else "fuse")


def test_bad_lora_mode():
    with pytest.raises(PlacementError, match="invalid lora_mode 'merge'; expected one of auto"):
        PlacementSpec(lora_mode="merge")

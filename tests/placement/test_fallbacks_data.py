"""What fell back is data in the plan (plan JSON "fallbacks"), so the editor and scripts
read it without parsing the warning sentences."""
from comfyui_placement.placement import Inventory, PlacementSpec, plan
from comfyui_placement.placement.plan import Plan


def test_each_fallback_is_a_record_with_component_field_asked_and_why():
    inv = Inventory.simulated("cuda0=8GiB,cuda1=8GiB")
    p = plan(PlacementSpec(backend="diffusion=cuda7,te=cuda", params_backend="vae=cuda5",
                           max_vram="cuda9=1"), inv, {}, strict=False)
    got = {(f["component"], f["field"], f["asked"]): f["why"] for f in p.extra["fallbacks"]}
    assert set(got) == {("diffusion", "backend", "cuda7"), ("te", "backend", "cuda"),
                        ("vae", "params", "cuda5"), (None, "max_vram", "cuda9")}, got
    assert "not found" in got[("diffusion", "backend", "cuda7")]
    assert "ambiguous" in got[("te", "backend", "cuda")]
    # one warning sentence per record still, and the records survive the plan JSON
    assert len(p.warnings) >= 4
    assert Plan.from_json(p.to_json()).extra["fallbacks"] == p.extra["fallbacks"]


def test_nothing_fell_back_no_key():
    p = plan(PlacementSpec(backend="diffusion=cuda0"), Inventory.simulated("cuda0=8GiB"), {})
    assert "fallbacks" not in p.extra

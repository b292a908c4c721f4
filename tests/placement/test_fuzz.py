"""Any string either parses or raises PlacementError: never another exception."""
from hypothesis import given, settings, strategies as st

from comfyui_placement.placement import Inventory, PlacementError, PlacementSpec, plan

INV = Inventory.simulated("cuda0=24GiB,cuda1=12GiB,vulkan0=8GiB,cpu=64GiB")
# Text built from the grammar's own pieces finds the interesting corners quickly.
pieces = st.sampled_from(["cuda0", "cuda1", "cuda", "vulkan", "cpu", "disk", "auto", "gpu",
                          "te", "vae", "clip_vision", "diffusion", "all", "*", "default",
                          "=", ",", "&", ":", "0", "-1", "6", "0.5", "GiB", "MiB", " ", "row",
                          "layer", "x", "é", "\n", ""])
grammar_text = st.lists(pieces, max_size=12).map("".join)
any_text = st.one_of(grammar_text, st.text(max_size=40))


def _outcome(**kwargs):
    try:
        spec = PlacementSpec(**kwargs)
    except PlacementError as exc:
        assert "\n" not in str(exc)
        return
    for strict in (True, False):
        try:
            plan(spec, INV, strict=strict)
        except PlacementError as exc:
            assert "\n" not in str(exc)


@settings(max_examples=300, deadline=None)
@given(any_text, any_text, any_text, any_text)
def test_every_string_parses_or_raises_placement_error(backend, params, budget, split):
    _outcome(backend=backend, params_backend=params, max_vram=budget, split_mode=split)


@settings(max_examples=200, deadline=None)
@given(any_text)
def test_simulated_inventory_text(text):
    try:
        Inventory.simulated(text)
    except PlacementError as exc:
        assert "\n" not in str(exc)

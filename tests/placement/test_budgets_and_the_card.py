"""A user's first hour: budgets checked against the card they are for, a streamed split
planned as it runs, and the estimate that a later measurement replaces never a reason
to refuse. Flux.1-dev as header-only files with the published shapes."""
from dataclasses import replace

import pytest

from helpers.flux_models import flux_components, write_flux_pipeline

from comfyui_placement.placement import Inventory, PlacementError, PlacementSpec, plan
from comfyui_placement.placement.metadata import describe_component
from comfyui_placement.placement.units import GiB, MiB


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_flux_pipeline(tmp_path_factory.mktemp("card"))


def flux(files, inventory, **spec):
    return plan(PlacementSpec(**spec), Inventory.simulated(inventory),
                {"diffusion": files["flux"]}, resolution=(1024, 1024))


def test_a_budget_above_the_card_is_capped_there_and_said(files):
    p = flux(files, "cuda0=8GiB,cpu=64GiB", backend="diffusion=cuda0",
             params_backend="diffusion=cpu", stream_layers=True, max_vram="cuda0=999999")
    cuda0 = p.device("cuda0")
    assert cuda0.budget_bytes == 8 * GiB          # the card's size, not 999999 GiB
    [line] = [w for w in p.warnings if "above cuda0's memory" in w]
    assert "8.00 GiB" in line and "lower max_vram cuda0" in line
    # a bare number is a budget for every GPU: checked on each
    p = flux(files, "cuda0=8GiB,cuda1=4GiB,cpu=64GiB", backend="diffusion=cuda0",
             params_backend="diffusion=cpu", stream_layers=True, max_vram="6")
    assert p.device("cuda0").budget_bytes == 6 * GiB
    assert p.device("cuda1").budget_bytes == 4 * GiB
    assert sum("above cuda1's memory" in w for w in p.warnings) == 1
    assert not any("above cuda0's memory" in w for w in p.warnings)


@pytest.mark.parametrize("max_vram", ["-1", "999999", "8 GB"])
def test_a_gpu_budget_with_no_gpu_is_said_never_dropped(files, max_vram):
    p = flux(files, "cpu=64GiB", max_vram=max_vram)
    [line] = [w for w in p.warnings if "budgets GPUs" in w]
    assert repr(max_vram) in line and "has none" in line


def test_a_budget_for_a_device_that_is_not_there_is_said_once(files):
    spec = dict(max_vram="cuda3=4", stream_layers=True, params_backend="diffusion=cpu")
    p = plan(PlacementSpec(**spec), Inventory.simulated("cuda0=8GiB,cpu=64GiB"),
             {"diffusion": files["flux"]}, strict=False)
    lines = [w for w in p.warnings if "cuda3" in w]
    assert len(lines) == 1, p.warnings
    with pytest.raises(PlacementError) as e:       # strict: an error, in one line
        plan(PlacementSpec(**spec), Inventory.simulated("cuda0=8GiB,cpu=64GiB"),
             {"diffusion": files["flux"]}, strict=True)
    assert "cuda3" in str(e.value) and "\n" not in str(e.value)


def test_a_streamed_split_plans_the_prefix_each_device_keeps(files):
    """stream_layers on a layer split with no budget: each device keeps the prefix of
    its range that its free memory holds beside the ring and the working memory (the
    runtime's rule), and the plan says so instead of K=0 on both."""
    p = flux(files, "cuda0=12GiB,cuda1=12GiB,cpu=64GiB", backend="diffusion=cuda0&cuda1",
             params_backend="diffusion=cpu", stream_layers=True)
    d = p.components["diffusion"]
    per = d.stream.per_device
    assert set(per) == {"cuda0", "cuda1"} and all(k > 0 for k, _ in per.values()), per
    assert d.stream.resident_blocks == sum(k for k, _ in per.values())
    assert sum(of for _, of in per.values()) == 57
    assert 0 < d.streamed_bytes < d.total_bytes // 4
    for name in ("cuda0", "cuda1"):
        dev = p.device(name)
        assert dev.planned_bytes <= dev.room_bytes


def test_a_refusal_offers_a_split_only_where_another_gpu_exists(files):
    spec = dict(backend="diffusion=cuda0", params_backend="diffusion=cpu",
                stream_layers=True)
    with pytest.raises(PlacementError) as alone:
        flux(files, "cuda0=1GiB,cpu=64GiB", **spec)
    assert "another GPU" not in str(alone.value) and "split it" not in str(alone.value)
    with pytest.raises(PlacementError) as two:
        flux(files, "cuda0=1GiB,cuda1=1GiB,cpu=64GiB", **spec)
    assert "diffusion=cuda0&cuda1" in str(two.value)


def test_an_estimate_a_run_measures_first_is_no_reason_to_refuse(files):
    """The working-memory estimate at 1024x1024 does not fit beside the streamed
    weights on this card; a component whose run measures its working memory before any
    weight moves (inside ComfyUI) is planned without it, said in its reasons, and one
    whose weights do not fit either is refused as before."""
    info = describe_component("diffusion", [files["flux"]], resolution=(1024, 1024))
    least = info.non_block_bytes + info.largest_block_bytes
    spec = PlacementSpec(backend="diffusion=cuda0", params_backend="diffusion=cpu",
                         stream_layers=True)
    size = least + info.headroom_bytes // 2 + 64 * MiB       # the estimate does not fit
    inv = Inventory.simulated(f"cuda0={size // MiB}MiB,cpu=64GiB")
    with pytest.raises(PlacementError) as e:
        plan(spec, inv, {"diffusion": info})
    assert "working memory" in str(e.value)
    later = replace(info, headroom_measured_later=True)
    p = plan(spec, inv, {"diffusion": later})
    d = p.components["diffusion"]
    assert d.headroom_bytes is None
    assert any("measured at the first model call" in r for r in d.reasons)
    assert any("first model call measures it" in w for w in p.warnings)
    # weights that do not fit are refused whatever the working memory
    small = Inventory.simulated(f"cuda0={(least - 64 * MiB) // MiB}MiB,cpu=64GiB")
    with pytest.raises(PlacementError):
        plan(spec, small, {"diffusion": later})


def test_streaming_alone_uses_the_card(files):
    """stream_layers without max_vram: the resident prefix fills cuda0's room (its free
    memory less the margin) less the working memory, the ring and any other component of
    the sampling phase there; unused room is less than one more block would need."""
    from comfyui_placement.placement.layout import prefix_and_ring
    info = describe_component("diffusion", files["flux"])
    sizes = [b.nbytes for b in info.blocks]
    for spec in ({}, {"max_vram": "cuda0=0"}):          # 0 = no budget, same as unset
        p = flux(files, "cuda0=8GiB,cpu=64GiB", backend="diffusion=cuda0",
                 stream_layers=True, **spec)
        cp, cuda0 = p.components["diffusion"], p.device("cuda0")
        k, depth = cp.stream.resident_blocks, cp.stream.prefetch_depth
        assert 0 < k < len(sizes)
        room = cuda0.room_bytes - cp.headroom_bytes - info.non_block_bytes
        used = prefix_and_ring(sizes, k, depth)
        assert used <= room and (room - used) < 0.10 * room
        assert prefix_and_ring(sizes, k + 1, depth) > room      # the largest that fits
        assert cuda0.planned_bytes <= cuda0.room_bytes
        assert any(f"first {k} of {len(sizes)} blocks resident" in r and "no budget" in r
                   for r in cp.reasons)
    # a budget keeps the prefix inside it, leaving the rest of the card alone
    budgeted = flux(files, "cuda0=8GiB,cpu=64GiB", backend="diffusion=cuda0",
                    stream_layers=True, max_vram="cuda0=4")
    assert budgeted.components["diffusion"].stream.resident_blocks < k
    assert budgeted.device("cuda0").planned_bytes <= 4 * GiB
    # a text encoder streamed beside it keeps every block streaming (it runs once)
    whole = plan(PlacementSpec(backend="cuda0,vae=cpu", stream_layers=True),
                 Inventory.simulated("cuda0=8GiB,cpu=64GiB"), flux_components(files),
                 resolution=(1024, 1024))
    assert whole.components["te"].stream.resident_blocks == 0
    assert whole.components["diffusion"].stream.resident_blocks > 0
    assert whole.device("cuda0").planned_bytes <= whole.device("cuda0").room_bytes


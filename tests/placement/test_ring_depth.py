"""The ring's schedule (placement/layout.ring_schedule) and the depth auto-fit streams at
when prefetch_depth is not set (fit.auto_depths, layout.choose_depth)."""
import pytest
from hypothesis import given, settings, strategies as st

from comfyui_placement.placement import Inventory, PlacementError
from comfyui_placement.placement.fit import FitOptions, fit
from comfyui_placement.placement.layout import choose_depth, compute_fractions, ring_schedule
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo

from test_fit_properties import request

MiB = 1 << 20


def test_synchronous_ring_adds_every_copy():
    step, stall = ring_schedule([1.0, 2.0, 3.0], [0.5, 0.5, 0.5], [1, 1, 1], depth=0)
    assert step == pytest.approx(7.5) and stall == pytest.approx(1.5)


def test_copies_under_compute_lose_nothing_at_depth_one():
    step, stall = ring_schedule([1.0] * 8, [0.5] * 8, [100] * 8, depth=1)
    assert step == pytest.approx(8.0) and stall == pytest.approx(0.0)


def test_transfer_bound_blocks_run_at_the_link():
    step, stall = ring_schedule([0.5] * 8, [1.0] * 8, [100] * 8, depth=2)
    assert step == pytest.approx(8.0) and stall == pytest.approx(0.0)


def test_heavy_blocks_in_a_row_stall_a_shallow_ring_and_a_deeper_one_absorbs_them():
    # Flux's mix: 4 double blocks (2.4x the bytes, same compute) then 8 single blocks,
    # transfer = compute over the step: a depth-1 ring holds one double block ahead
    sizes = [24] * 4 + [10] * 8
    compute = [1.0] * 12
    transfer = [12 * s / sum(sizes) for s in sizes]
    stalls = [ring_schedule(compute, transfer, sizes, d)[1] for d in (1, 2, 3, 4)]
    assert stalls[0] > 0.02 * 12
    assert all(a >= b - 1e-12 for a, b in zip(stalls, stalls[1:]))
    depth, shares = choose_depth(compute, transfer, sizes)
    assert depth > 1 and shares[-1] <= 0.02 and len(shares) == depth
    assert shares[0] == pytest.approx(stalls[0] / ring_schedule(compute, transfer, sizes, 1)[0])


def test_lead_compute_overlaps_the_first_copies_but_never_past_the_ring():
    sizes, compute, transfer = [10] * 4, [1.0] * 4, [2.0] * 4
    step0, _ = ring_schedule(compute, transfer, sizes, 1)
    step, stall = ring_schedule(compute, transfer, sizes, 1, lead=4.0)
    # the ring (two blocks) fills during the lead, then the link runs: 4 s of lead hide
    # two copies, not four, so the step is 10 s (bound 8 s), not 4 + 8
    assert step0 == pytest.approx(8.0)
    assert step == pytest.approx(10.0) and stall == pytest.approx(2.0)
    assert ring_schedule(compute, transfer, sizes, 3, lead=4.0)[1] == pytest.approx(0.0)


def test_flux_blocks_share_compute_equally_other_models_by_bytes():
    flux = ComponentInfo("diffusion", 34, (BlockInfo("double_blocks.0", 24, "double_blocks", 0),
                                           BlockInfo("single_blocks.0", 10, "single_blocks", 0)),
                         arch="flux")
    assert compute_fractions(flux) == [0.5, 0.5]
    other = ComponentInfo("diffusion", 34, flux.blocks, arch="unknown")
    assert compute_fractions(other) == pytest.approx([24 / 34, 10 / 34])


def _flux_like(doubles=8, singles=16):
    blocks = tuple([BlockInfo(f"double_blocks.{i}", 648 * MiB, "double_blocks", i)
                    for i in range(doubles)] +
                   [BlockInfo(f"single_blocks.{i}", 270 * MiB, "single_blocks", i)
                    for i in range(singles)])
    total = sum(b.nbytes for b in blocks) + 200 * MiB
    return {"diffusion": ComponentInfo("diffusion", total, blocks, arch="flux", dtype="bf16",
                                       headroom_bytes=1024 * MiB)}


def test_set_depth_is_the_deepest_tried_and_said_so():
    infos = _flux_like()
    inv = Inventory.simulated("cuda0=6GiB,cpu=64GiB")
    for asked in (0, 1, 2):
        cp = fit(request(), inv, infos, FitOptions(prefetch_depth=asked)).components["diffusion"]
        assert cp.stream is not None and cp.stream.prefetch_depth <= asked
        assert any(r.startswith(f"prefetch depth {cp.stream.prefetch_depth}: prefetch_depth "
                                f"{asked} as set") for r in cp.reasons)


def test_unset_depth_is_chosen_from_the_block_mix_and_explained():
    infos = _flux_like()
    inv = Inventory.simulated("cuda0=6GiB,cpu=64GiB")
    auto = fit(request(), inv, infos, FitOptions())
    cp = auto.components["diffusion"]
    assert cp.stream is not None
    line = next(r for r in cp.reasons if r.startswith("prefetch depth"))
    assert "stall by depth 1:" in line
    # never slower than any depth the caller could have set up to the one chosen
    t = auto.extra["fit"]["predicted"]["generation_s"]
    for asked in range(0, cp.stream.prefetch_depth + 1):
        other = fit(request(), inv, infos, FitOptions(prefetch_depth=asked))
        assert t <= other.extra["fit"]["predicted"]["generation_s"] * (1 + 1e-9)
    assert cp.reasons[-1].startswith("diffusion") or "blocks resident" in cp.reasons[-1]


@pytest.mark.parametrize("bad", [-1, 9, 1.5, True, "2"])
def test_bad_depth_is_one_line(bad):
    with pytest.raises(PlacementError, match="invalid prefetch_depth .*0..8, or None"):
        FitOptions(prefetch_depth=bad)


def _ahead_by_regions(sizes, offsets):
    """Reference: per position, how many next blocks fit beside it and each other,
    checking every pair of regions (empty blocks hold nothing)."""
    m, out = len(sizes), []
    for p in range(m):
        live = [(offsets[p], offsets[p] + sizes[p])] if sizes[p] > 0 else []
        a = 0
        while a < m - 1:
            j = (p + a + 1) % m
            lo, hi = offsets[j], offsets[j] + sizes[j]
            if hi > lo and any(lo < h and l < hi for l, h in live):
                break
            if hi > lo:
                live.append((lo, hi))
            a += 1
        out.append(a)
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=24).filter(lambda s: max(s) > 0),
       st.integers(1, 5), st.integers(0, 30), st.data())
def test_ring_horizon_equals_checking_every_region(sizes, depth, spare, data):
    from comfyui_placement.placement.layout import _ahead, ring_bytes
    ring = max(max(sizes), ring_bytes(sizes, depth) + spare)
    start = data.draw(st.integers(0, len(sizes) - 1))
    offsets, off = [0] * len(sizes), 0      # laid out as ring_layout lays them
    for i in range(len(sizes)):
        q = (start + i) % len(sizes)
        if off + sizes[q] > ring:
            off = 0
        offsets[q], off = off, off + sizes[q]
    assert _ahead(sizes, offsets) == _ahead_by_regions(sizes, offsets)

"""The block layout (placement/layout.py): the ring's bytes, the blocks' offsets in it,
and the planner's predicted device bytes equal to what the runtime allocates."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from comfyui_placement.placement.fit.geometry import Geometry
from comfyui_placement.placement.layout import (group_blocks, resident_prefix, ring_bytes,
                                                ring_layout)
from comfyui_placement.placement.metadata.describe import describe
from comfyui_placement.runtime import find_blocks, place


def brute_ring(sizes, depth):
    m = len(sizes)
    if not m:
        return 0
    w = min(depth, m - 1) + 1
    return max(sum(sizes[(p + i) % m] for i in range(w)) for p in range(m))


@given(st.lists(st.integers(1, 50), min_size=1, max_size=20), st.integers(0, 5))
@settings(max_examples=200, deadline=None)
def test_ring_bytes_and_layout(sizes, depth):
    ring = ring_bytes(sizes, depth)
    assert ring == brute_ring(sizes, depth)
    lay = ring_layout(sizes, ring, depth)
    m = len(sizes)
    for p in range(m):
        assert 0 <= lay.offsets[p] and lay.offsets[p] + sizes[p] <= ring
        # the block computing and every block in flight beside it: disjoint regions
        live = [((p + i) % m) for i in range(lay.ahead[p] + 1)]
        spans = sorted((lay.offsets[j], lay.offsets[j] + sizes[j]) for j in live)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
        assert lay.ahead[p] <= m - 1 and (depth > 0 or lay.ahead[p] == 0)


def test_uniform_ring_is_depth_plus_one_blocks_and_runs_depth_ahead():
    for depth in (1, 2, 3):
        sizes = [10] * 12
        ring = ring_bytes(sizes, depth)
        assert ring == (depth + 1) * 10
        assert ring_layout(sizes, ring, depth).ahead == [depth] * 12


def test_mixed_ring_holds_more_small_blocks_ahead():
    """Flux: 19 double blocks of 648 MiB, 38 single of 270 MiB. Depth 1 costs two double
    blocks (what two slots of the largest cost), and the single blocks run 3-4 ahead."""
    sizes = [648] * 19 + [270] * 38
    ring = ring_bytes(sizes, 1)
    assert ring == 2 * 648
    lay = ring_layout(sizes, ring, 1)
    assert min(lay.ahead) >= 1
    assert min(lay.ahead[19:-3]) >= 3
    # a deeper ring of the same blocks: three double blocks, not three of the largest
    # whatever comes (same here), and past the doubles more than twice as many ahead
    assert ring_bytes(sizes, 2) == 3 * 648
    assert ring_bytes([648] + [270] * 10, 2) == 648 + 2 * 270


def test_resident_prefix_is_the_largest_that_fits():
    sizes = [7, 7, 3, 3, 3, 3]
    for room in range(0, 40):
        k = resident_prefix(sizes, room, 1)
        fits = [j for j in range(len(sizes) + 1)
                if sum(sizes[:j]) + brute_ring(sizes[j:], 1) <= room]
        assert k == (max(fits) if fits else None)


def test_group_blocks_shares_go_to_the_rest():
    members, rest = group_blocks([[1, 2, 9], [3, 9], []], [1, 2, 3, 4, 9])
    assert members == [[1, 2], [3], []]
    assert rest == [4, 9]


@pytest.mark.parametrize("k,depth", [(0, 1), (0, 2), (1, 1), (2, 3), (0, 0)])
def test_planner_bytes_equal_runtime_bytes(k, depth, tiny, run_model, plan_for,
                                           sim_inventory):
    """Flux's double and single blocks differ in size: the planner's stream footprint
    (non-block + resident prefix + ring) is exactly what the ledger holds."""
    model, inp = tiny("flux")
    sizes = [sum(t.numel() * t.element_size() for t in b.parameters())
             for _, b in find_blocks(model)]
    assert len(set(sizes)) > 1
    geo = Geometry(describe(model, "diffusion")[0], headroom=0)
    assert geo.sizes == sizes
    # loaded at entry (no first call to rehearse): the bytes allocated are the byte model's
    with place(model, plan_for("cpu", stream=(k, depth)), "diffusion", sim_inventory,
               rehearse=False) as p:
        dev = p.stats()["devices"]["cuda0"]
        held = dev["resident_bytes"] + dev["slot_bytes"]
        assert dev["slot_bytes"] == geo.window(k, depth) == ring_bytes(sizes[k:], depth)
        assert held == geo.stream_weights(k, depth)
        run_model(model, inp)


def test_layer_split_ring_bytes_equal_the_planners(tiny, sim_inventory):
    """A layer split streaming its ranges' tails holds on each device the resident
    prefix + the ring the planner's range arithmetic predicts."""
    from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan, StreamPlan
    model, inp = tiny("flux")
    geo = Geometry(describe(model, "diffusion")[0], headroom=0)
    ranges = {"cuda0": [0, 0], "cuda1": [1, 4]}       # 2 double blocks, then 3 single
    caps = {"cuda0": geo.non_block + geo.sizes[0],
            "cuda1": geo.sizes[1] + ring_bytes(geo.sizes[2:5], 1)}
    hr = 1 << 20                                        # activations' room
    plan = Plan([DevicePlan(n, "gpu", 256 << 20, 256 << 20, caps[n] + hr) for n in caps],
                {"diffusion": ComponentPlan("diffusion", ["cuda0", "cuda1"], "cpu",
                                            stream=StreamPlan(0, 1), blocks=ranges)})
    with place(model, plan, "diffusion", sim_inventory, headroom_bytes=hr,
               rehearse=False) as p:
        s = p.stats()["devices"]
        for name, (a, b) in ranges.items():
            room = caps[name] - (geo.non_block if name == "cuda0" else 0)
            k = geo.range_prefix(a, b + 1, room, 1)
            want = geo.prefix[a + k] - geo.prefix[a] + geo.range_window(a + k, b + 1, 1)
            held = s[name]["resident_bytes"] + s[name]["slot_bytes"]
            assert held - (geo.non_block if name == "cuda0" else 0) == want
            assert s[name]["slot_bytes"] == geo.range_window(a + k, b + 1, 1)
        assert s["cuda1"]["slot_bytes"] == 2 * geo.sizes[4] < 2 * geo.sizes[1]
        with torch.no_grad():
            model(**inp)

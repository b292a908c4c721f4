import json

import pytest

from comfyui_placement.placement import Plan, PlacementError, PlacementSpec, plan
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo

GiB = 1 << 30


def _flux_like(total_blocks=10, block=GiB):
    blocks = tuple(BlockInfo(f"blocks.{i}", block, "blocks", i) for i in range(total_blocks))
    return ComponentInfo("diffusion", total_blocks * block + GiB // 2, blocks, arch="flux")


def test_json_v1_keys_and_round_trip(seed_inventory):
    # 10.5 GiB over budgets of 6 and 2.5 GiB: each device streams its range
    p = plan(PlacementSpec(backend="diffusion=cuda0&cuda1,te=cpu", params_backend="vae=disk",
                           max_vram="cuda0=6,cuda1=2.5", stream_layers=True), seed_inventory,
             components={"diffusion": _flux_like()})
    data = json.loads(p.to_json())
    assert data["version"] == 1
    assert set(data["devices"][0]) >= {"name", "kind", "total_bytes", "free_bytes", "budget_bytes"}
    comp = data["components"]["diffusion"]
    assert set(comp) >= {"runtime", "params", "split_mode", "stream", "blocks", "resident_bytes",
                         "streamed_bytes", "reasons"}
    assert comp["runtime"] == ["cuda0", "cuda1"]
    # the blocks do not fit whole: in proportion to the rooms (budgets less a margin of a
    # sixteenth), the main device's less the 0.5 GiB of non-block weights:
    # 5.125:2.34 -> 6.86 blocks on cuda0
    assert comp["blocks"] == {"cuda0": [0, 6], "cuda1": [7, 9]}
    assert data["components"]["vae"]["params"] == "disk"
    again = Plan.from_json(p.to_json())
    assert again.to_json() == p.to_json()


def test_stream_layers_without_auto_fit(seed_inventory):
    p = plan(PlacementSpec(backend="cuda1", stream_layers=True, max_vram="cuda1=4"),
             seed_inventory, components={"diffusion": _flux_like()})
    cp = p.components["diffusion"]
    assert cp.params == "cpu" and cp.stream is not None
    assert cp.resident_bytes + cp.streamed_bytes == cp.total_bytes
    assert cp.resident_bytes <= 4 * GiB
    assert p.components["vae"].stream is None            # only diffusion and te stream
    data = json.loads(p.to_json())
    assert data["components"]["diffusion"]["stream"]["prefetch_depth"] >= 1


def test_weights_past_the_budget_are_refused_in_one_line(seed_inventory):
    """The runtime could not allocate them (issue 21 item 4): plan() says where, by how
    much, and one change that fixes it."""
    with pytest.raises(PlacementError) as err:
        plan(PlacementSpec(backend="cuda1", max_vram="cuda1=4"), seed_inventory,
             components={"diffusion": _flux_like()})
    assert str(err.value) == ("cuda1: diffusion needs 10.50 GiB for its weights there but "
                              "the budget of cuda1 (4.00 GiB less its 256.00 MiB margin) "
                              "leaves 3.75 GiB, short by 6.75 GiB; turn on stream_layers")
    with pytest.raises(PlacementError, match="short by .*; raise max_vram cuda1 to"):
        plan(PlacementSpec(backend="cuda1", max_vram="cuda1=0.5", stream_layers=True),
             seed_inventory, components={"diffusion": _flux_like()})


def test_working_memory_past_the_budget_is_refused_in_one_line(seed_inventory):
    """Weights that fit and working memory that does not: the budget holds both (issue
    29), so plan() refuses in one line; the run would run out of memory."""
    from dataclasses import replace
    info = replace(_flux_like(), headroom_bytes=2 * GiB)
    with pytest.raises(PlacementError) as err:
        plan(PlacementSpec(backend="cuda1", max_vram="cuda1=11"), seed_inventory,
             components={"diffusion": info})
    assert str(err.value) == (
        "cuda1: diffusion needs 10.50 GiB for its weights and 2.00 GiB of working memory "
        "for diffusion there but the budget of cuda1 (11.00 GiB less its 512.00 MiB margin) "
        "leaves 10.50 GiB, short by 2.00 GiB; turn on stream_layers")
    # streamed, the resident prefix leaves the working memory its room
    p = plan(PlacementSpec(backend="cuda1", max_vram="cuda1=11", stream_layers=True),
             seed_inventory, components={"diffusion": info})
    assert p.device("cuda1").planned_bytes <= p.device("cuda1").room_bytes
    assert p.components["diffusion"].headroom_bytes == 2 * GiB


@pytest.mark.parametrize("text,words", [
    ("[]", "object"), ("{", "not JSON"), ('{"version": 2}', "unsupported plan version"),
    ('{"version": 1, "devices": []}', "not a plan"),
    ('{"version": 1, "devices": [], "components": {"gpu": {}}}', "unknown component"),
])
def test_bad_plan_json(text, words):
    with pytest.raises(PlacementError, match=words):
        Plan.from_json(text)


def test_report_is_a_table(seed_inventory):
    text = plan(PlacementSpec(backend="te=cpu"), seed_inventory).report()
    assert "component" in text and "device" in text and "cuda0" in text


def test_split_planned_bytes_follow_block_sizes(seed_inventory):
    # blocks of unequal size: the device table must count the real bytes of each range
    blocks = tuple(BlockInfo(f"blocks.{i}", (i + 1) * GiB // 4, "blocks", i) for i in range(8))
    info = ComponentInfo("diffusion", sum(b.nbytes for b in blocks) + GiB // 8, blocks)
    p = plan(PlacementSpec(backend="diffusion=cuda0&cuda1", max_vram="cuda0=6,cuda1=6"),
             seed_inventory, components={"diffusion": info})
    ranges = p.components["diffusion"].blocks
    expect = {d: sum(b.nbytes for b in blocks[r[0]:r[1] + 1]) for d, r in ranges.items()}
    expect["cuda0"] += GiB // 8
    assert {d: p.device(d).planned_bytes for d in ranges} == expect
    assert sum(expect.values()) == info.total_bytes


def test_added_keys_round_trip_and_old_plans_default(seed_inventory):
    """host_blocks, parallel, tile and quant are keys added to v1: they round-trip, and a
    plan written before they existed loads with their defaults."""
    p = plan(PlacementSpec(backend="cuda1", stream_layers=True, max_vram="cuda1=4"),
             seed_inventory, components={"diffusion": _flux_like()})
    cp = p.components["diffusion"]
    cp.stream.host_blocks, cp.parallel, cp.tile, cp.quant = 3, "batch", 512, "Q4_K"
    again = Plan.from_json(p.to_json()).components["diffusion"]
    assert (again.stream.host_blocks, again.parallel, again.tile, again.quant) == \
        (3, "batch", 512, "Q4_K")
    data = json.loads(p.to_json())
    for c in data["components"].values():
        for key in ("parallel", "tile", "quant"):
            c.pop(key)
        if c["stream"]:
            c["stream"].pop("host_blocks")
    old = Plan.from_dict(data).components["diffusion"]
    assert (old.stream.host_blocks, old.parallel, old.tile, old.quant) == (0, "none", None, None)


@pytest.mark.parametrize("key,value,words", [
    ("parallel", "tensor", "invalid parallel"),
    ("host_blocks", -1, "host_blocks"),
])
def test_added_keys_refuse_nonsense(seed_inventory, key, value, words):
    p = plan(PlacementSpec(backend="cuda1", stream_layers=True, max_vram="cuda1=4"),
             seed_inventory, components={"diffusion": _flux_like()})
    data = json.loads(p.to_json())
    comp = data["components"]["diffusion"]
    (comp["stream"] if key == "host_blocks" else comp)[key] = value
    with pytest.raises(PlacementError, match=words):
        Plan.from_dict(data)

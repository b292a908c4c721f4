"""A model bigger than any one machine: auto-fit lets the local GPU stream its range while
a worker's GPU holds the last blocks for the session (kinds/worker_ranges.py remote_tail_spans,
WorkerRangesKind), chosen only when its network crossings price faster than
streaming alone. Flux.1-dev fp16 (22.17 GiB, 57 blocks) at 1024x1024 with CFG."""
import pytest

from comfyui_placement.placement import Inventory, PlacementSpec, plan
from comfyui_placement.placement.fit.geometry import Geometry
from comfyui_placement.placement.fit.kinds.worker_ranges import remote_tail_spans

from helpers.flux_models import flux_components, generation_s, write_flux_pipeline


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_flux_pipeline(tmp_path_factory.mktemp("flux"))


def fit(files, inventory, network=None, **spec):
    spec.setdefault("auto_fit", True)
    extra = {} if network is None else {"network_bandwidth": network}
    return plan(PlacementSpec(**spec), Inventory.simulated(inventory), flux_components(files),
                resolution=(1024, 1024), **extra)


def test_a_worker_holds_the_last_blocks_while_the_local_gpu_streams(files):
    alone = fit(files, "cuda0=8GiB,cpu=64GiB")
    p = fit(files, "cuda0=8GiB,w1.cuda0=8GiB,cpu=64GiB", network=12.5e9)
    c = p.components["diffusion"]
    assert c.runtime == ["cuda0", "w1.cuda0"] and c.params == "cpu"
    first, last = c.blocks["w1.cuda0"]
    assert last == 56 and c.blocks["cuda0"] == [0, first - 1]      # the tail on the worker
    per = p.extra["fit"]["components"]["diffusion"]["stream_per_device"]
    assert per["w1.cuda0"] == [last - first + 1] * 2                # held whole, never streamed
    assert 0 <= per["cuda0"][0] < per["cuda0"][1] == first           # the local range streams
    assert any("holding the last blocks on the other machine" in r for r in c.reasons)
    assert generation_s(p) < generation_s(alone)
    for d in p.devices:                 # each GPU's planned bytes within what it has
        if d.name in ("cuda0", "w1.cuda0"):
            assert 0 < d.planned_bytes <= d.total_bytes, d.name


def test_a_slow_network_keeps_it_local(files):
    p = fit(files, "cuda0=8GiB,w1.cuda0=8GiB,cpu=64GiB", network=0.125e9)     # 1 GbE
    assert p.components["diffusion"].runtime == ["cuda0"]
    fast = fit(files, "cuda0=8GiB,w1.cuda0=8GiB,cpu=64GiB", network=12.5e9)
    assert generation_s(fast) < generation_s(p)


def test_asked_for_by_the_backend(files):
    p = fit(files, "cuda0=8GiB,w1.cuda0=8GiB,cpu=64GiB", backend="diffusion=cuda0&w1.cuda0")
    c = p.components["diffusion"]
    assert c.runtime == ["cuda0", "w1.cuda0"] and c.blocks["w1.cuda0"][1] == 56
    assert c.stream is not None


def test_remote_tail_spans_fill_from_the_end():
    geo = Geometry.__new__(Geometry)
    geo.n, geo.prefix = 6, [0, 10, 20, 30, 40, 50, 60]
    assert remote_tail_spans(geo, [25]) == [(0, 4), (4, 6)]            # 2 blocks fit 25
    assert remote_tail_spans(geo, [20, 30]) == [(0, 1), (1, 3), (3, 6)]
    assert remote_tail_spans(geo, [20]) == [(0, 4), (4, 6)]            # exactly at the edge
    assert remote_tail_spans(geo, [19]) == [(0, 5), (5, 6)]            # one byte short: one
    assert remote_tail_spans(geo, [9]) is None                         # not one block
    assert remote_tail_spans(geo, [60]) == [(0, 1), (1, 6)]            # a block stays local

"""Auto-fit decides batch parallel, the pipelined layer split and remote ranges by
predicted time (issue 13 items 1 and 4), knowing each link's kind and speed."""
import pytest

from comfyui_placement.placement import Inventory, PlacementError, PlacementSpec, plan
from comfyui_placement.placement.components import COMPONENTS
from comfyui_placement.placement.fit import FitOptions, fit
from comfyui_placement.placement.fit.geometry import Geometry
from comfyui_placement.placement.fit.costs import (BATCH_PARALLEL_EFFICIENCY, CostModel,
                                                   DEFAULT_NETWORK_BANDWIDTH)
from comfyui_placement.placement.machine_figures import Figures
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo
from comfyui_placement.placement.resolve import Choice, Request

GiB = 1 << 30


def info(size_gib, n=20, headroom=GiB):
    block = int(size_gib * GiB) // n
    blocks = tuple(BlockInfo(f"blocks.{i}", block, "blocks", i) for i in range(n))
    return ComponentInfo("diffusion", block * n, blocks, arch="test", dtype="bf16",
                         headroom_bytes=headroom)


def request(**choices):
    full = {c: Choice(None, None, None) for c in COMPONENTS}
    full.update(choices)
    return Request(full, {}, False, [])


def run(inv, infos, req=None, **options):
    return fit(req or request(), Inventory.simulated(inv), infos, FitOptions(**options))


def fitted(p):
    return p.extra["fit"]["components"]["diffusion"]


# -- batch parallel ------------------------------------------------------------------------

def test_batch_parallel_wins_when_each_gpu_holds_the_model_and_cfg_gives_a_batch_of_2():
    p = run("cuda0=24GiB,cuda1=24GiB", {"diffusion": info(8)}, cond_batch=2)
    cp = p.components["diffusion"]
    assert cp.parallel == "batch" and cp.runtime == ["cuda0", "cuda1"]
    assert cp.params == "cuda0" and cp.stream is None and not cp.blocks   # resident on each
    f = fitted(p)
    assert f["items_per_device"] == {"cuda0": 1, "cuda1": 1}
    speedup = f["alternatives_forward_s"]["plain"] / f["forward_s"]
    # two equal GPUs, one item each: ideal 2x, of whose saving the model realises 90%
    assert 1.0 / (1 - BATCH_PARALLEL_EFFICIENCY / 2) - 0.05 < speedup < 2.0
    assert f["serial_forward_s"] == pytest.approx(f["alternatives_forward_s"]["plain"])
    assert any(r.startswith("parallel: batch parallel (predicted fastest)") and "plain" in r
               for r in cp.reasons)
    # both devices hold the whole model for the session
    assert p.device("cuda0").planned_bytes >= cp.total_bytes
    assert p.device("cuda1").planned_bytes >= cp.total_bytes


def test_batch_of_one_or_one_gpu_is_never_batch_parallel():
    one = run("cuda0=24GiB,cuda1=24GiB", {"diffusion": info(8)}, cond_batch=1)
    assert one.components["diffusion"].parallel == "none"
    assert one.components["diffusion"].runtime == ["cuda0"]
    assert not any(r.startswith("parallel:") for r in one.components["diffusion"].reasons)
    gpu = run("cuda0=24GiB", {"diffusion": info(8)}, cond_batch=2)
    assert gpu.components["diffusion"].parallel == "none"
    # the batch itself (not CFG) counts too: batch 2, no CFG
    two = run("cuda0=24GiB,cuda1=24GiB", {"diffusion": info(8)}, batch=2)
    assert two.components["diffusion"].parallel == "batch"


def test_a_slower_second_gpu_gets_fewer_items():
    p = run("cuda0=24GiB,cuda1=24GiB", {"diffusion": info(8)}, batch=4, cond_batch=2,
            throughput={"cuda0": 120e12, "cuda1": 40e12})
    f = fitted(p)
    assert p.components["diffusion"].parallel == "batch"
    assert f["items_per_device"]["cuda0"] > f["items_per_device"]["cuda1"] >= 1
    assert sum(f["items_per_device"].values()) == 8


def test_streamed_batch_parallel_counts_one_shared_host_copy():
    """Each 12 GiB GPU streams the 16 GiB model from the same packed host copy: host RAM
    holds it once. At a host budget of exactly one copy it is chosen; one byte less and
    it cannot be (it never streams from disk)."""
    model = info(16)
    total = model.total_bytes
    p = run("cuda0=12GiB,cuda1=12GiB", {"diffusion": model}, cond_batch=2, host_budget=total)
    cp = p.components["diffusion"]
    assert cp.parallel == "batch" and cp.params == "cpu" and cp.stream is not None
    assert p.extra["fit"]["predicted"]["host_bytes"] == total        # once, not twice
    assert fitted(p)["forward_s"] < fitted(p)["alternatives_forward_s"]["plain"]
    short = run("cuda0=12GiB,cuda1=12GiB", {"diffusion": model}, cond_batch=2,
                host_budget=total - 1)
    assert short.components["diffusion"].parallel != "batch"
    assert short.extra["fit"]["predicted"]["host_bytes"] <= total - 1


def test_streamed_batch_parallel_shares_working_memory_per_share():
    """A share of 1 item of a batch of 2 needs the workspace and half the activations
    (the metadata's estimate: 256 MiB workspace + activations in proportion to the
    batch); each device holds its stream ring, resident prefix and that."""
    model = info(16, headroom=4 * GiB)
    # the host given (not this machine's free RAM, which moves between runs)
    p = run("cuda0=12GiB,cuda1=12GiB,cpu=64GiB", {"diffusion": model}, cond_batch=2)
    cp = p.components["diffusion"]
    assert cp.parallel == "batch" and cp.stream is not None
    share = (256 << 20) + (4 * GiB - (256 << 20)) // 2
    weights = Geometry(model).stream_weights(cp.stream.resident_blocks,
                                             cp.stream.prefetch_depth)
    assert fitted(p)["held_bytes"] == {"cuda0": weights + share, "cuda1": weights + share}
    # a given headroom is kept whole (nothing says what part of it scales)
    given = run("cuda0=12GiB,cuda1=12GiB,cpu=64GiB", {"diffusion": model}, cond_batch=2,
                headroom={"diffusion": 4 * GiB + 1})
    g = given.components["diffusion"]
    if g.parallel == "batch":
        w = Geometry(model).stream_weights(g.stream.resident_blocks, g.stream.prefetch_depth)
        assert fitted(given)["held_bytes"]["cuda0"] == w + 4 * GiB + 1


def test_batch_parallel_share_scales_with_the_inventorys_own_workspace():
    """Devices that allocate no kernel workspace (@workspace=0: the simulated devices of
    the integration suite): the working memory is activations alone, so a share of 1
    item of 2 keeps half of it on each device, whatever its size (issue 29 item 3: an
    estimate under the default 256 MiB workspace was kept whole on each device, and a
    two-way batch parallel measured 0.70 of its plan)."""
    model = info(8, headroom=64 << 20)
    p = run("cuda0=24GiB@workspace=0,cuda1=24GiB@workspace=0", {"diffusion": model},
            cond_batch=2)
    cp = p.components["diffusion"]
    assert cp.parallel == "batch" and cp.stream is None, cp
    assert fitted(p)["held_bytes"] == {"cuda0": model.total_bytes + (32 << 20),
                                       "cuda1": model.total_bytes + (32 << 20)}
    for name in ("cuda0", "cuda1"):
        assert p.device(name).planned_bytes == model.total_bytes + (32 << 20)


# -- pipelined split -----------------------------------------------------------------------

def test_pipeline_beats_the_plain_split_when_no_gpu_holds_the_model():
    """16 GiB over two 12 GiB GPUs, host RAM too small for a host copy (no streaming
    from it), CFG batch 2: the layer split pipelines the two shares."""
    model = info(16)
    p = run("cuda0=12GiB,cuda1=12GiB", {"diffusion": model}, cond_batch=2,
            host_budget=2 * GiB)
    cp = p.components["diffusion"]
    assert cp.parallel == "pipeline" and cp.runtime == ["cuda0", "cuda1"]
    assert set(cp.blocks) == {"cuda0", "cuda1"} and cp.stream is None
    f = fitted(p)
    plain = f["serial_forward_s"]
    # 2 shares over 2 stages: ideal 2b/(b+1) = 1.33x, 70% of the saving realised
    assert 1.1 < plain / f["forward_s"] < 4 / 3
    assert any(r.startswith("batch of 2 per forward -> pipelined") for r in cp.reasons)
    # forbidden: the plain split, same ranges
    req = request(diffusion=Choice(None, None, None, "none"))
    none = run("cuda0=12GiB,cuda1=12GiB", {"diffusion": model}, req, cond_batch=2,
               host_budget=2 * GiB)
    assert none.components["diffusion"].parallel == "none"
    assert none.components["diffusion"].blocks == cp.blocks
    assert fitted(none)["forward_s"] == pytest.approx(plain)
    # batch 1: nothing to pipeline
    one = run("cuda0=12GiB,cuda1=12GiB", {"diffusion": model}, host_budget=2 * GiB)
    assert one.components["diffusion"].parallel == "none"


def test_pipeline_gains_more_with_more_shares():
    model = info(16)
    gains = []
    for batch in (1, 2):
        p = run("cuda0=12GiB,cuda1=12GiB", {"diffusion": model}, cond_batch=2, batch=batch,
                host_budget=2 * GiB)
        f = fitted(p)
        gains.append(f["serial_forward_s"] / f["forward_s"])
    assert gains[1] > gains[0] > 1


def test_the_comfyui_executor_plans_batch_parallel_for_diffusion():
    p = run("cuda0=24GiB,cuda1=24GiB", {"diffusion": info(8)}, cond_batch=2,
            executor="comfyui")
    assert p.components["diffusion"].parallel == "batch"


# -- asked or forbidden --------------------------------------------------------------------

def test_parallel_batch_asked_with_auto_fit_is_honoured_or_refused_in_one_line():
    inv = Inventory.simulated("cuda0=24GiB,cuda1=24GiB,cuda2=24GiB")
    spec = PlacementSpec(backend="diffusion=cuda1&cuda2", parallel="diffusion=batch",
                         auto_fit=True)
    p = plan(spec, inv, {"diffusion": info(8)})          # batch 1: asked all the same
    cp = p.components["diffusion"]
    assert cp.parallel == "batch" and cp.runtime == ["cuda1", "cuda2"]
    assert any("parallel batch asked" in r for r in cp.reasons)
    # split_mode batch is the same request; auto-fit picks the GPUs
    p = plan(PlacementSpec(split_mode="diffusion=batch", auto_fit=True), inv,
             {"diffusion": info(8)}, cond_batch=2)
    assert p.components["diffusion"].parallel == "batch"
    assert len(p.components["diffusion"].runtime) == 2
    # too big for each device even streamed: one line, says why
    small = Inventory.simulated("cuda0=2GiB,cuda1=24GiB")
    with pytest.raises(PlacementError) as err:
        plan(PlacementSpec(backend="diffusion=cuda0&cuda1", parallel="diffusion=batch",
                           auto_fit=True), small, {"diffusion": info(30, n=4)})
    assert "\n" not in str(err.value) and "parallel batch over cuda0&cuda1" in str(err.value)
    assert "cuda0" in str(err.value)


def test_parallel_none_forbids_batch_parallel():
    inv = Inventory.simulated("cuda0=24GiB,cuda1=24GiB")
    p = plan(PlacementSpec(parallel="diffusion=none", auto_fit=True), inv,
             {"diffusion": info(8)}, cond_batch=2)
    assert p.components["diffusion"].parallel == "none"


# -- links ---------------------------------------------------------------------------------

def test_link_kinds_from_given_measured_and_default_figures():
    inv = Inventory.simulated("cuda0=24GiB,cuda1=24GiB,cuda2=24GiB,w1.cuda0=24GiB")
    measured = Figures(links={("cuda0", "cuda1"): (40e9, "peer"),
                              ("cuda1", "cuda2"): (9e9, "host-staged")})
    m = CostModel(inv.devices, {}, {}, measured=measured)
    assert m.link("cuda0", "cuda1")[:2] == ("peer", 40e9)
    assert m.link("cuda1", "cuda0")[:2] == ("peer", 40e9)
    assert m.link("cuda2", "cuda1")[:2] == ("host-staged", 9e9)
    assert m.link("cuda0", "cuda2")[:2] == ("host-staged", 25e9)     # default: host links
    assert m.link("cuda0", "w1.cuda0")[:2] == ("network", DEFAULT_NETWORK_BANDWIDTH)
    given = CostModel(inv.devices, {}, {}, peer_bandwidth=60e9, measured=measured,
                      network_bandwidth={"w1": 5e9})
    assert given.link("cuda1", "cuda2")[:2] == ("peer", 60e9)
    assert given.link("w1.cuda0", "cuda0")[:2] == ("network", 5e9)
    slow = given.hop_s(100 << 20, "cuda0", "w1.cuda0")
    assert slow > given.hop_s(100 << 20, "cuda0", "cuda1")
    with pytest.raises(PlacementError, match="invalid network bandwidth"):
        CostModel(inv.devices, {}, {}, network_bandwidth=0)


def test_a_slow_host_staged_link_makes_the_plain_split_slower():
    """The split's hops are priced on the pair's link: a slow host-staged link costs
    more than a peer one."""
    model = info(16)
    fast = run("cuda0=12GiB,cuda1=12GiB", {"diffusion": model}, host_budget=2 * GiB,
               peer_bandwidth=50e9)
    slow = run("cuda0=12GiB,cuda1=12GiB", {"diffusion": model}, host_budget=2 * GiB,
               bandwidth={"gpu": 1e9})
    assert fitted(slow)["transfer_s"] > fitted(fast)["transfer_s"]
    links = fast.extra["fit"]["cost_model"]["links"]
    assert links["cuda0->cuda1"]["kind"] == "peer"
    assert slow.extra["fit"]["cost_model"]["links"]["cuda0->cuda1"]["kind"] == "host-staged"


@pytest.mark.parametrize("network", [0.125e9, DEFAULT_NETWORK_BANDWIDTH, 12.5e9, 50e9])
def test_a_remote_range_only_when_predicted_faster(network):
    """A 16 GiB model, a local 12 GiB GPU and a worker's 24 GiB GPU: a layer split with a
    range on the worker is chosen only when the network's hops price faster than
    streaming locally; never when slower."""
    model = info(16)
    with_remote = run("cuda0=12GiB,w1.cuda0=24GiB", {"diffusion": model},
                      network_bandwidth=network)
    local = run("cuda0=12GiB", {"diffusion": model})
    cp = with_remote.components["diffusion"]
    remote = "w1.cuda0" in cp.runtime
    t_remote = with_remote.extra["fit"]["predicted"]["generation_s"]
    t_local = local.extra["fit"]["predicted"]["generation_s"]
    if remote:
        assert cp.runtime[0] == "cuda0" and cp.stream is None and cp.parallel == "none"
        assert t_remote < t_local
        assert with_remote.extra["fit"]["cost_model"]["links"]["cuda0->w1.cuda0"][
            "kind"] == "network"
    else:
        assert cp.runtime == ["cuda0"]
        assert t_remote == pytest.approx(t_local)
    if network <= 0.125e9:
        assert not remote            # 1 Gbit/s: the hops cost more than streaming
    if network >= 12.5e9:
        assert remote                # 100 Gbit/s: the worker's GPU holds its range


def test_remote_devices_never_hold_whole_components_or_batch_shares():
    infos = {"diffusion": info(8), "te": ComponentInfo(
        "te", 4 * GiB, tuple(BlockInfo(f"b.{i}", GiB, "b", i) for i in range(4)),
        arch="test", dtype="bf16", headroom_bytes=GiB)}
    p = run("cuda0=12GiB,w1.cuda0=80GiB,w1.cuda1=80GiB", infos, cond_batch=2,
            network_bandwidth=100e9)
    for cp in p.components.values():
        if cp.present:
            assert cp.runtime[0] == "cuda0" and cp.parallel != "batch"

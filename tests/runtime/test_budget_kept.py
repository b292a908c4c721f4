"""Every budget kept (issue 29 item 1), through the Python API: explicit plans leave each
device room for the working memory and a margin, split ranges follow each device's room,
the host's range is counted, a plan that cannot keep a budget is refused by plan() in
one line, and place() sizes itself from the first call, rehearsed, before any weight
moves. Device sizes come from the model's bytes and the plan's own working memory."""
import pytest
import torch

from comfyui_placement import PlacementSpec, place, plan
from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo
from comfyui_placement.placement.room import MARGIN, device_room, margin_for
from comfyui_placement.placement.units import GiB, MiB
from comfyui_placement.runtime.footprint import module_sizes

RES = (128, 128)        # the latent the test feeds (16x16 latent pixels, 8 px each)


def sd3():
    """A diffusers SD3 transformer of about 14 MiB (six 2.4 MiB blocks)."""
    from diffusers import SD3Transformer2DModel
    torch.manual_seed(0)
    m = SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=4, num_layers=6,
                              attention_head_dim=32, num_attention_heads=4,
                              joint_attention_dim=64, caption_projection_dim=128,
                              pooled_projection_dim=64, out_channels=4,
                              pos_embed_max_size=32).eval()
    g = torch.Generator().manual_seed(1)
    inp = dict(hidden_states=torch.randn(1, 4, 16, 16, generator=g),
               encoder_hidden_states=torch.randn(1, 8, 64, generator=g),
               pooled_projections=torch.randn(1, 64, generator=g),
               timestep=torch.tensor([3.0]), return_dict=False)
    return m, inp


@pytest.fixture(scope="module")
def model():
    m, inp = sd3()
    with torch.no_grad():
        ref = m(**inp)[0]
    return m, inp, ref


def work_of(m, inv_text):
    """The working memory an explicit plan reserves for `m` at RES on that inventory."""
    p = plan(PlacementSpec(backend="diffusion=cuda0"), Inventory.simulated(inv_text),
             {"diffusion": m}, resolution=RES)
    return p.components["diffusion"].headroom_bytes


def run_placed(m, inp, p, inv, **options):
    with torch.no_grad(), place(m, p, "diffusion", inv, **options) as placed:
        out = m(**inp)[0]
    return out, placed.stats()


def within_rooms(p, stats):
    for name, dev in stats["devices"].items():
        assert dev["peak_bytes"] <= dev["capacity_bytes"] <= p.device(name).room_bytes, name
        assert p.device(name).planned_bytes <= p.device(name).room_bytes, name


def test_one_room_rule_and_its_margin():
    inv = Inventory.simulated("cuda0=24GiB,cuda1=4GiB/3GiB@margin=0,cuda2=8MiB")
    c0, c1, c2 = inv.get("cuda0"), inv.get("cuda1"), inv.get("cuda2")
    assert margin_for(c0) == MARGIN and margin_for(c0, budget=4 * GiB) == 256 * MiB
    assert margin_for(c1) == 0 and margin_for(c2) == 512 << 10
    assert device_room(None, 24 * GiB, MARGIN) == 24 * GiB - MARGIN
    assert device_room(6 * GiB, 3 * GiB, 0) == 3 * GiB              # capped by free memory
    assert device_room(8 * GiB, 1 * GiB, 0, host=True) == 8 * GiB   # the host: as given
    p = plan(PlacementSpec(backend="cuda0", max_vram="cuda0=4"), inv)
    assert p.device("cuda0").margin_bytes == 256 * MiB
    assert p.device("cuda0").room_bytes == 4 * GiB - 256 * MiB
    assert p.to_dict()["devices"][0]["room_bytes"] == 4 * GiB - 256 * MiB
    with pytest.raises(PlacementError, match="at most one workspace=SIZE and one margin"):
        Inventory.simulated("cuda0=8GiB@margin=1MiB@margin=2MiB")


def test_streamed_at_the_whole_memory_runs_inside_it(model):
    m, inp, ref = model
    nb, sizes = module_sizes(m)
    work = work_of(m, "cuda0=1GiB@workspace=0")
    # the weights alone would fill the device: the old plan kept no room beside them
    total = nb + 2 * max(sizes) + work
    inv_text = f"cuda0={(total * 16) // 15 + 4096}b@workspace=0"
    inv = Inventory.simulated(inv_text)
    assert nb + sum(sizes) > inv.get("cuda0").free_bytes - work
    for params in ("cpu",):
        p = plan(PlacementSpec(backend="diffusion=cuda0", params_backend=f"diffusion={params}",
                               stream_layers=True), inv, {"diffusion": m}, resolution=RES)
        assert p.components["diffusion"].headroom_bytes == work
        out, stats = run_placed(m, inp, p, inv)
        assert torch.equal(out, ref)
        within_rooms(p, stats)
        assert stats["devices"]["cuda0"]["working_peak_bytes"] <= work


def test_disk_residency_at_the_whole_memory_runs_inside_it(model, tmp_path):
    from safetensors.torch import save_file
    m, inp, ref = model
    path = tmp_path / "sd3.safetensors"
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(path))
    nb, sizes = module_sizes(m)
    work = work_of(m, "cuda0=1GiB@workspace=0")
    inv = Inventory.simulated(f"cuda0={((nb + 2 * max(sizes) + work) * 16) // 15 + 4096}b"
                              f"@workspace=0")
    p = plan(PlacementSpec(backend="diffusion=cuda0", params_backend="diffusion=disk",
                           stream_layers=True), inv, {"diffusion": m}, resolution=RES)
    out, stats = run_placed(m, inp, p, inv, weights_file=str(path))
    assert torch.equal(out, ref)
    within_rooms(p, stats)


def test_layer_split_ranges_follow_each_devices_room(model):
    m, inp, ref = model
    nb, sizes = module_sizes(m)
    work = work_of(m, "cuda0=1GiB@workspace=0")
    whole = nb + sum(sizes)
    # two devices each too small for the model, together big enough with the working
    # memory and the margin on each: the ranges are cut to fit, not in bare proportion
    each = ((whole * 6 // 10 + work + nb) * 16) // 15
    inv = Inventory.simulated(f"cuda0={each}b@workspace=0,cuda1={each}b@workspace=0")
    p = plan(PlacementSpec(backend="diffusion=cuda0&cuda1"), inv, {"diffusion": m},
             resolution=RES)
    cp = p.components["diffusion"]
    assert set(cp.blocks) == {"cuda0", "cuda1"}
    assert any("to fit each device's room" in r for r in cp.reasons)
    out, stats = run_placed(m, inp, p, inv)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
    within_rooms(p, stats)
    assert stats["hops"] >= 2


def test_a_plan_that_cannot_keep_its_budget_is_refused_in_one_line(model):
    m, _, _ = model
    nb, sizes = module_sizes(m)
    work = work_of(m, "cuda0=1GiB@workspace=0")
    small = Inventory.simulated(f"cuda0={nb + 2 * max(sizes) + work // 2}b@workspace=0")
    with pytest.raises(PlacementError) as err:
        plan(PlacementSpec(backend="diffusion=cuda0", stream_layers=True), small,
             {"diffusion": m}, resolution=RES)
    line = str(err.value)
    assert "\n" not in line and line.startswith("cuda0: diffusion needs ")
    assert "of working memory for diffusion" in line and "short by" in line


def flux_dev_like():
    """Flux.1-dev's shape: 19 double blocks of 324 MiB, 38 single blocks of 162 MiB."""
    blocks = tuple(BlockInfo(f"double_blocks.{i}", 324 * MiB, "double_blocks", i)
                   for i in range(19)) + \
        tuple(BlockInfo(f"single_blocks.{i}", 162 * MiB, "single_blocks", i)
              for i in range(38))
    total = sum(b.nbytes for b in blocks) + 500 * MiB
    return ComponentInfo("diffusion", total, blocks, arch="flux", dtype="bf16",
                         headroom_bytes=800 * MiB, workspace_bytes=256 * MiB,
                         headroom_basis="test")


def test_a_split_over_a_gpu_and_the_host_counts_the_hosts_range():
    info = flux_dev_like()
    for cpu in ("32GiB", "24GiB"):
        inv = Inventory.simulated(f"cuda0=8GiB,cpu={cpu}")
        p = plan(PlacementSpec(backend="diffusion=cuda0&cpu", params_backend="diffusion=cpu"),
                 inv, {"diffusion": info})
        cp = p.components["diffusion"]
        first, last = cp.blocks["cpu"]
        host_range = sum(b.nbytes for b in info.blocks[first:last + 1])
        # the host holds its range (a copy the runtime makes) beside the resting weights
        assert p.device("cpu").planned_bytes >= host_range + info.total_bytes
        g0, g1 = cp.blocks["cuda0"]
        on_gpu = sum(b.nbytes for b in info.blocks[g0:g1 + 1]) + 500 * MiB + 800 * MiB
        assert on_gpu <= p.device("cuda0").room_bytes == 8 * GiB - 512 * MiB
        assert p.device("cuda0").planned_bytes <= p.device("cuda0").room_bytes


def test_place_sizes_itself_from_the_first_call_before_any_weight_moves(model):
    m, inp, ref = model
    nb, sizes = module_sizes(m)
    # a plan that keeps all but one block resident and no working memory (a hand-made
    # plan, as for an architecture nobody estimated): the first call's rehearsal shows
    # the prefix leaves too little room, and the prefix shrinks before anything moves
    from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan, StreamPlan
    room = nb + sum(sizes) + 1024              # prefix n-1 + a one-block ring: all of it
    dev = DevicePlan("cuda0", "gpu", 1 << 30, 1 << 30, room)
    p = Plan([dev], {"diffusion": ComponentPlan("diffusion", ["cuda0"], "cpu",
                                                stream=StreamPlan(len(sizes) - 1, 0))})
    inv = Inventory.simulated("cuda0=1GiB@workspace=0")
    out, stats = run_placed(m, inp, p, inv)
    assert torch.equal(out, ref)
    [record] = [f for f in stats["fallbacks"] if f["kind"] == "plan_rederived"]
    assert record["planned"]["resident"] == len(sizes) - 1
    assert record["ran"]["resident"] < len(sizes) - 1
    wm = stats["working_memory"]["cuda0"]
    assert wm["planned_bytes"] == 0 and wm["rehearsed_bytes"] > 0
    dev = stats["devices"]["cuda0"]
    assert dev["peak_bytes"] <= dev["capacity_bytes"]
    # the rehearsal measures what the simulated device meters, within 10%
    assert abs(dev["working_peak_bytes"] - wm["rehearsed_bytes"]) <= \
        0.1 * wm["rehearsed_bytes"]


def test_a_first_call_that_cannot_fit_is_refused_before_any_weight_moves(model):
    m, inp, _ = model
    nb, sizes = module_sizes(m)
    from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan, StreamPlan
    room = nb + 2 * max(sizes) + 1024          # the ring fits, the working memory not
    p = Plan([DevicePlan("cuda0", "gpu", 1 << 30, 1 << 30, room)],
             {"diffusion": ComponentPlan("diffusion", ["cuda0"], "cpu",
                                         stream=StreamPlan(0, 1))})
    inv = Inventory.simulated("cuda0=1GiB@workspace=0")
    before = {k: v.clone() for k, v in m.state_dict().items()}
    placed = place(m, p, "diffusion", inv)
    with pytest.raises(PlacementError, match=r"rehearsed from the first call") as err:
        with torch.no_grad(), placed:
            m(**inp)
    assert "\n" not in str(err.value)
    assert placed.stats()["devices"]["cuda0"]["h2d_bytes"] == 0      # nothing was copied
    after = m.state_dict()
    assert all(torch.equal(after[k], v) and after[k].device == v.device
               for k, v in before.items())

"""`parallel pipeline` asked by the user (a `parallel` value, or `pipeline` as a split mode
meaning split mode layer + parallel pipeline): parsed, put in an explicit plan with its
layer ranges, honoured by auto-fit, refused in one line where it cannot be, and run by
runtime.place as a PipelinedSplit."""
import pytest
import torch

from comfyui_placement.placement import Inventory, PlacementSpec, plan
from comfyui_placement.placement.capabilities import needs
from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo
from comfyui_placement.placement.plan import Plan

GiB = 1 << 30
INV = "cuda0=8GiB,cuda1=8GiB,cpu=32GiB"


def info(size_gib, n=20, headroom=GiB):
    block = int(size_gib * GiB) // n
    blocks = tuple(BlockInfo(f"blocks.{i}", block, "blocks", i) for i in range(n))
    return ComponentInfo("diffusion", block * n, blocks, arch="test", dtype="bf16",
                         headroom_bytes=headroom)


def one_line_error(call, match):
    with pytest.raises(PlacementError, match=match) as got:
        call()
    assert "\n" not in str(got.value)
    return str(got.value)


# -- the spec ------------------------------------------------------------------------------

@pytest.mark.parametrize("fields,split", [
    ({"parallel": "diffusion=pipeline"}, None),
    ({"parallel": "DIFFUSION = Pipeline"}, None),
    ({"parallel": "diffusion=pipeline", "split_mode": "diffusion=layer"}, "layer"),
    ({"split_mode": "diffusion=pipeline"}, "layer"),
    ({"split_mode": "pipeline"}, "layer"),
    ({"parallel": "pipeline", "split_mode": "layer"}, "layer"),
    ({"split_mode": "diffusion=pipeline", "parallel": "diffusion=pipeline"}, "layer"),
])
def test_pipeline_is_accepted_both_ways(fields, split):
    spec = PlacementSpec(**fields)
    assert spec.parallelism.for_component("diffusion") == "pipeline"
    assert spec.split.for_component("diffusion") == split     # a layer split (or the default)
    assert PlacementSpec.from_dict(spec.to_dict()) == spec


def test_a_modules_own_split_mode_beats_a_default_pipeline():
    spec = PlacementSpec(split_mode="pipeline,te=row")
    assert spec.parallelism.for_component("diffusion") == "pipeline"
    assert spec.split.for_component("te") == "row"
    assert spec.parallelism.for_component("te") == "none"
    # the other parallel values are untouched
    assert PlacementSpec(parallel="diffusion=batch").parallelism.for_component(
        "diffusion") == "batch"
    assert PlacementSpec(parallel="none").parallelism.for_component("diffusion") == "none"


@pytest.mark.parametrize("fields,match", [
    ({"parallel": "pipe"}, "invalid parallel 'pipe'; expected none, batch or pipeline$"),
    ({"parallel": "diffusion=tensor"}, "invalid parallel 'tensor'; expected none, batch or "
                                       "pipeline"),
    ({"split_mode": "diffusion=pipe"}, "invalid split mode 'pipe'; expected layer or row, or "
                                       "batch .* or pipeline"),
    ({"split_mode": "diffusion=row", "parallel": "diffusion=pipeline"},
     "diffusion: split_mode row and parallel pipeline both set; .* a row split has none"),
    ({"split_mode": "row", "parallel": "pipeline"}, "split_mode row and parallel pipeline"),
    ({"split_mode": "te=row", "parallel": "pipeline"}, "^te: split_mode row and parallel "
                                                       "pipeline"),
    ({"split_mode": "diffusion=pipeline", "parallel": "diffusion=batch"},
     "diffusion: split_mode pipeline and parallel batch both set"),
    ({"split_mode": "diffusion=pipeline", "parallel": "diffusion=none"},
     "diffusion: split_mode pipeline and parallel none both set"),
    ({"split_mode": "pipeline", "parallel": "none"},
     "split_mode pipeline and parallel none both set as the default"),
])
def test_bad_values_are_one_line_errors(fields, match):
    one_line_error(lambda: PlacementSpec(**fields), match)


# -- explicit plans ------------------------------------------------------------------------

def test_explicit_plan_gets_parallel_pipeline_with_its_ranges():
    inv = Inventory.simulated(INV)
    p = plan(PlacementSpec(backend="diffusion=cuda0&cuda1", parallel="diffusion=pipeline",
                           max_vram="cuda0=3,cuda1=2.5"),
             inv, {"diffusion": info(2)})
    cp = p.components["diffusion"]
    assert cp.parallel == "pipeline" and cp.split_mode == "layer"
    assert cp.runtime == ["cuda0", "cuda1"] and cp.params == "cuda0"
    # ranges as for any layer split: in proportion to the budgets, contiguous, all blocks
    assert set(cp.blocks) == {"cuda0", "cuda1"}
    assert cp.blocks["cuda0"][0] == 0 and cp.blocks["cuda1"][1] == 19
    assert cp.blocks["cuda1"][0] == cp.blocks["cuda0"][1] + 1
    assert cp.blocks["cuda0"][1] + 1 > 20 - cp.blocks["cuda1"][0]   # the larger budget
    assert any(r.startswith("pipelined layer split over cuda0, cuda1") for r in cp.reasons)
    assert "pipeline_split" in needs(cp, inv) and "layer_split" in needs(cp, inv)
    row = next(line for line in p.report().splitlines() if line.startswith("diffusion"))
    assert " pipeline " in row                                # the split column says so
    again = Plan.from_json(p.to_json())
    assert again.components["diffusion"].parallel == "pipeline"
    assert again.components["diffusion"].blocks == cp.blocks
    assert p.components["te"].parallel == "none"
    # each range leaves its device the 1 GiB of working memory and the margin
    for d in ("cuda0", "cuda1"):
        dev = p.device(d)
        assert dev.planned_bytes <= dev.room_bytes < dev.budget_bytes
        assert dev.planned_bytes == sum(info(2).blocks[0].nbytes for _ in range(
            cp.blocks[d][0], cp.blocks[d][1] + 1)) + GiB
    assert not p.warnings
    # the split-mode form gives the same plan
    same = plan(PlacementSpec(backend="diffusion=cuda0&cuda1", split_mode="diffusion=pipeline",
                              max_vram="cuda0=3,cuda1=2.5"), inv, {"diffusion": info(2)})
    assert same.to_json() == p.to_json()
    # budgets whose ranges would leave no room for the working memory are refused
    with pytest.raises(PlacementError, match=r"^cuda0: diffusion needs .* working memory"):
        plan(PlacementSpec(backend="diffusion=cuda0&cuda1", parallel="diffusion=pipeline",
                           max_vram="cuda0=3,cuda1=1"), inv, {"diffusion": info(2)})


def test_explicit_pipeline_streams_like_any_layer_split():
    inv = Inventory.simulated(INV)
    p = plan(PlacementSpec(backend="diffusion=cuda0&cuda1", parallel="diffusion=pipeline",
                           stream_layers=True), inv, {"diffusion": info(2)})
    cp = p.components["diffusion"]
    assert cp.parallel == "pipeline" and cp.params == "cpu" and cp.stream is not None
    assert "split_stream" in needs(cp, inv)


def test_explicit_refusals_are_one_line():
    inv = Inventory.simulated(INV)
    msg = one_line_error(
        lambda: plan(PlacementSpec(backend="diffusion=cuda0", parallel="diffusion=pipeline"),
                     inv, {"diffusion": info(2)}),
        "diffusion: parallel pipeline needs two or more runtime devices")
    assert "backend gives cuda0;" in msg and "diffusion=cuda0&cuda1" in msg
    # unset backend: one device (the first GPU)
    one_line_error(lambda: plan(PlacementSpec(parallel="diffusion=pipeline"), inv),
                   "two or more runtime devices")
    one_line_error(
        lambda: plan(PlacementSpec(backend="diffusion=cuda0&cuda1", split_mode="diffusion=row",
                                   parallel="diffusion=pipeline"), inv),
        "split_mode row and parallel pipeline both set")
    # inside ComfyUI only the diffusion model runs a pipeline
    one_line_error(
        lambda: plan(PlacementSpec(backend="te=cuda0&cuda1", parallel="te=pipeline"), inv,
                     executor="comfyui"),
        "pipelined layer split")
    p = plan(PlacementSpec(backend="diffusion=cuda0&cuda1", parallel="diffusion=pipeline"),
             inv, executor="comfyui")
    assert p.components["diffusion"].parallel == "pipeline"


def test_a_pipeline_of_one_stage_is_said():
    inv = Inventory.simulated(INV)
    p = plan(PlacementSpec(backend="diffusion=cuda0&cuda1", parallel="diffusion=pipeline"),
             inv, {"diffusion": info(1, n=1)})
    assert p.components["diffusion"].parallel == "pipeline"
    assert any("parallel pipeline has one stage" in w for w in p.warnings)


# -- auto-fit ------------------------------------------------------------------------------

def fitted(p):
    return p.extra["fit"]["components"]["diffusion"]


def test_auto_fit_honours_a_forced_pipeline_where_batch_parallel_would_win():
    inv = Inventory.simulated("cuda0=24GiB,cuda1=24GiB,cpu=64GiB")
    d = {"diffusion": info(8)}
    free = plan(PlacementSpec(auto_fit=True), inv, d, cond_batch=2)
    assert free.components["diffusion"].parallel == "batch"       # unasked: batch wins
    for spec in (PlacementSpec(auto_fit=True, parallel="diffusion=pipeline"),
                 PlacementSpec(auto_fit=True, split_mode="diffusion=pipeline")):
        p = plan(spec, inv, d, cond_batch=2)
        cp = p.components["diffusion"]
        assert cp.parallel == "pipeline" and cp.split_mode == "layer", cp.reasons
        assert cp.runtime == ["cuda0", "cuda1"] and set(cp.blocks) == {"cuda0", "cuda1"}
        assert cp.stream is None
        assert fitted(p)["parallel"] == "pipeline"
        assert set(fitted(p)["alternatives_forward_s"]) == {"pipelined split"}
        assert fitted(p)["forward_s"] < fitted(p)["serial_forward_s"]    # batch of 2 gains
        assert any(r.startswith("parallel pipeline asked -> layer split over cuda0&cuda1")
                   for r in cp.reasons)
        assert any(r.startswith("parallel pipeline asked; batch of 2 per forward -> "
                                "pipelined") for r in cp.reasons)


def test_auto_fit_forced_pipeline_on_named_devices_and_presets():
    inv = Inventory.simulated("cuda0=24GiB,cuda1=24GiB,cuda2=24GiB,cpu=64GiB")
    d = {"diffusion": info(8)}
    p = plan(PlacementSpec(auto_fit=True, backend="diffusion=cuda1&cuda2",
                           parallel="diffusion=pipeline"), inv, d, cond_batch=2)
    cp = p.components["diffusion"]
    assert cp.parallel == "pipeline" and cp.runtime == ["cuda1", "cuda2"]
    # presets that take turns whole still get a (turn-taking) pipelined split
    for mode in ("model", "sequential"):
        p = plan(PlacementSpec(auto_fit=True, parallel="diffusion=pipeline", offload_mode=mode),
                 inv, d, cond_batch=2)
        cp = p.components["diffusion"]
        assert cp.parallel == "pipeline" and len(cp.runtime) >= 2 and cp.params == "cpu"
        assert cp.stream is None
    # a batch of 1: kept (the runtime runs it as the plain split), said so
    p = plan(PlacementSpec(auto_fit=True, parallel="diffusion=pipeline"), inv, d, cond_batch=1)
    cp = p.components["diffusion"]
    assert cp.parallel == "pipeline"
    assert any("batch of 1 per forward -> pipelined, run as the plain split" in r
               for r in cp.reasons)


def test_auto_fit_refuses_a_forced_pipeline_in_one_line():
    d = {"diffusion": info(8)}
    one = Inventory.simulated("cuda0=24GiB,cpu=64GiB")
    one_line_error(lambda: plan(PlacementSpec(auto_fit=True, parallel="diffusion=pipeline"),
                                one, d, cond_batch=2),
                   "diffusion: parallel pipeline needs two or more GPUs and the inventory "
                   "has 1;")
    two = Inventory.simulated("cuda0=24GiB,cuda1=24GiB,cpu=64GiB")
    one_line_error(lambda: plan(PlacementSpec(auto_fit=True, backend="diffusion=cuda0",
                                              parallel="diffusion=pipeline"), two, d),
                   "diffusion: parallel pipeline needs two or more GPUs and the backend "
                   "gives cuda0;")
    one_line_error(lambda: plan(PlacementSpec(auto_fit=True, backend="diffusion=cuda0&cpu",
                                              parallel="diffusion=pipeline"), two, d),
                   "needs two or more GPUs and the backend gives cuda0&cpu")
    one_line_error(lambda: plan(PlacementSpec(auto_fit=True, parallel="diffusion=pipeline",
                                              params_backend="diffusion=cuda1"), two, d),
                   "params cuda1 is not one of them")
    one_line_error(lambda: plan(PlacementSpec(auto_fit=True, parallel="diffusion=pipeline"),
                                two, {"diffusion": info(1, n=1)}),
                   "needs two or more blocks")
    # too big for the GPUs together: a streamed split is not pipelined
    small = Inventory.simulated("cuda0=3GiB,cuda1=3GiB,cpu=64GiB")
    msg = one_line_error(
        lambda: plan(PlacementSpec(auto_fit=True, parallel="diffusion=pipeline"), small, d,
                     cond_batch=2),
        "auto-fit: diffusion: parallel pipeline over cuda0&cuda1 holds the whole diffusion")
    assert "short by" in msg and "drop parallel pipeline" in msg
    # unasked, the same inventory fits by streaming: the refusal is the pipeline's
    free = plan(PlacementSpec(auto_fit=True), small, d, cond_batch=2).components["diffusion"]
    assert free.parallel != "pipeline" and free.stream is not None
    # inside ComfyUI only the diffusion model is pipelined
    te = ComponentInfo("te", 4 * GiB, tuple(BlockInfo(f"blocks.{i}", GiB // 5, "blocks", i)
                                            for i in range(20)), arch="test", dtype="bf16")
    one_line_error(lambda: plan(PlacementSpec(auto_fit=True, parallel="te=pipeline"), two,
                                {"te": te}, executor="comfyui"),
                   "te: parallel pipeline is not run by this executor for te")


def test_parallel_none_still_forbids_the_pipeline():
    inv = Inventory.simulated("cuda0=5GiB,cuda1=5GiB,cpu=64GiB")
    p = plan(PlacementSpec(auto_fit=True, parallel="diffusion=none"), inv,
             {"diffusion": info(8)}, cond_batch=2)
    assert p.components["diffusion"].parallel == "none"


# -- it runs -------------------------------------------------------------------------------

def _tiny_flux():
    from diffusers import FluxTransformer2DModel
    torch.manual_seed(0)
    m = FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=2, num_single_layers=3,
                               attention_head_dim=16, num_attention_heads=2,
                               joint_attention_dim=32, pooled_projection_dim=16,
                               axes_dims_rope=(4, 6, 6)).eval()
    g = torch.Generator().manual_seed(1)
    L, T, B = 16, 8, 2
    inp = dict(hidden_states=torch.randn(B, L, 8, generator=g),
               encoder_hidden_states=torch.randn(B, T, 32, generator=g),
               pooled_projections=torch.randn(B, 16, generator=g),
               timestep=torch.tensor([0.5, 0.25]),
               img_ids=torch.zeros(L, 3), txt_ids=torch.zeros(T, 3), return_dict=False)
    return m, inp


def test_an_asked_pipeline_runs_under_runtime_place():
    from comfyui_placement.runtime import place
    from comfyui_placement.runtime.split.pipeline import PipelinedSplit
    module, inp = _tiny_flux()
    # no kernel workspace on the simulated devices; the working memory planned at the
    # size this test runs (16 image tokens of 16 px)
    inv = Inventory.simulated("cuda0=64MiB@workspace=0,cuda1=64MiB@workspace=0")
    p = plan(PlacementSpec(backend="diffusion=cuda0&cuda1", parallel="diffusion=pipeline"),
             inv, {"diffusion": module}, resolution=(64, 64))
    cp = p.components["diffusion"]
    assert cp.parallel == "pipeline" and set(cp.blocks) == {"cuda0", "cuda1"}
    with torch.no_grad():
        ref = module(**inp)[0]
    before = {k: (v.device, v.data_ptr()) for k, v in module.state_dict().items()}
    with place(module, p, "diffusion", inv) as placed:
        assert isinstance(placed, PipelinedSplit)
        with torch.no_grad():
            out = module(**inp)[0]
        stats = placed.stats()
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
    assert stats["pipeline"] == {"shares": 2, "forwards": 1}
    assert stats["ranges"] == {d: list(r) for d, r in cp.blocks.items()}
    assert all(stats["devices"][d]["peak_bytes"] > 0 for d in ("cuda0", "cuda1"))
    assert {k: (v.device, v.data_ptr()) for k, v in module.state_dict().items()} == before


def test_cli_split_mode_pipeline():
    import json
    import subprocess
    import sys

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "comfyui_placement", *args],
                              capture_output=True, text=True, timeout=120)
    sim = ("--simulate", "cuda0=8GiB,cuda1=8GiB")
    ok = cli("plan", "--backend", "diffusion=cuda0&cuda1", "--split-mode",
             "diffusion=pipeline", "--json", *sim)
    assert ok.returncode == 0, ok.stderr
    cp = json.loads(ok.stdout)["components"]["diffusion"]
    assert cp["parallel"] == "pipeline" and cp["split_mode"] == "layer"
    assert cp["runtime"] == ["cuda0", "cuda1"]
    bad = cli("plan", "--backend", "diffusion=cuda0&cuda1", "--split-mode", "diffusion=pipe",
              *sim)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "or pipeline" in bad.stderr

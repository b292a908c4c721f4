"""Every plan runs (issue 10 item 2): over random placement requests x simulated
inventories x tiny real architectures (diffusers configs, random weights), `plan()`
either returns a plan that `place()` executes (a forward on the simulated devices,
output equal to the plain module's) or raises a one-line PlacementError.

An explicit plan is the user's own: when it overruns a budget `plan()` says so in its
warnings, and then an out-of-memory from `place()` is the outcome the user was told
about. An auto-fit plan carries no such excuse: it must run.
"""
import warnings

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings, strategies as st
from safetensors.torch import save_file

from comfyui_placement.placement import Inventory, PlacementError, PlacementSpec, plan
from comfyui_placement.runtime import place

KiB = 1024


def _flux():
    from diffusers import FluxTransformer2DModel
    m = FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=2, num_single_layers=3,
                               attention_head_dim=16, num_attention_heads=2,
                               joint_attention_dim=32, pooled_projection_dim=16,
                               axes_dims_rope=(4, 6, 6))
    L, T = 16, 8
    inp = dict(hidden_states=torch.randn(1, L, 8), encoder_hidden_states=torch.randn(1, T, 32),
               pooled_projections=torch.randn(1, 16), timestep=torch.tensor([0.5]),
               img_ids=torch.zeros(L, 3), txt_ids=torch.zeros(T, 3), return_dict=False)
    return m, inp


def _sd3():
    from diffusers import SD3Transformer2DModel
    m = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=3,
                              attention_head_dim=8, num_attention_heads=2,
                              joint_attention_dim=16, caption_projection_dim=16,
                              pooled_projection_dim=16, out_channels=4, pos_embed_max_size=16)
    inp = dict(hidden_states=torch.randn(1, 4, 8, 8), encoder_hidden_states=torch.randn(1, 5, 16),
               pooled_projections=torch.randn(1, 16), timestep=torch.tensor([3.0]),
               return_dict=False)
    return m, inp


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """arch -> (module, inputs, reference output, weights file, weight bytes)."""
    out = {}
    d = tmp_path_factory.mktemp("weights")
    for arch, build in (("flux", _flux), ("sd3", _sd3)):
        torch.manual_seed(0)
        m, inp = build()
        m.eval()
        with torch.no_grad():
            ref = m(**inp)[0]
        path = d / f"{arch}.safetensors"
        save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(path))
        size = sum(p.numel() * p.element_size() for p in m.parameters())
        out[arch] = (m, inp, ref, str(path), size)
    return out


backends = st.sampled_from([None, "cuda0", "cuda1", "cuda0&cuda1", "cpu"])
params = st.sampled_from([None, "cpu", "disk", "cuda0"])
splits = st.sampled_from([None, "layer", "row"])
offload = st.sampled_from(["auto", "none", "model", "sequential"])
# GPU sizes as multiples of the model's weight bytes: too small, tight, roomy
fractions = st.sampled_from([0.3, 0.6, 0.9, 1.2, 3.0])


def _spec(backend, param, split, stream, auto, mode):
    kw = {"stream_layers": stream, "auto_fit": auto}
    if backend:
        kw["backend"] = f"diffusion={backend}"
    if param:
        kw["params_backend"] = f"diffusion={param}"
    if split:
        kw["split_mode"] = split
    if auto:
        kw["offload_mode"] = mode
    return PlacementSpec(**kw)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@example(arch="sd3", backend="cuda0&cuda1", param=None, split=None, stream=False, auto=True,
         mode="auto", f0=0.3, f1=0.9, host=None)   # cuda0: non-block weights only
@given(arch=st.sampled_from(["flux", "sd3"]), backend=backends, param=params, split=splits,
       stream=st.booleans(), auto=st.booleans(), mode=offload, f0=fractions, f1=fractions,
       host=st.sampled_from([None, 0.5, 1.5]))
def test_plan_returns_then_place_runs(models, arch, backend, param, split, stream, auto, mode,
                                      f0, f1, host):
    module, inp, ref, path, size = models[arch]
    # host RAM: plenty, or too little for the weights, so that auto-fit rests some or all
    # of them on disk (stream.host_blocks)
    cpu = "64GiB" if host is None else f"{int(size * host / KiB) + 1}KiB"
    inv = Inventory.simulated(f"cuda0={int(size * f0 / KiB) + 256}KiB,"
                              f"cuda1={int(size * f1 / KiB) + 256}KiB,cpu={cpu}")
    try:
        spec = _spec(backend, param, split, stream, auto, mode)
        # a tiny model's working memory is small, but not nothing; no margins (they are
        # sized for real GPUs and would leave these tiny ones no budget)
        fit_options = {"headroom": {"diffusion": 128 * KiB}, "budget_margin": 0,
                       "host_margin": 0} if auto else {}
        p = plan(spec, inv, {"diffusion": module}, resolution=(64, 64), **fit_options)
    except PlacementError as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    cp = p.components["diffusion"]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with place(module, p, "diffusion", inv, weights_file=path):
                with torch.no_grad():
                    out = module(**inp)[0]
    except Exception as exc:        # noqa: BLE001  (the property: nothing but a told overrun)
        # an explicit plan's weights are checked by plan() with the runtime's arithmetic
        # (a refusal above); what it cannot know is the working memory of the forward,
        # which it warns about: running out of that, and only that, is the told outcome
        # (host RAM the runtime computes in, row shards: refused by plan() as well)
        told = [w for w in p.warnings if "working memory" in w]
        working = isinstance(exc, torch.OutOfMemoryError) and (
            "computed there" in str(exc) or "forward inputs" in str(exc))
        assert not auto and told and working, (
            f"plan for {cp.runtime} params={cp.params} split={cp.split_mode} "
            f"stream={cp.stream} did not run: {type(exc).__name__}: {exc}")
        return
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    # auto-fit's plan runs as planned: the runtime never re-derives its ranges or prefixes
    redone = [str(w.message) for w in caught if "do not match" in str(w.message)
              or "sized from the budget" in str(w.message)]
    assert not auto or not redone, redone


def _flux256():
    """Hidden size 256: its block Linears are large enough for the row split."""
    from diffusers import FluxTransformer2DModel
    m = FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=1, num_single_layers=2,
                               attention_head_dim=128, num_attention_heads=2,
                               joint_attention_dim=32, pooled_projection_dim=16,
                               axes_dims_rope=(32, 48, 48))
    return m, _flux()[1]


@pytest.fixture(scope="module")
def edge_models(models, tmp_path_factory):
    """models, and flux256 (row split shards its Linears; flux and sd3 have none)."""
    out = dict(models)
    torch.manual_seed(0)
    m, inp = _flux256()
    m.eval()
    with torch.no_grad():
        ref = m(**inp)[0]
    path = tmp_path_factory.mktemp("weights256") / "flux256.safetensors"
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(path))
    out["flux256"] = (m, inp, ref, str(path),
                      sum(p.numel() * p.element_size() for p in m.parameters()))
    return out


def _edges(module, split):
    """(bytes the main device holds besides its blocks or shards, the largest block or,
    for a row split, the sharded bytes) as the runtime finds them."""
    from comfyui_placement.runtime.footprint import module_sizes
    nb, sizes = module_sizes(module)
    if split == "row":
        from comfyui_placement.runtime.split.row import eligible_linears, row_shards
        sharded = sum(r * b * n for r, b, n in row_shards(eligible_linears(module)))
        if sharded:
            return nb + sum(sizes) - sharded, sharded // 4
    return nb, max(sizes)


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@example(arch="flux256", backend="cuda0&cuda1", param=None, split="row", stream=False, j0=0,
         j1=3, m0=0.9, m1=1.0, host=0.8)           # cuda0: the unsharded weights, no shard
@example(arch="flux256", backend="cuda0&cuda1", param=None, split="row", stream=False, j0=2,
         j1=1, m0=1.0, m1=1.2, host=0.9)           # the shards outgrow both budgets
@example(arch="sd3", backend="cpu", param="cpu", split=None, stream=False, j0=0, j1=0,
         m0=1.0, m1=1.0, host=0.9)                 # host RAM short of the weights
@given(arch=st.sampled_from(["flux", "sd3", "flux256"]),
       backend=st.sampled_from(["cuda0", "cuda0&cuda1", "cpu"]), param=st.sampled_from(
           [None, "cpu", "disk"]), split=st.sampled_from([None, "row"]), stream=st.booleans(),
       j0=st.integers(0, 4), j1=st.integers(0, 4), m0=st.sampled_from([0.8, 0.9, 1.0, 1.1, 1.2]),
       m1=st.sampled_from([0.8, 1.0, 1.2]), host=st.sampled_from([None, 0.8, 0.9, 1.0, 1.1,
                                                                   1.2]))
def test_explicit_plans_at_edge_budgets(edge_models, arch, backend, param, split, stream, j0,
                                        j1, m0, m1, host):
    """Issue 21 item 4: budgets within about 20% of the non-block weights plus a few of
    the largest blocks (a row split: of its unsharded weights plus quarters of its
    shards), and host RAM within 20% of the weights, where the runtime's arithmetic
    decides: plan() refuses what place() would (in one line), and whatever it accepts
    runs, except for running out of the working memory it warned about."""
    module, inp, ref, path, size = edge_models[arch]
    nb, blk = _edges(module, split)
    # a little room on top (these tiny forwards compute 50-300 KiB): most draws leave
    # too little for the weights or for the working memory, where the runtime decides
    room = 32 * KiB
    b0 = int(nb + j0 * blk * m0) + room
    b1 = int(j1 * blk * m1) + room
    cpu = "64GiB" if host is None else f"{int(size * host) // KiB + 1}KiB"
    inv = Inventory.simulated(f"cuda0={b0 // KiB + 1}KiB,cuda1={b1 // KiB + 1}KiB,cpu={cpu}")
    try:
        p = plan(_spec(backend, param, split, stream, False, "auto"), inv,
                 {"diffusion": module}, resolution=(64, 64))
    except PlacementError as exc:
        msg = str(exc)
        assert "\n" not in msg and ("short by" in msg or "split" in msg), msg
        return
    cp = p.components["diffusion"]
    try:
        with place(module, p, "diffusion", inv, weights_file=path):
            with torch.no_grad():
                out = module(**inp)[0]
    except Exception as exc:        # noqa: BLE001
        # the forward's working memory (its inputs included) is what plan() cannot know
        # exactly: it warns, and running out of it is the told outcome
        told = [w for w in p.warnings if "working memory" in w]
        working = isinstance(exc, torch.OutOfMemoryError) and (
            "computed there" in str(exc) or "forward inputs" in str(exc))
        assert told and working, (
            f"plan() accepted {cp.runtime} params={cp.params} split={cp.split_mode} "
            f"stream={cp.stream} at cuda0={b0}, cuda1={b1}, cpu={cpu} (non-block {nb}, "
            f"block {blk}) and place() refused: {type(exc).__name__}: {exc}")
        return
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def _batched(inp, n):
    """The same inputs with a batch of n (the sequence ids are not batched)."""
    g = torch.Generator().manual_seed(1)
    out = dict(inp)
    for k, v in inp.items():
        if isinstance(v, torch.Tensor) and k not in ("img_ids", "txt_ids"):
            out[k] = torch.randn((n,) + tuple(v.shape[1:]), generator=g) if v.dim() > 1 \
                else v.repeat(n)
    return out


@pytest.mark.parametrize("arch", ["flux", "sd3"])
@pytest.mark.parametrize("parallel", ["batch", "pipeline"])
def test_parallel_plans_auto_fit_chooses_run_with_a_batch_of_2(models, arch, parallel):
    """Issue 13: auto-fit picks batch parallel (each GPU holds the model) or the
    pipelined split (neither does, host RAM too small to stream from) on its own, for
    CFG's batch of 2; runtime.place runs the plan and the output equals the module's."""
    module, inp, _, path, size = models[arch]
    # batch: room for the model and its working memory (128 KiB) on each; pipeline:
    # room for 70% of it and the working memory
    gpu = int(size * 3 / KiB) + 256 if parallel == "batch" else int(size * 0.7 / KiB) + 128
    host = "64GiB" if parallel == "batch" else f"{size // 4 // KiB}KiB"
    inv = Inventory.simulated(f"cuda0={gpu}KiB,cuda1={gpu}KiB,cpu={host}")
    # tiny models compute in nanoseconds at the default speed, where a hop's latency
    # decides; at 1 GFLOP/s their compute dominates as a real model's does
    p = plan(PlacementSpec(auto_fit=True), inv, {"diffusion": module}, resolution=(64, 64),
             headroom={"diffusion": 128 * KiB}, budget_margin=0, host_margin=0, cond_batch=2,
             throughput={"gpu": 1e9, "cpu": 1e8})
    cp = p.components["diffusion"]
    assert cp.parallel == parallel, cp.reasons
    x = _batched(inp, 2)
    with torch.no_grad():
        ref = module(**x)[0]
    with place(module, p, "diffusion", inv, weights_file=path) as placed:
        with torch.no_grad():
            out = module(**x)[0]
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    stats = placed.stats()
    used = [d for d, s in stats["devices"].items() if s.get("peak_bytes", 0) > 0]
    assert {"cuda0", "cuda1"} <= set(used), stats

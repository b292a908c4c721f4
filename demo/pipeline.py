"""The main job on an embedded default: no files, no downloads.

A small Flux-architecture transformer (diffusers' FluxTransformer2DModel at a tiny
config, random weights) is planned for a simulated two-GPU machine whose budgets are
smaller than the model, run under the plan, and compared with an all-resident run.

Simulated GPUs compute on this CPU and copy over a modelled link, so the planner is
given their real speeds: this CPU's achieved FLOP/s, measured briefly on a transformer
MLP of the model's width, and the simulated links' bandwidth. Both runs are timed
alike: the same warm-up forwards, then the median of the same number of timed
forwards, taking turns, on the same single thread.
"""
import copy
import json
import statistics
import textwrap
import time

from ..placement import Inventory, PlacementError, PlacementSpec, plan
from ..placement.fit.costs import TOKENS_PER_MEGAPIXEL
from ..placement.units import format_bytes

INVENTORY = "cuda0=1GiB,cuda1=1GiB,cpu=8GiB"
HIDDEN_HEADS, HEAD_DIM = 4, 64
SIDE, TEXT = 16, 8            # a 16x16 latent (patch 1: 256 image tokens), 8 text tokens
RESOLUTION = (256, 256)       # the image a real Flux sees as 16x16 patched latent tokens
WARMUP, REPS = 1, 5           # per run: warm-up forwards, then timed forwards (median)
# One intra-op thread for everything timed: on a shared machine a second thread's core
# is often busy, and every small op then waits for it (forwards of 1-5 s instead of 50 ms)
THREADS = 1


def build_model():
    try:
        import torch
        from diffusers import FluxTransformer2DModel
    except ImportError as exc:
        raise PlacementError(f"the demo needs torch and diffusers ({exc.name} is missing); "
                             f"install the test extra: pip install -e '.[test]'") from None
    torch.manual_seed(0)
    model = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=6,
        attention_head_dim=HEAD_DIM, num_attention_heads=HIDDEN_HEADS,
        joint_attention_dim=64, pooled_projection_dim=32, axes_dims_rope=(8, 28, 28))
    model.eval().requires_grad_(False)
    inputs = dict(
        hidden_states=torch.randn(1, SIDE * SIDE, 16),
        encoder_hidden_states=torch.randn(1, TEXT, 64),
        pooled_projections=torch.randn(1, 32),
        timestep=torch.tensor([0.5]),
        img_ids=torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(SIDE).float(),
                                           torch.arange(SIDE).float(), indexing="ij"),
                            -1).reshape(-1, 3),
        txt_ids=torch.zeros(TEXT, 3))
    return model, inputs


def measure_flops(seconds: float = 0.15) -> float:
    """This CPU's achieved FLOP/s on a transformer MLP at the model's width and token
    count (layer norm, hidden -> 4 hidden linear, GELU, back, residual add; fp32): what
    a simulated GPU computes at. The median of short rounds."""
    import torch
    import torch.nn.functional as F
    hidden, tokens = HIDDEN_HEADS * HEAD_DIM, SIDE * SIDE + TEXT
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=gen)
    w1 = torch.randn(4 * hidden, hidden, generator=gen) / hidden ** 0.5
    w2 = torch.randn(hidden, 4 * hidden, generator=gen) / (4 * hidden) ** 0.5
    b1, b2 = torch.zeros(4 * hidden), torch.zeros(hidden)

    def mlp():
        h = F.gelu(F.linear(F.layer_norm(x, (hidden,)), w1, b1), approximate="tanh")
        return x + F.linear(h, w2, b2)
    flop = 2.0 * 2 * tokens * hidden * 4 * hidden
    with torch.no_grad():
        mlp()
        rates, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end or len(rates) < 5:
            t0 = time.perf_counter()
            for _ in range(4):
                mlp()
            rates.append(4 * flop / (time.perf_counter() - t0))
    return statistics.median(rates)


def sim_speeds(flops: float, link, hop_link) -> dict:
    """Fit options describing the simulated machine: every device (the simulated GPUs
    and the cpu) computes on this CPU; the GPUs' host links and the hop link are the
    simulated ones."""
    inventory = Inventory.simulated(INVENTORY)
    gpus = [d.name for d in inventory.devices if d.kind != "cpu"]
    return {"throughput": {d.name: flops for d in inventory.devices},
            "bandwidth": {g: link.bandwidth for g in gpus},
            "peer_bandwidth": hop_link.bandwidth}


def timed_alike(forwards, reps: int = REPS):
    """Each forward `reps` times, taking turns: [(median seconds, outputs)] per forward."""
    times = [[] for _ in forwards]
    outs = [[] for _ in forwards]
    for _ in range(reps):
        for i, forward in enumerate(forwards):
            t0 = time.perf_counter()
            outs[i].append(forward())
            times[i].append(time.perf_counter() - t0)
    return [(statistics.median(t), o) for t, o in zip(times, outs)]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def run_demo(as_json: bool = False, reps: int = REPS, threads: int = THREADS) -> int:
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _run(as_json, reps)
    finally:
        torch.set_num_threads(before)


def _run(as_json: bool, reps: int) -> int:
    import torch
    from ..runtime.place import place
    from ..runtime.device.simdevice import Link
    from ..runtime.blocks.hops import DEFAULT_HOP_LINK

    model, inputs = build_model()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    budget = weight_bytes * 2 // 5 + (10 << 20)   # each GPU: 40% of the weights + work
    inventory = Inventory.simulated(INVENTORY)
    link, hop_link = Link(), DEFAULT_HOP_LINK
    threads = torch.get_num_threads()
    flops = measure_flops()
    # the two GPUs are asked for: computing at this CPU's speed, the cpu itself would be
    # as fast and need no copies, so auto-fit alone would rightly keep the model there
    spec = PlacementSpec(auto_fit=True, stream_layers=True, backend="diffusion=cuda0&cuda1",
                         max_vram=f"cuda0={budget}b,cuda1={budget}b")
    # 16x16 latent tokens of a patch-1 Flux are a 256x256 image: the planner sizes
    # working memory from that, as it would for a real model at a real resolution;
    # a simulated GPU has no cuBLAS workspace, so it is the activations alone
    # (256 tokens x 256 hidden x fp32 x ~40 live tensors = 10 MiB)
    the_plan = plan(spec, inventory, components={"diffusion": model}, resolution=RESOLUTION,
                    headroom={"diffusion": 10 << 20}, **sim_speeds(flops, link, hop_link))
    print(f"model: Flux architecture, {format_bytes(weight_bytes)} of weights\n"
          f"simulated GPUs {INVENTORY}, budget {format_bytes(budget)} each; they compute on "
          f"this CPU\n({flops / 1e9:.1f} GFLOP/s measured on a transformer MLP of the model's width, "
          f"{threads} thread{'s' if threads > 1 else ''})\nand copy over a modelled "
          f"{link.bandwidth / 1e9:.0f} GB/s link\n")
    print(the_plan.report())

    options = {"link": link}
    if the_plan.components["diffusion"].is_split:
        options["hop_link"] = hop_link
    # The all-resident runs use a twin of the model (the same weights, bit for bit), so
    # the two runs can take turns forward by forward: a load that comes and goes on this
    # machine slows both alike. Each gets the same warm-up forwards first.
    twin = copy.deepcopy(model)
    with torch.no_grad():
        reference = model(**inputs).sample
        with place(model, the_plan, "diffusion", inventory, **options) as placed:
            for _ in range(WARMUP):
                twin(**inputs)
                model(**inputs)
            before = placed.stats()
            (resident_s, resident_outs), (placed_s, placed_outs) = timed_alike(
                [lambda: twin(**inputs).sample, lambda: model(**inputs).sample], reps)
            stats = placed.stats()
    diff = max((out - reference).abs().max().item() for out in resident_outs + placed_outs)

    fit = the_plan.extra["fit"]
    predicted = fit["predicted"]
    compute_s = fit["components"]["diffusion"]["compute_s"]
    streamed = {name: (s["h2d_bytes"] - before["devices"][name]["h2d_bytes"]) // reps
                for name, s in stats["devices"].items()}
    print(f"\ntimed alike: {WARMUP} warm-up forward each, then the median of {reps} forwards "
          f"each, taking turns, {threads} thread{'s' if threads > 1 else ''}")
    print(f"  {'':<22}{'predicted':>12}{'measured':>12}")
    print(f"  {'all-resident forward':<22}{_ms(compute_s):>12}{_ms(resident_s):>12}")
    print(f"  {'placed forward':<22}{_ms(predicted['sample_step_s']):>12}"
          f"{_ms(placed_s):>12}")
    print(f"  {'streamed per forward':<22}"
          f"{format_bytes(predicted['streamed_bytes_per_step']):>12}"
          f"{format_bytes(sum(streamed.values())):>12}")
    tokens = TOKENS_PER_MEGAPIXEL["diffusion"] * RESOLUTION[0] * RESOLUTION[1] / (1 << 20)
    print(f"  the prediction assumes the speeds above and the cost model's 2 x params x "
          f"tokens FLOP\n  per forward ({tokens:.0f} effective tokens at "
          f"{RESOLUTION[0]}x{RESOLUTION[1]}, calibrated on Flux.1; this model sees "
          f"{SIDE * SIDE + TEXT}),\n  with no per-op overhead (docs/autofit.md)")
    # why measured differs from predicted here, in the figures just shown
    why = (f"measured / predicted: all-resident {resident_s / compute_s:.1f}x (this model "
           f"sees {(SIDE * SIDE + TEXT) / tokens:.1f}x the tokens the cost model counts, and "
           f"a model this small pays per-op overhead the model leaves out); placed "
           f"{placed_s / predicted['sample_step_s']:.1f}x (also: the simulated GPUs' copies "
           f"are memcpy on this CPU, competing with the compute they would overlap on a "
           f"GPU's copy engine)")
    print(textwrap.fill(why, 96, initial_indent="  ", subsequent_indent="  "))
    for name, s in stats["devices"].items():
        budget_bytes = the_plan.device(name).budget_bytes
        print(f"  {name}: peak {format_bytes(s['peak_bytes'])} of budget "
              f"{format_bytes(budget_bytes)}, copied {format_bytes(streamed[name])} per forward")
        if budget_bytes is not None and s["peak_bytes"] > budget_bytes:
            print(f"  ! {name} went over its budget")
            diff = float("inf")
    hops = (stats["hops"] - before["hops"]) // reps
    hop_bytes = (stats["hop_bytes"] - before["hop_bytes"]) // reps
    print(f"  hops {hops} per forward ({format_bytes(hop_bytes)})")
    print(f"max |placed - resident| = {diff:g} over {2 * reps} outputs -> "
          f"{'identical' if diff == 0 else 'DIFFERENT'}")
    if as_json:
        timing = {"warmup": WARMUP, "reps": reps, "threads": threads, "cpu_flops": flops,
                  "resident_s": resident_s, "placed_s": placed_s,
                  "predicted_resident_s": compute_s,
                  "predicted_placed_s": predicted["sample_step_s"],
                  "streamed_bytes_per_forward": streamed}
        print(json.dumps({"plan": the_plan.to_dict(), "stats": stats, "timing": timing,
                          "max_abs_diff": diff}))
    return 0 if diff == 0 else 1

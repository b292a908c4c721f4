"""How fast auto-fit plans a whole Flux.1-dev pipeline, next to accelerate's
infer_auto_device_map on the transformer alone, measured side by side in one run.

First the fair pairings of issue 10 item 8 and issue 32 (`pairing()`): the four files
of the Flux pipeline (Flux.1-dev, T5-XXL, CLIP-L, AE in fp16) written to a temporary
folder as safetensors with the published tensor tables (header-exact, sparse data),
planned from the paths by the public `plan(auto_fit)`, header reading included, on 8
simulated 8 GiB GPUs and on 8 of 4 GiB (the hard case: the transformer larger than any
GPU, a layer split streaming on every one):
  cold  our caches emptied before every plan (every header parsed, every geometry and
        ring table made again) vs accelerate building the transformer on `meta` from its
        config (init_empty_weights, what it needs to know the sizes) + reading the
        transformer file's header with safetensors' safe_open + infer_auto_device_map;
  warm  our headers cached by (path, size, mtime) and each model's geometry and ring
        tables kept, as a session keeps them (ComfyUI plans one model set at validation,
        at execution and again at sampling) vs infer_auto_device_map alone on the
        already-built transformer (the most favourable case for accelerate);
  cold* ours cold vs infer_auto_device_map alone: the strictest reading (accelerate is
        not charged for learning the sizes, we are).
Each figure is the median of interleaved rounds (ours, then accelerate, alternating which
goes first) in one process, one thread each; the target is ours <= 0.25x accelerate's,
judged on the warm row of both pairings (issue 32).

Models (no weights, all on the `meta` device): diffusers' FluxTransformer2DModel with its
default config (Flux.1-dev: 11.9 B params, 19 double + 38 single blocks) in bf16, a
T5-XXL-sized and a CLIP-L-sized text encoder (HF key names), and a Flux-VAE-sized
AutoencoderKL. They are described by placement.metadata (the real readers) and planned
by placement.fit on simulated inventories of 1, 2 and 8 GPUs.

Targets (issue 3): our whole-pipeline plan at most 0.25x accelerate's time for the
transformer alone; and never fewer GPU-resident transformer bytes than accelerate's map
under the same budgets. "Same budgets": accelerate does not reserve working memory, so
it is given what our plan leaves the transformer's weights on each GPU (budget minus
the transformer's working memory); both count bytes mapped to a GPU for the whole
forward (ours: resident blocks; our prefetch slots and accelerate's reserved
offload buffer are reported apart).

Run: python benchmarks/plan_speed.py [--repeat N] [--pairing-only]   (accelerate is
optional: pip install accelerate to get the comparison)
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

try:                                                    # the pack under its installed name
    from comfyui_placement.placement import Inventory
    from comfyui_placement.placement.components import COMPONENTS
    from comfyui_placement.placement.fit import FitOptions, fit
    from comfyui_placement.placement.metadata import describe, describe_component
    from comfyui_placement.placement.resolve import Choice, Request
    from comfyui_placement.placement.units import format_bytes
except ImportError:                                     # pragma: no cover
    sys.exit("comfyui_placement is not importable: pip install -e . first")

INVENTORIES = [
    ("1 GPU", "cuda0=24GiB,cpu=64GiB"),
    ("2 GPUs", "cuda0=12GiB,cuda1=12GiB,cpu=64GiB"),
    ("2 GPUs", "cuda0=24GiB,cuda1=24GiB,cpu=64GiB"),
    ("8 GPUs", ",".join(f"cuda{i}=4GiB" for i in range(8)) + ",cpu=64GiB"),
    ("8 GPUs", ",".join(f"cuda{i}=8GiB" for i in range(8)) + ",cpu=64GiB"),
]
NO_SPLIT = ["FluxTransformerBlock", "FluxSingleTransformerBlock"]


def t5_xxl_like(d=4096, ff=10240, layers=24, vocab=32128):
    m = nn.Module()
    m.shared = nn.Embedding(vocab, d)
    m.encoder = nn.Module()
    m.encoder.block = nn.ModuleList()
    for _ in range(layers):
        block, attn, ffn = nn.Module(), nn.Module(), nn.Module()
        attn.SelfAttention = nn.Module()
        for x in "qkvo":
            setattr(attn.SelfAttention, x, nn.Linear(d, d, bias=False))
        attn.layer_norm = nn.LayerNorm(d, bias=False)
        ffn.DenseReluDense = nn.Module()
        ffn.DenseReluDense.wi_0 = nn.Linear(d, ff, bias=False)
        ffn.DenseReluDense.wi_1 = nn.Linear(d, ff, bias=False)
        ffn.DenseReluDense.wo = nn.Linear(ff, d, bias=False)
        ffn.layer_norm = nn.LayerNorm(d, bias=False)
        block.layer = nn.ModuleList([attn, ffn])
        m.encoder.block.append(block)
    m.encoder.final_layer_norm = nn.LayerNorm(d, bias=False)
    return m


def clip_l_like(d=768, layers=12, vocab=49408):
    m, tm = nn.Module(), nn.Module()
    m.text_model = tm
    tm.embeddings = nn.Module()
    tm.embeddings.token_embedding = nn.Embedding(vocab, d)
    tm.embeddings.position_embedding = nn.Embedding(77, d)
    tm.encoder = nn.Module()
    tm.encoder.layers = nn.ModuleList()
    for _ in range(layers):
        layer = nn.Module()
        layer.self_attn = nn.Module()
        for x in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(layer.self_attn, x, nn.Linear(d, d))
        layer.layer_norm1, layer.layer_norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        layer.mlp = nn.Module()
        layer.mlp.fc1, layer.mlp.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        tm.encoder.layers.append(layer)
    tm.final_layer_norm = nn.LayerNorm(d)
    return m


def build_models():
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    with torch.device("meta"):
        flux = FluxTransformer2DModel().to(torch.bfloat16)
        vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16,
                            down_block_types=["DownEncoderBlock2D"] * 4,
                            up_block_types=["UpDecoderBlock2D"] * 4,
                            block_out_channels=[128, 256, 512, 512], layers_per_block=2)
        t5 = t5_xxl_like().to(torch.bfloat16)
        clip = clip_l_like().to(torch.bfloat16)
    return flux, t5, clip, vae


def describe_all(flux, t5, clip, vae):
    return {"diffusion": describe(flux, "diffusion")[0],
            "te": describe_component("te", [clip, t5]),
            "vae": describe(vae, "vae")[0]}


def unset_request():
    return Request({c: Choice(None, None, None) for c in COMPONENTS}, {}, False, [])


def median_ms(fn, repeat):
    fn()                                                 # warm: imports, first-call caches
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def accelerate_tools():
    try:
        import logging

        from accelerate import infer_auto_device_map
        from accelerate.utils import compute_module_sizes
        # accelerate logs one line per call for devices this machine lacks; silence it so
        # the timing is of the mapping, not of the terminal
        logging.getLogger("accelerate").setLevel(logging.ERROR)
        logging.getLogger("accelerate.utils.modeling").setLevel(logging.ERROR)
        return infer_auto_device_map, compute_module_sizes
    except ImportError:
        return None, None


def gpu_bytes_of_map(device_map, sizes):
    return sum(sizes[name] for name, dev in device_map.items() if isinstance(dev, int))


def overcommit(device_map, sizes, max_memory, reserve):
    """Bytes by which accelerate's map plus its offload execution buffer (the largest
    layer, on GPU 0, when anything is offloaded) exceed the room it was given."""
    per = {}
    for name, dev in device_map.items():
        if isinstance(dev, int):
            per[dev] = per.get(dev, 0) + sizes[name]
    if any(not isinstance(v, int) for v in device_map.values()):
        per[0] = per.get(0, 0) + reserve
    return max([0] + [b - max_memory[d] for d, b in per.items()])


PAIRING_INVENTORY = ",".join(f"cuda{i}=8GiB" for i in range(8)) + ",cpu=64GiB"


def _flux_files(directory: Path):
    """The pipeline's files with the published tensor tables (tests' helper, shared so the
    benchmark plans exactly what the tests check)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "placement"))
    from helpers.flux_models import flux_components, write_flux_pipeline
    return flux_components(write_flux_pipeline(directory))


# The pairings, side by side in one run: the model set fits across 8 GPUs of 8 GiB; on 8
# of 4 GiB the transformer is larger than any GPU and even than what they hold together
# beside its working memory (the hard case: a layer split that streams on every GPU,
# where the split-and-stream pricing does most of the work)
PAIRINGS = [("8 GPUs of 8 GiB", PAIRING_INVENTORY),
            ("8 GPUs of 4 GiB, the hard case",
             ",".join(f"cuda{i}=4GiB" for i in range(8)) + ",cpu=64GiB")]


def pairing(rounds: int) -> None:
    """Issue 10 item 8 and issue 32: whole pipeline from files (ours, through the public
    plan()) vs the transformer (accelerate), for each of PAIRINGS."""
    from comfyui_placement.placement import PlacementSpec, plan
    from comfyui_placement.placement.fit import geometry
    import importlib
    describe_module = importlib.import_module("comfyui_placement.placement.metadata.describe")
    infer, _ = accelerate_tools()
    spec = PlacementSpec(auto_fit=True)
    verdicts = []
    with tempfile.TemporaryDirectory() as tmp:
        components = _flux_files(Path(tmp))
        sizes = {k: sum(os.path.getsize(p) for p in ([v] if isinstance(v, str) else v))
                 for k, v in components.items()}
        files = sum(1 if isinstance(v, str) else len(v) for v in components.values())
        for label, inv_text in PAIRINGS:
            inv = Inventory.simulated(inv_text)

            def ours_cold():
                describe_module._HEADERS.clear()
                describe_module._DESCRIBED.clear()
                geometry.model_tables.cache_clear()
                geometry.suffix_rings.cache_clear()
                geometry._GEOMETRIES.clear()
                return plan(spec, inv, components)

            def ours_warm():
                return plan(spec, inv, components)
            result = ours_warm()
            cp = result.components["diffusion"]
            print(f"fair pairing, {label}: {files} files ("
                  f"{', '.join(f'{k} {format_bytes(b)}' for k, b in sizes.items())}), auto-fit "
                  f"-> diffusion {'&'.join(cp.runtime)}"
                  f"{' streamed' if cp.stream else ' resident'}")
            if infer is None:
                cold = statistics.median(_timed(ours_cold) for _ in range(rounds)) * 1000
                warm = statistics.median(_timed(ours_warm) for _ in range(rounds)) * 1000
                print(f"  ours cold {cold:.2f} ms, warm {warm:.2f} ms; accelerate NOT "
                      f"installed: no ratio (pip install accelerate)")
                continue
            rows = _paired_rows(result, components, tmp, ours_cold, ours_warm, infer, rounds)
            import accelerate
            print(f"  accelerate {accelerate.__version__}, {rounds} interleaved rounds, medians:")
            print(f"  {'':5s} {'ours: 4 files -> plan':>24s} {'accelerate: transformer':>26s} "
                  f"{'ratio':>7s}")
            for row, ms_a, ms_b in rows:
                print(f"  {row:5s} {ms_a:21.2f} ms {ms_b:23.2f} ms {ms_a / ms_b:7.3f}")
            verdicts += [(label, row, ms_a / ms_b) for row, ms_a, ms_b in rows]
        if verdicts:
            print("  cold  = every header parsed, every geometry and ring table made again, vs "
                  "accelerate building the model on meta and reading the header")
            print("  warm  = headers, geometries and ring tables kept, as in a session (the "
                  "target's reading), vs infer_auto_device_map alone on the built model")
            print("  cold* = ours cold vs infer_auto_device_map alone: the strictest reading")
            for label, row, ratio in verdicts:
                print(f"  target ours <= 0.25x accelerate, {label}, {row:5s}: {ratio:.3f} -> "
                      f"{'met' if ratio <= 0.25 else 'NOT met'}")
        print()


def _paired_rows(result, components, tmp, ours_cold, ours_warm, infer, rounds):
    """(row, ours ms, accelerate ms) for cold, warm and cold*: medians of interleaved
    rounds, alternating which goes first. accelerate gets what our plan leaves the
    transformer's weights on each GPU (budget less its working memory)."""
    from diffusers import FluxTransformer2DModel
    from safetensors import safe_open
    from accelerate import init_empty_weights
    hr = result.extra["fit"]["components"]["diffusion"]["headroom_bytes"]
    max_memory = {i: max(0, d.budget_bytes - hr)
                  for i, d in enumerate(d for d in result.devices if d.kind != "cpu")}
    max_memory["cpu"] = result.device("cpu").budget_bytes
    config = dict(FluxTransformer2DModel.load_config(_flux_config_dir(tmp)))
    state = {}

    def acc_cold():
        with safe_open(components["diffusion"], "pt") as f:      # header: names, shapes
            state["tables"] = {k: f.get_slice(k).get_shape() for k in f.keys()}
        with init_empty_weights():
            state["model"] = FluxTransformer2DModel.from_config(config).to(torch.bfloat16)
        return acc_warm()

    def acc_warm():
        return infer(state["model"], max_memory=max_memory, no_split_module_classes=NO_SPLIT,
                     dtype=torch.bfloat16)
    acc_cold()
    rows = []
    for label, mine, theirs in (("cold", ours_cold, acc_cold), ("warm", ours_warm, acc_warm),
                                ("cold*", ours_cold, acc_warm)):
        a, b = [], []
        for r in range(rounds):
            first, second = (mine, theirs) if r % 2 == 0 else (theirs, mine)
            t1, t2 = _timed(first), _timed(second)
            a.append(t1 if first is mine else t2)
            b.append(t2 if first is mine else t1)
        rows.append((label, statistics.median(a) * 1000, statistics.median(b) * 1000))
    return rows


def _flux_config_dir(tmp: str) -> str:
    """Flux.1-dev's transformer config (diffusers' defaults are Flux.1-dev's)."""
    from diffusers import FluxTransformer2DModel
    folder = os.path.join(tmp, "flux-config")
    with torch.device("meta"):
        FluxTransformer2DModel().save_config(folder)
    return folder


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--pairing-only", action="store_true",
                        help="only the fair pairing (issue 10 item 8)")
    args = parser.parse_args()
    pairing(max(5, args.repeat))
    if args.pairing_only:
        return

    t = time.perf_counter()
    flux, t5, clip, vae = build_models()
    infos = describe_all(flux, t5, clip, vae)
    print(f"models built and described in {time.perf_counter() - t:.1f} s")
    n_params = sum(p.numel() for p in flux.parameters())
    n_tensors = len(list(flux.parameters())) + len(list(flux.buffers()))
    for comp, info in infos.items():
        print(f"  {comp:9s} {info.arch:14s} {format_bytes(info.total_bytes):>10s}  "
              f"{len(info.blocks):3d} blocks  working memory {format_bytes(info.headroom_bytes)}")
    print(f"  transformer: {n_params / 1e9:.2f} B params, {n_tensors} tensors (parameters+buffers)")

    infer, sizes_of = accelerate_tools()
    if infer is None:
        print("\naccelerate is NOT installed: only our times are measured; "
              "`pip install accelerate` to compare side by side\n")
    else:
        import accelerate
        sizes = sizes_of(flux, dtype=torch.bfloat16)
        largest_block = max(sizes[n] for n, m in flux.named_modules()
                            if type(m).__name__ in NO_SPLIT)
        print(f"\naccelerate {accelerate.__version__}: infer_auto_device_map(transformer, "
              f"max_memory=weights room per GPU, no_split_module_classes={NO_SPLIT})\n")

    head = (f"{'inventory':40s} {'ours plan':>10s} {'describe+plan':>14s} "
            f"{'accelerate':>11s} {'ratio':>6s} {'ratio d+p':>9s}   "
            f"{'ours on GPU':>12s} {'+slots':>10s} {'acc on GPU':>11s} {'+reserve':>10s}  plan")
    print(head)
    print("-" * len(head))
    verdicts = []
    hr = infos["diffusion"].headroom_bytes
    for label, inv_text in INVENTORIES:
        inv = Inventory.simulated(inv_text)
        req = unset_request()
        ours = median_ms(lambda: fit(req, inv, infos, FitOptions()), args.repeat)
        both = median_ms(lambda: fit(req, inv, describe_all(flux, t5, clip, vae), FitOptions()),
                         max(5, args.repeat // 3))
        plan = fit(req, inv, infos, FitOptions())
        cp = plan.components["diffusion"]
        held = plan.extra["fit"]["components"]["diffusion"]["held_bytes"]
        on_gpu = cp.resident_bytes if cp.runtime != ["cpu"] else 0
        with_slots = sum(held.values()) - hr * len(held) if cp.runtime != ["cpu"] else 0
        what = ("&".join(cp.runtime) + (f" stream K={cp.stream.resident_blocks}"
                                        if cp.stream else " resident"))
        name = f"{label}: {inv_text.replace(',cpu=64GiB', '')}"
        if len(name) > 40:
            name = name[:37] + "..."
        if infer is None:
            print(f"{name:40s} {ours:9.2f}ms {both:13.2f}ms {'-':>11s} {'-':>6s} {'-':>9s}   "
                  f"{format_bytes(on_gpu):>12s} {format_bytes(with_slots):>10s} {'-':>11s} "
                  f"{'-':>10s}  {what}")
            continue
        max_memory = {i: max(0, d.budget_bytes - hr)
                      for i, d in enumerate(p for p in plan.devices if p.kind != "cpu")}
        max_memory["cpu"] = plan.device("cpu").budget_bytes
        acc = median_ms(lambda: infer(flux, max_memory=max_memory, no_split_module_classes=NO_SPLIT,
                                      dtype=torch.bfloat16), max(5, args.repeat // 3))
        dmap = infer(flux, max_memory=max_memory, no_split_module_classes=NO_SPLIT,
                     dtype=torch.bfloat16)
        acc_gpu = gpu_bytes_of_map(dmap, sizes)
        offloads = any(not isinstance(v, int) for v in dmap.values())
        acc_reserve = acc_gpu + (largest_block if offloads else 0)
        over = overcommit(dmap, sizes, max_memory, largest_block)
        print(f"{name:40s} {ours:9.2f}ms {both:13.2f}ms {acc:10.2f}ms {ours / acc:6.3f} "
              f"{both / acc:9.3f}   {format_bytes(on_gpu):>12s} {format_bytes(with_slots):>10s} "
              f"{format_bytes(acc_gpu):>11s} {format_bytes(acc_reserve):>10s}  {what}")
        plain = fit(req, inv, infos, FitOptions(prefetch_depth=0)).components["diffusion"]
        plain_gpu = plain.resident_bytes if plain.runtime != ["cpu"] else 0
        if plain_gpu != on_gpu:
            print(f"{'':40s} with prefetch_depth=0 (one slot, no overlap): ours "
                  f"{format_bytes(plain_gpu)} resident")
        if over:
            print(f"{'':40s} accelerate's map + its offload buffer exceed the room by "
                  f"{format_bytes(over)} on a GPU (ours stays within every budget)")
        verdicts.append((name, ours / acc, on_gpu >= acc_gpu, with_slots >= acc_reserve,
                         plain_gpu >= acc_gpu))
    if verdicts:
        print()
        worst = max(v[1] for v in verdicts)
        print(f"speed target (ours <= 0.25x accelerate): worst ratio {worst:.3f} -> "
              f"{'met' if worst <= 0.25 else 'NOT met'}")
        short = [v[0] for v in verdicts if not v[2]]
        print("GPU-resident bytes >= accelerate's map: " +
              ("met on every inventory" if not short else
               "NOT met on " + "; ".join(short) + " (see docs/autofit.md: prefetch slots)"))
        short = [v[0] for v in verdicts if not v[4]]
        print("  with prefetch_depth=0 (no prefetch slot): " +
              ("met on every inventory" if not short else "NOT met on " + "; ".join(short)))
        short = [v[0] for v in verdicts if not v[3]]
        print("GPU weight bytes incl. prefetch slots >= accelerate's map + its offload "
              "buffer: " + ("met on every inventory" if not short else
                            "NOT met on " + "; ".join(short)))


if __name__ == "__main__":
    main()

"""Planned against measured: every family of the integration suite, placed inside a real
ComfyUI, each device's planned bytes beside the peak the run measured there (issue 29
item 3: "per device and phase, within 10% wherever the device holds at least 8 MiB").

    python benchmarks/planned_vs_measured.py [--comfyui DIR] [--python PY]
        [--families a,b] [--ways stream_cpu,stream_disk,layer,auto_fit] [--json]

Runs tests/integration/families_driver.py once, in ComfyUI's own Python (COMFYUI_PATH /
COMFYUI_PYTHON as the integration tests take them), with --at-8mib: each family at
families.AT_8MIB's size (Family.at_size: more blocks, a larger latent, a longer prompt),
where every device of these ways plans at least 8 MiB. Prints one row per family, way
and device: the plan's planned bytes (the plan that sampled: re-made at the first model
call with the working memory it rehearsed), the peak the device's ledger measured,
measured / planned, and whether that is within 10% (below 8 MiB: within 10% or 1 MiB,
the suite's floor); then the run's times. Exits 1 when a way failed or a device is
outside its bound. `--json` prints the rows and times as JSON instead.

What it assumes:
- The devices are simulated (placement's simulated accelerator: host memory, capacity
  enforced by the ledger) with `@workspace=0`: they allocate no kernel workspace, so
  the plans keep none and a device's peak is its weights, its ring and the tensors the
  forward holds there, all metered. A real GPU adds its kernel workspace and the caching
  allocator's rounding, which the planner reserves as its workspace (256 MiB by
  default) and which no figure here covers.
- Compute runs on the CPU (ComfyUI --cpu, PyTorch attention), in float32.
- The working memory in each plan is the rehearsal of the run's first model call on the
  meta device (runtime/comfy/replan/rehearse_call.py) at the run's real shapes; nothing is read
  from a previous run.
- One phase is measured: sampling, the diffusion model (KSampler, 2 steps, CFG: cond and
  uncond in one batch). Text encoders and VAEs are not in these workflows (the families'
  conditioning and latents are made by test nodes).
- The ways, their inventories and budgets are families_driver.py's (way_setup): streamed
  from host memory and from the file on one device sized for the non-block weights, three
  blocks and the working memory; a layer split over two devices each sized for 60% of
  the blocks; auto-fit under roomy max_vram budgets on two 8 GiB devices (it may choose
  resident, batch parallel or a pipelined split).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests" / "integration" / "families_driver.py"
MiB = 1 << 20
FLOOR = 8 * MiB               # at and above: within 10%; below: 10% or 1 MiB
WAYS = "stream_cpu,stream_disk,layer,auto_fit"
# test_families.RUN without the _d4 suffixes (the sizes set their own depth)
FAMILIES = ("sd15,sdxl,svd,sd3,flux1,flux2,pixart_sigma,hunyuan_dit,wan21,wan22_5b,"
            "wan22_a14b_high,wan22_a14b_low,hunyuan_video,hunyuan_video15,ltxv,cogvideox,"
            "cosmos_predict2,kandinsky5,hunyuan3d2,hunyuan3d21")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--comfyui", default=os.environ.get("COMFYUI_PATH", "/tmp/comfyui"))
    ap.add_argument("--python", default=os.environ.get("COMFYUI_PYTHON")
                    or "/tmp/comfyvenv/bin/python", help="ComfyUI's Python")
    ap.add_argument("--families", default=FAMILIES)
    ap.add_argument("--ways", default=WAYS)
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--work", default="", help="the driver's work folder (default: a "
                    "temporary one, removed)")
    ap.add_argument("--json", action="store_true")
    return ap.parse_args()


def within(planned: int, measured: int) -> bool:
    """test_families.close_to_plan: 10% at 8 MiB and more, 10% or 1 MiB below."""
    if planned >= FLOOR:
        return abs(measured - planned) <= planned // 10
    return abs(measured - planned) <= max(planned // 10, MiB)


def plan_words(facts: dict) -> str:
    """What the plan that sampled did, in a few words."""
    stream = facts.get("stream") or {}
    if facts.get("parallel") not in (None, "none"):
        kind = {"batch": "batch parallel", "pipeline": "pipelined layer split"}.get(
            facts["parallel"], facts["parallel"])
    elif len(facts.get("runtime") or []) > 1:
        kind = f"{facts.get('split_mode')} split"
    elif stream:
        kind = "streamed"
    else:
        kind = "resident"
    if stream:
        kind += f", K={stream.get('resident_blocks')} depth {stream.get('prefetch_depth')}"
    return kind + f", params {facts.get('params')}"


def rows_of(results: dict, ways) -> tuple:
    rows, failures = [], []
    for key, rec in results.get("families", {}).items():
        if rec.get("ok") is None:
            continue
        if not rec.get("ok"):
            failures.append(f"{key}: plain run failed: {str(rec.get('error'))[-300:]}")
            continue
        for way in ways:
            w = (rec.get("ways") or {}).get(way)
            if w is None:
                failures.append(f"{key} {way}: not run")
                continue
            facts = w.get("facts") or {}
            if w.get("error") or not facts.get("measured"):
                failures.append(f"{key} {way}: {str(w.get('error'))[-300:]}")
                continue
            compare = w.get("compare") or {}
            for dev, m in sorted(facts["measured"].items()):
                planned = int(facts["planned"].get(dev) or 0)
                peak = int(m["peak_bytes"])
                rows.append({
                    "family": key, "base": rec.get("base_key", key),
                    "size": rec.get("size", ""), "way": way, "plan": plan_words(facts),
                    "device": dev, "phase": "sampling (diffusion)",
                    "planned_bytes": planned, "measured_peak_bytes": peak,
                    "working_peak_bytes": m.get("working_peak_bytes"),
                    "capacity_bytes": m.get("capacity_bytes"),
                    "ratio": round(peak / planned, 4) if planned else None,
                    "at_least_8mib": planned >= FLOOR,
                    "within_10pct": bool(planned) and within(planned, peak),
                    "latent_equal": bool(compare.get("close")),
                    "latent_max_rel_diff": compare.get("max_rel_diff")})
    return rows, failures


def table(rows) -> str:
    head = ("family", "size", "way", "plan", "device", "phase", "planned MiB",
            "measured MiB", "measured/planned", "within 10%")
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        ok = "yes" if r["within_10pct"] else "NO"
        if not r["at_least_8mib"]:
            ok += " (under 8 MiB: 1 MiB floor)"
        lines.append("| " + " | ".join([
            r["base"], r["size"], r["way"], r["plan"], r["device"], "sampling",
            f"{r['planned_bytes'] / MiB:.2f}", f"{r['measured_peak_bytes'] / MiB:.2f}",
            f"{r['ratio']:.3f}" if r["ratio"] is not None else "-", ok]) + " |")
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    ways = [w for w in args.ways.split(",") if w]
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="planned_vs_measured_") as tmp:
        work = args.work or tmp
        cmd = [args.python, str(DRIVER), "--comfyui", args.comfyui, "--pack", str(ROOT),
               "--work", work, "--at-8mib", "--families", args.families,
               "--ways", ",".join(ways)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                              env={**os.environ, "PYTHONUNBUFFERED": "1",
                                   "COMFYUI_PLACEMENT_SIMULATE": ""})
    wall = time.time() - t0
    lines = [l for l in proc.stdout.splitlines() if l.startswith("FAMILIES_RESULTS ")]
    if not lines:
        print(f"the driver printed no results (exit {proc.returncode}):\n"
              f"{proc.stderr[-3000:]}", file=sys.stderr)
        return 1
    results = json.loads(lines[-1][len("FAMILIES_RESULTS "):])
    rows, failures = rows_of(results, ways)
    failures += results.get("errors") or []
    big = [r for r in rows if r["at_least_8mib"]]
    misses = [r for r in rows if not r["within_10pct"]]
    times = {"wall_s": round(wall, 1), "driver_total_s": results.get("total_s"),
             "families": len({r["family"] for r in rows}), "rows": len(rows),
             "rows_at_least_8mib": len(big), "rows_outside": len(misses)}
    if args.json:
        print(json.dumps({"rows": rows, "failures": failures, "times": times,
                          "comfyui_version": results.get("comfyui_version")}, indent=1))
    else:
        print(f"planned against measured, ComfyUI {results.get('comfyui_version')}, "
              f"simulated devices @workspace=0, CPU compute; phase: sampling (the "
              f"diffusion model, the only model these workflows run)\n")
        print(table(rows))
        ratios = [r["ratio"] for r in big if r["ratio"] is not None]
        print(f"\n{len(rows)} devices, {len(big)} of them planned at 8 MiB or more: "
              f"measured/planned {min(ratios):.3f} to {max(ratios):.3f}"
              if ratios else f"\n{len(rows)} devices, none at 8 MiB or more")
        print(f"outside the bound: {len(misses)}"
              + "".join(f"\n  {r['base']} {r['way']} {r['device']}: planned "
                        f"{r['planned_bytes']} B, measured {r['measured_peak_bytes']} B"
                        for r in misses))
        for f in failures:
            print(f"FAILED: {f}")
        print(f"time: {wall:.0f} s wall ({results.get('total_s')} s in the driver) for "
              f"{times['families']} families x {len(ways)} ways")
    return 1 if misses or failures else 0


if __name__ == "__main__":
    sys.exit(main())

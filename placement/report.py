"""Plans as tables a person reads (the UI shows the same text).

The text fits a terminal: every line stays within WIDTH columns (long reasons and
warnings wrap with an indent, byte counts in tables have three significant digits).
Only the components that were described (`present`) get a row; a plan made without
any model shows every component. The JSON (`Plan.to_json`) has every figure in full.
"""
import re
import textwrap
from typing import List, Sequence

from .components import PHASES
from .fit.costs import DEFAULT_BANDWIDTH, DEFAULT_THROUGHPUT
from .remote_devices import is_remote
from .units import GiB, MiB, format_bytes

WIDTH = 100         # columns of a terminal; the JSON is there for machines
RUNTIME_WIDTH = 17  # a longer device list shows its first device and a count


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers).rstrip(), fmt.format(*("-" * w for w in widths)).rstrip()] + \
        [fmt.format(*map(str, r)).rstrip() for r in rows]


_KEEP = re.compile(r"(?<=\d) (?=(?:[KMGT]?i?B|[KMGT]?B/s|[GT]?FLOP/s|ms|s)\b)")


def wrap(text: str, indent: str = "  ", hang: str = "    ") -> List[str]:
    """One logical line as terminal lines: `indent` first, `hang` on continuations; a
    number and its unit stay on one line."""
    lines = textwrap.wrap(_KEEP.sub("\0", text), WIDTH, initial_indent=indent,
                          subsequent_indent=hang, break_long_words=False,
                          break_on_hyphens=False) or [indent.rstrip()]
    return [line.replace("\0", " ") for line in lines]


def short_bytes(n) -> str:
    """Three significant digits: 22.2 GiB, 810 MiB, 9.10 GiB (tables; JSON has bytes)."""
    if n is None:
        return "-"
    sign, n = ("-" if n < 0 else ""), abs(n)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            v = n / size
            digits = 2 if v < 9.995 else 1 if v < 99.95 else 0
            return f"{sign}{v:.{digits}f} {unit}"
    return f"{sign}{n} B"


def _free_total(free: int, total: int) -> str:
    f, t = short_bytes(free), short_bytes(total)
    if f.split()[-1] == t.split()[-1]:
        return f"{f.rsplit(' ', 1)[0]}/{t}"
    return f"{f}/{t}"


def _runtime_text(runtime: Sequence[str]) -> str:
    text = "&".join(runtime)
    if len(text) <= RUNTIME_WIDTH:
        return text
    return f"{runtime[0]}&{len(runtime) - 1} more"   # the reasons name every device


def _stream_text(cp) -> str:
    if cp.stream is None:
        return "-"
    text = f"K={cp.stream.resident_blocks} depth={cp.stream.prefetch_depth}"
    if cp.params == "disk" and cp.stream.host_blocks:     # RAM first, the rest from the file
        text += f" ram={cp.stream.host_blocks}"
    return text


def _stream_legend(shown) -> List[str]:
    """What the stream column's abbreviations mean, under the table that uses them."""
    streams = [cp.stream for _, cp in shown if cp.stream is not None]
    if not streams:
        return []
    text = ("stream: K = first blocks kept resident on the device for the whole run, "
            "depth = blocks copied ahead while one computes")
    if any(f" ram={cp.stream.host_blocks}" in _stream_text(cp) for _, cp in shown
           if cp.stream is not None):
        text += ", ram = streamed blocks kept in RAM (the rest are read from the file)"
    return [""] + wrap(text, indent="", hang="  ")


def _shown(plan):
    """The components that get a row: those described, or all when none was."""
    present = [(n, cp) for n, cp in plan.components.items() if cp.present]
    return present or list(plan.components.items())


def _params_text(cp) -> str:
    """Where the weights rest: a split's weights rest with their ranges (or shards) on
    each of its devices when they rest with the runtime."""
    if cp.is_split and cp.params == cp.runtime[0] and cp.parallel != "batch":
        return _runtime_text(cp.runtime)
    return cp.params


def render_plan(plan) -> str:
    comp_rows = []
    shown = _shown(plan)
    for name, cp in shown:
        comp_rows.append([
            name, _runtime_text(cp.runtime), _params_text(cp),
            (cp.parallel if cp.parallel in ("batch", "pipeline") else cp.split_mode)
            if cp.is_split else "-",
            _stream_text(cp),
            short_bytes(cp.total_bytes) if cp.present else "-",
            short_bytes(cp.resident_bytes) if cp.present else "-",
            short_bytes(cp.streamed_bytes) if cp.present and cp.stream else "-",
            cp.lora,
        ])
    headers = ["component", "runtime", "params", "split", "stream", "size", "on device",
               "streamed", "lora"]
    if any(cp.quant for _, cp in shown):      # GGUF: sizes are the quantized bytes
        headers.append("quant")
        for row, (_, cp) in zip(comp_rows, shown):
            row.append(cp.quant or "-")
    out = [f"placement plan (schema v{plan.version})", ""]
    if not any(cp.present for _, cp in shown):
        out[-1:] = ["", "no model connected here: what each component gets once Apply",
                    "Placement receives the models (sizes come with them)", ""]
    # streamed: bytes copied per forward (per sampling step for diffusion and controlnet)
    out += table(headers, comp_rows)
    out += _stream_legend(shown)
    out += _device_lines(plan, shown)
    out += _predicted_lines(plan)
    reasons = [(n, cp.reasons) for n, cp in plan.components.items() if cp.present]
    if reasons:
        out += ["", "reasons:"]
        for name, rs in reasons:
            out += wrap(f"{name}: " + "; ".join(rs))
    if plan.warnings:
        out += ["", "warnings:"]
        for w in plan.warnings:
            out += wrap(f"! {w}")
    return "\n".join(out)


def _device_lines(plan, shown) -> List[str]:
    fitted = plan.extra.get("device_table")
    if not fitted:
        dev_rows = [[d.name, d.kind, _free_total(d.free_bytes, d.total_bytes),
                     short_bytes(d.budget_bytes), short_bytes(d.planned_bytes),
                     _headroom(d)] for d in plan.devices]
        return [""] + table(["device", "kind", "free/total", "budget", "planned", "left"],
                            dev_rows)
    # auto-fit's breakdown, like llama.cpp --fit: use per phase, deficits. Only the
    # phases in which a shown component computes get a column.
    used = {PHASES[n] for n, cp in shown if cp.present}
    phases = [p for p in fitted[0]["phases"] if p in used] or list(fitted[0]["phases"])
    dev_rows = [[d["name"], d["kind"], _free_total(d["free_bytes"], d["total_bytes"]),
                 short_bytes(d["budget_bytes"])]
                + [short_bytes(d["phases"][p]) for p in phases]
                + [short_bytes(d["headroom_bytes"]),
                   "DEFICIT " + short_bytes(d["deficit_bytes"]) if d["deficit_bytes"]
                   else short_bytes(d["slack_bytes"])] for d in fitted]
    out = [""] + table(["device", "kind", "free/total", "budget"] + phases
                       + ["headroom", "left"], dev_rows)
    groups = {}
    for d in fitted:
        groups.setdefault(d["budget_from"], []).append(d["name"])
    out += wrap("budgets: " + "; ".join(f"{', '.join(names)} = {how}"
                                        for how, names in groups.items()), "", "  ")
    return out


def _rate(value, unit: str) -> str:
    for prefix, size in (("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if value >= size:
            return f"{value / size:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _predicted_lines(plan) -> List[str]:
    fit = plan.extra.get("fit", {})
    predicted = fit.get("predicted")
    if not predicted:
        return []
    if not any(getattr(cp, "present", False) for cp in plan.components.values()):
        # nothing described yet (Backend Assignment, no models): no figure to give
        return ["", "predicted: nothing yet, no model is described (Apply Placement predicts "
                    "for the models it is given, again when sampling starts)"]
    out = [""] + wrap(
        f"predicted: {seconds_text(predicted['sample_step_s'])} per sampling step, "
        f"{format_bytes(predicted['streamed_bytes_per_step'])} streamed per step, "
        f"{seconds_text(predicted['generation_s'])} per generation ({fit['steps']} steps; "
        f"cost model in docs/autofit.md)", "", "  ")
    model = fit.get("cost_model")
    if model:
        out += wrap("assumes: " + _speeds(plan, model), "", "  ")
    from .worker_report import lines as worker_lines
    shown = worker_lines(plan)
    if shown:
        out += ["worker figures:"]
        for line in shown:
            out += wrap(line)
    return out


def _speeds(plan, model) -> str:
    """The device speeds the prediction rests on, devices of equal speeds together,
    and whether they are the defaults for their kind or were given to the planner."""
    flops = model.get("throughput_flops", {})
    links = model.get("bandwidth_bytes_per_s", {})
    groups, default = {}, True
    for d in plan.devices:
        if d.name not in flops or is_remote(d.name):   # workers': "worker figures"
            continue
        f, b = flops[d.name], links.get(d.name)
        default_b = DEFAULT_BANDWIDTH.get(d.kind)
        default = default and f == DEFAULT_THROUGHPUT.get(d.kind) and (
            b == default_b or (b is None and default_b == float("inf")))
        text = _rate(f, "FLOP/s") + ("" if b is None else f", {_rate(b, 'B/s')} from host")
        groups.setdefault(text, []).append(d.name)
    parts = [f"{', '.join(names)} {text}" for text, names in groups.items()]
    peer = model.get("peer_bandwidth_bytes_per_s")
    if peer:
        parts.append(f"{_rate(peer, 'B/s')} between GPUs")
    source = ("the default speeds of each device kind" if default and not peer
              else "speeds given to the planner")
    sources = model.get("sources")     # fit.costs.CostModel: given / measured / default
    if sources:                        # docs/calibration.md
        used = {v for v in sources.values() for v in (
            [x for k, x in v.items() if not is_remote(k)] if isinstance(v, dict) else [v])}
        source = ("measured on this machine" + (", some given" if "given" in used else "")
                  if "measured" in used else "speeds given to the planner" if "given" in used
                  else "the default speeds of each device kind")
        if model.get("corrections"):
            source += ", corrected by observed runs"
    if source == "the default speeds of each device kind":
        # a newcomer's first plans: say how to get this machine's own
        source += ("; run `calibrate` (python custom_nodes/comfyui-placement calibrate) "
                   "for this machine's")
    return "; ".join(parts) + f" ({source})"


def _headroom(d) -> str:
    limit = d.budget_bytes if d.budget_bytes is not None else d.free_bytes
    left = limit - d.planned_bytes
    return short_bytes(left) if left >= 0 else f"DEFICIT {short_bytes(-left)}"


def seconds_text(v) -> str:
    """Seconds with three significant digits: 1.23 s, 412 ms, 0.311 ms."""
    if v is None:
        return "-"
    def sig3(x):             # no exponent (the editor prints these numbers the same way)
        return ("%f" % float(f"{x:.3g}")).rstrip("0").rstrip(".")
    return f"{sig3(v)} s" if v >= 1 else f"{sig3(v * 1000)} ms"


def render_measured(record: dict) -> List[str]:
    """The lines of one measured run (nodes/measured.py's record) beside the plan's
    predictions. The node, the log and the text report all show exactly these lines."""
    pred = record.get("predicted") or {}
    run = record.get("run", 1)
    sample, decode = record.get("sample"), record.get("decode")
    out = []
    if sample:
        steps = sample["steps"]
        line = (f"measured (run {run}): sampling {steps} steps in "
                f"{seconds_text(sample['seconds'])}, "
                f"{seconds_text(sample['seconds'] / steps)} per sampling step")
        if pred.get("sample_step_s") is not None:
            line += f"; predicted {seconds_text(pred['sample_step_s'])} per sampling step"
        else:
            line += "; no prediction (auto_fit predicts seconds)"
        out.append(line)
    parts = [name for name, p in (("sampling", sample), ("decode", decode)) if p]
    if parts:
        line = (f"measured generation: {seconds_text(record.get('generation_s'))} "
                f"({' + '.join(parts)}; text encoding not timed)")
        if pred.get("generation_s") is not None:
            steps = record.get("steps")
            line += (f"; predicted {seconds_text(pred['generation_s'])} "
                     f"(encode + {steps} steps + decode)")
        out.append(line)
    planned = record.get("planned_bytes") or {}
    peaks = []
    for dev, phases in (record.get("peaks") or {}).items():
        for phase, b in phases.items():
            plan_dev = planned.get(dev, {})
            want = plan_dev.get(phase, plan_dev.get("any"))
            peaks.append(f"{dev} {phase} {short_bytes(b)}"
                         + ("" if want is None else f" (planned {short_bytes(want)})"))
    if peaks:
        out.append("measured peak: " + ", ".join(peaks))
    for dev, how in (record.get("peaks_measured") or {}).items():
        out.append(f"{dev} peak measured on its worker: {how}")
    out += [worker_loading_line(dev, how)
            for dev, how in (record.get("worker_loading") or {}).items()]
    return out


def worker_loading_line(device: str, how: dict) -> str:
    """A worker's range in one run: kept loaded from the run before, or what loading it
    read, hashed and moved there and compared here (runtime/distributed/kept.py)."""
    span = how.get("blocks")
    head = f"{device}: blocks {span[0]}..{span[1]}" if span else f"{device}: its range"
    if how.get("kept"):
        return (f"{head} kept loaded from the last run ({short_bytes(how.get('nbytes', 0))}"
                f"): no weight moved, nothing hashed")
    why = how.get("reloaded_because")
    return (f"{head} loaded ({short_bytes(how.get('nbytes', 0))}"
            + (f"; not kept: {why}" if why else "") + "): "
            f"{short_bytes(how.get('read_bytes', 0))} read, "
            f"{short_bytes(how.get('hashed_bytes', 0))} hashed, "
            f"{short_bytes(how.get('moved_bytes', 0))} moved on the worker; "
            f"{short_bytes(how.get('compared_bytes', 0))} compared with the file here")

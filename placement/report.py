"""Plans as tables a person reads (the UI shows the same text)."""
from typing import List, Sequence

from .units import format_bytes


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers).rstrip(), fmt.format(*("-" * w for w in widths)).rstrip()] + \
        [fmt.format(*map(str, r)).rstrip() for r in rows]


def _stream_text(cp) -> str:
    if cp.stream is None:
        return "-"
    return f"K={cp.stream.resident_blocks} depth={cp.stream.prefetch_depth}"


def render_plan(plan) -> str:
    comp_rows = []
    for name, cp in plan.components.items():
        comp_rows.append([
            name + ("" if cp.present else " (not loaded)"),
            "&".join(cp.runtime), cp.params,
            cp.split_mode if cp.is_split else "-", _stream_text(cp),
            format_bytes(cp.total_bytes) if cp.present else "-",
            format_bytes(cp.resident_bytes) if cp.present else "-",
            format_bytes(cp.streamed_bytes) if cp.present and cp.stream else "-",
            cp.lora,
        ])
    out = [f"placement plan (schema v{plan.version})", ""]
    out += table(["component", "runtime", "params", "split", "stream", "size", "on device",
                  "streamed/step", "lora"], comp_rows)
    fitted = plan.extra.get("device_table")
    if fitted:      # auto-fit's breakdown, like llama.cpp --fit: use per phase, deficits
        phases = [p for p in fitted[0]["phases"]]
        dev_rows = [[d["name"], d["kind"], format_bytes(d["total_bytes"]),
                     format_bytes(d["free_bytes"]),
                     f"{format_bytes(d['budget_bytes'])} ({d['budget_from']})"]
                    + [format_bytes(d["phases"][p]) for p in phases]
                    + [format_bytes(d["headroom_bytes"]),
                       "DEFICIT " + format_bytes(d["deficit_bytes"]) if d["deficit_bytes"]
                       else format_bytes(d["slack_bytes"])] for d in fitted]
        out += [""] + table(["device", "kind", "total", "free", "budget"] + phases
                            + ["headroom", "left"], dev_rows)
    else:
        dev_rows = [[d.name, d.kind, format_bytes(d.total_bytes), format_bytes(d.free_bytes),
                     format_bytes(d.budget_bytes), format_bytes(d.planned_bytes),
                     _headroom(d)] for d in plan.devices]
        out += [""] + table(["device", "kind", "total", "free", "budget", "planned", "left"],
                            dev_rows)
    predicted = plan.extra.get("fit", {}).get("predicted")
    if predicted:
        out += ["", f"predicted: {predicted['sample_step_s'] * 1000:.0f} ms per sampling step, "
                    f"{format_bytes(predicted['streamed_bytes_per_step'])} streamed per step, "
                    f"{predicted['generation_s']:.2f} s per generation "
                    f"({plan.extra['fit']['steps']} steps; cost model in docs/autofit.md)"]
    reasons = [(n, cp.reasons) for n, cp in plan.components.items() if cp.present]
    if reasons:
        out += ["", "reasons:"]
        for name, rs in reasons:
            out += [f"  {name}: " + "; ".join(rs)]
    if plan.warnings:
        out += ["", "warnings:"] + [f"  ! {w}" for w in plan.warnings]
    return "\n".join(out)


def _headroom(d) -> str:
    limit = d.budget_bytes if d.budget_bytes is not None else d.free_bytes
    left = limit - d.planned_bytes
    return format_bytes(left) if left >= 0 else f"DEFICIT {format_bytes(-left)}"

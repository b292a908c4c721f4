"""The planned bytes the node shows per device and phase: those of the plan that ran.

One figure per device and phase, taken from one plan JSON (v1 dict), feeds both places
the node shows it: the measured line's "(planned X)" (nodes/measured.py, rendered by
placement/report.render_measured) and the bars the editor draws (web/placement.js
phaseBars, which reads `device_table[].phases` of an auto-fit plan, else
`device_phases`). The plan that ran is the sampling plan made again at the first model
call with the diffusion model's rehearsed working memory; a phase whose engine calls
were rehearsed too (text encode, VAE decode: runtime/comfy/apply/engine_calls.py) takes the
bytes those calls planned on each device, written into the same JSON, so the bars and
the line cannot disagree.
"""
import copy
from typing import Dict, Optional

Figures = Dict[str, Dict[str, int]]          # device -> phase -> bytes


def planned_by_phase(plan: dict) -> Figures:
    """{device: {phase: bytes}} of a plan JSON dict: an auto-fit plan's table rows, an
    explicit plan's device_phases, else {"any": planned_bytes}."""
    table = {row["name"]: row for row in plan.get("device_table") or []}
    phases = plan.get("device_phases") or {}
    out: Figures = {}
    for d in plan.get("devices") or []:
        row = table.get(d["name"])
        got = dict(row.get("phases") or {}) if row else dict(phases.get(d["name"]) or {})
        out[d["name"]] = {k: int(v) for k, v in got.items()} or \
            {"any": int(d.get("planned_bytes") or 0)}
    return out


def with_calls(plan: dict, calls: Optional[Figures]) -> dict:
    """A copy of `plan` whose phases hold the bytes rehearsed engine calls planned
    ({phase: {device: bytes}}), in the place the editor reads them from; each device's
    planned_bytes stays the largest of its phases."""
    if not calls:
        return plan
    out = copy.deepcopy(plan)
    rows = {row["name"]: row for row in out.get("device_table") or []}
    phases = out.get("device_phases")
    if phases is None and not rows:
        phases = out["device_phases"] = {}
    for phase, per_device in calls.items():
        for dev, b in per_device.items():
            if dev in rows:
                rows[dev].setdefault("phases", {})[phase] = int(b)
            elif phases is not None:
                phases.setdefault(dev, {})[phase] = int(b)
    figures = planned_by_phase(out)
    for d in out.get("devices") or []:
        mine = figures.get(d["name"]) or {}
        if mine and "any" not in mine:
            d["planned_bytes"] = max(mine.values())
            if d["name"] in rows:
                rows[d["name"]]["planned_bytes"] = d["planned_bytes"]
    return out

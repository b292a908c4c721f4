"""Issue 29 item 3: the node shows one planned figure per device and phase, the plan
that ran. The measured line's "(planned X)" (placement/report.render_measured over
placement/ran_figures.planned_by_phase) and the bars the editor draws (web/placement.js
phaseBars over the same plan JSON) must give the same number, for explicit and auto-fit
plans, with a rehearsed VAE decode written into the decode phase."""
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from comfyui_placement.placement import Inventory, PlacementSpec, plan
from comfyui_placement.placement.metadata import headroom as hr
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo
from comfyui_placement.placement.ran_figures import planned_by_phase, with_calls
from comfyui_placement.placement.report import render_measured, short_bytes
from comfyui_placement.placement.units import format_bytes

MiB = 1 << 20
WEB = Path(__file__).resolve().parents[2] / "web" / "placement.js"


def info(comp, blocks=8, block=4 * MiB, act=12 * MiB, arch="flux"):
    return ComponentInfo(
        comp, 2 * MiB + blocks * block,
        tuple(BlockInfo(f"blocks.{i}", block, "blocks", i) for i in range(blocks)),
        arch=arch, dtype="bf16", headroom_bytes=hr.WORKSPACE + act,
        workspace_bytes=hr.WORKSPACE, headroom_basis=f"t + {format_bytes(hr.WORKSPACE)} workspace")


def plans():
    inv = Inventory.simulated("cuda0=8GiB@workspace=0,cuda1=8GiB@workspace=0")
    comps = {"diffusion": info("diffusion"), "vae": info("vae", blocks=2, arch="vae")}
    explicit = plan(PlacementSpec(backend="diffusion=cuda0,vae=cuda1"), inv, comps)
    fitted = plan(PlacementSpec(auto_fit=True), inv, comps)
    return {"explicit": explicit, "auto_fit": fitted}


def bars_in_js(plan_json: dict) -> list:
    """web/placement.js phaseBars(plan) run by node, with ComfyUI's app/api stubbed."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node (JavaScript) is not installed")
    return json.loads(subprocess.run(
        [node, "--input-type=module", "-e", JS.replace("PLACEMENT_JS", str(WEB))],
        input=json.dumps(plan_json), capture_output=True, text=True, check=True,
        timeout=60).stdout)


# placement.js imports "../../scripts/app.js" and api.js (ComfyUI's) and touches window
# and document at load: loaded from a copy beside stub modules
JS = r"""
import fs from "node:fs"; import os from "node:os"; import path from "node:path";
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "placementjs-"));
fs.mkdirSync(path.join(dir, "scripts")); fs.mkdirSync(path.join(dir, "ext", "pack"), { recursive: true });
fs.writeFileSync(path.join(dir, "package.json"), '{"type": "module"}');
fs.writeFileSync(path.join(dir, "scripts", "app.js"), "export const app = { registerExtension() {}, graph: null };");
fs.writeFileSync(path.join(dir, "scripts", "api.js"), "export const api = { addEventListener() {}, fetchApi: async () => ({ ok: false }) };");
fs.copyFileSync("PLACEMENT_JS", path.join(dir, "ext", "pack", "placement.js"));
globalThis.window = globalThis; globalThis.document = { getElementById: () => null, createElement: () => ({ style: {} }), head: { appendChild() {} } };
globalThis.setInterval = () => 0;
const { phaseBars } = await import(path.join(dir, "ext", "pack", "placement.js"));
const plan = JSON.parse(fs.readFileSync(0, "utf8"));
const bars = phaseBars(plan, null).map((b) => ({ device: b.device.name, phase: b.phase, planned: b.resident + b.ring + b.work }));
fs.rmSync(dir, { recursive: true, force: true });
process.stdout.write(JSON.stringify(bars));
"""


@pytest.mark.parametrize("way", ["explicit", "auto_fit"])
def test_bars_and_measured_line_show_one_planned_figure(way):
    p = plans()[way]
    decode = {"cuda1": 5 * MiB + 12345}             # a rehearsed decode's bytes
    ran = with_calls(json.loads(p.to_json()), {"decode": decode})
    planned = planned_by_phase(ran)
    assert planned["cuda1"]["decode"] == decode["cuda1"]       # the call's, not the estimate
    assert planned_by_phase(json.loads(p.to_json()))["cuda1"]["decode"] != decode["cuda1"]
    # peaks are measured on the accelerators (engine ledger, CUDA allocator)
    peaks = {d: {ph: 1 * MiB for ph in phases if ph in ("sample", "decode")}
             for d, phases in planned.items() if d != "cpu"}
    lines = render_measured({"run": 1, "sample": None, "decode": None, "peaks": peaks,
                             "planned_bytes": planned})
    bars = bars_in_js(ran)
    drawn = {(b["device"], b["phase"]): b["planned"] for b in bars}
    checked = 0
    for dev, phases in peaks.items():
        for phase in phases:
            assert drawn[(dev, phase)] == planned[dev][phase], (dev, phase, drawn, planned)
            assert f"{dev} {phase} 1.00 MiB (planned {short_bytes(drawn[(dev, phase)])})" \
                in lines[-1], lines
            checked += 1
    assert checked >= 2 and ("cuda1", "decode") in drawn


def test_with_calls_keeps_planned_bytes_the_largest_phase():
    p = plans()["explicit"]
    big = 7 * 1024 * MiB
    ran = with_calls(json.loads(p.to_json()), {"decode": {"cuda1": big}})
    dev = next(d for d in ran["devices"] if d["name"] == "cuda1")
    assert dev["planned_bytes"] == big
    assert with_calls(json.loads(p.to_json()), None) == json.loads(p.to_json())

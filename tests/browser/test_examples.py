"""example_workflows/: each loads in the editor, becomes an API prompt there, and that
prompt (on the tiny models, tests/browser/examples.py's to_tiny) is accepted and run by
the real server. PLACEMENT_WRITE_EXAMPLES=1 (re)writes the files from the editor."""
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from browser_support import run_as_client  # noqa: E402
from examples import EXAMPLES, api_prompt, to_tiny  # noqa: E402

FOLDER = Path(__file__).resolve().parents[2] / "example_workflows"


def write_examples(page):
    FOLDER.mkdir(exist_ok=True)
    for name, (title, _, _) in EXAMPLES.items():
        page.evaluate("(p) => window.__app.loadApiJson(p, 'example.json')", api_prompt(name))
        page.wait_for_timeout(500)
        graph = page.evaluate("""(title) => { const g = window.__app.graph.serialize();
            g.extra = {...(g.extra ?? {}), title}; return g; }""", title)
        # the Note naming the workflow's files (docs/examples.md) is kept from the file
        old = FOLDER / f"{name}.json"
        for note in (json.loads(old.read_text())["nodes"] if old.is_file() else []):
            if note["type"] in ("Note", "MarkdownNote"):
                graph["last_node_id"] += 1
                graph["nodes"].append({**note, "id": graph["last_node_id"]})
        (FOLDER / f"{name}.json").write_text(json.dumps(graph, indent=1) + "\n")


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_loads_converts_validates_and_runs(page, server, name):
    if os.environ.get("PLACEMENT_WRITE_EXAMPLES") == "1" and name == sorted(EXAMPLES)[0]:
        write_examples(page)
    path = FOLDER / f"{name}.json"
    assert path.is_file(), f"missing {path}"
    workflow = json.loads(path.read_text())
    page.evaluate("(w) => window.__app.loadGraphData(w, true, true, 'example')", workflow)
    page.wait_for_timeout(600)
    prompt = page.evaluate("async () => (await window.__app.graphToPrompt()).output")
    kinds = {n["class_type"] for n in prompt.values()}
    assert {"PlacementBackendAssignment", "PlacementApply", "KSampler"} <= kinds
    # what the workflow asks of placement arrives unchanged
    assign = next(n for n in prompt.values() if n["class_type"] == "PlacementBackendAssignment")
    for key, value in EXAMPLES[name][1].items():
        assert assign["inputs"][key] == value, (key, assign["inputs"])
    # sent as this editor's client: the run's UI output and measured figures reach the
    # loaded graph (same node ids), which draws them
    pid, status = run_as_client(page, server, to_tiny(prompt), name)
    assert status["status_str"] == "success", status["messages"][-2:]
    if name == "layer_split_with_a_worker":
        # no worker answered (the test names a loopback port nothing listens on): the
        # workflow ran here, and Backend Assignment says so in one line
        from browser_support import get_json
        shown = json.dumps(get_json(server["url"] + f"/history/{pid}")[pid]["outputs"]["10"])
        assert "worker w1 (127.0.0.1:1)" in shown and "planned without it" in shown, shown
        page.wait_for_timeout(600)
        page.shots.joinpath("13_example_worker.png").write_bytes(page.screenshot())
    if name == "layer_split_two_gpus":
        page.wait_for_timeout(800)
        for close in page.locator(".p-toast-close-button").all():   # the missing-model toast
            close.click()
        page.evaluate("""() => { const a = window.__app, c = a.canvas;
            const n = a.graph._nodes.find((n) => n.comfyClass === 'PlacementApply');
            c.ds.scale = 0.9; c.ds.offset = [-n.pos[0] + 380, -n.pos[1] + 80]; c.setDirty(true, true); }""")
        page.wait_for_timeout(400)
        page.shots.joinpath("11_example_layer_split.png").write_bytes(page.screenshot())
        drawn = page.evaluate("""() => { const n = window.__app.graph._nodes.find(
            (n) => n.comfyClass === 'PlacementApply'); const st = window.comfyPlacement.state(n);
            return {bars: window.comfyPlacement.phaseBars(st.plan).map((b) => [b.device.name,
                    b.phase, b.resident + b.ring + b.work]), phases: st.plan.device_phases,
                    measured: st.shown?.measured}; }""")
        bars = {(d, p): b for d, p, b in drawn["bars"]}
        # the split drawn on both GPUs in the sampling phase, each bar the planner's figure
        assert ("cuda0", "sample") in bars and ("cuda1", "sample") in bars, drawn
        assert bars == {(d, p): b for d, ph in drawn["phases"].items() for p, b in ph.items()
                        if b}, drawn
        assert drawn["measured"], "no measured figures after the run"

"""The editor in a real browser: the cache holds, search finds the nodes, the device
picker writes the grammar, the plan is drawn before and after a run, a bad spec is a
node error naming the fault, a fallback raises one toast and marks the node."""
import json
import os
import time

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from browser_support import get_json  # noqa: E402

# The test server (a session fixture, started after collection) inherits this process's
# environment. With the shared secret set, a named worker nobody runs is "cannot
# connect"; without it the pool says "no shared secret" before it tries to connect.
os.environ.setdefault("COMFYUI_PLACEMENT_SECRET", "placement-browser-tests")

# drawn on the canvas, which each renderer does its own way on each frontend: all four
# combinations (tests/browser/conftest.py); the rest run in two
ALL_FOUR = {"test_device_picker_writes_the_grammar",
            "test_fallback_is_one_toast_and_a_marked_node",
            "test_auto_fit_plan_is_drawn_per_device_and_phase",
            "test_measured_figures_appear_after_a_run_and_agree_with_the_log"}

BASE_INPUTS = {"backend": "", "params_backend": "", "max_vram": "", "split_mode": "",
               "stream_layers": False, "auto_fit": False, "offload_mode": "auto",
               "offload_to_cpu": False, "clip_on_cpu": False, "vae_on_cpu": False,
               "control_net_cpu": False, "strict": False, "lora_mode": "auto", "workers": ""}


def api_prompt(backend="vae=cpu,diffusion=cuda0", strict=False, **extra):
    inputs = {**BASE_INPUTS, "backend": backend, "strict": strict, **extra}
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "tiny_flux.safetensors",
                                                     "weight_dtype": "default"}},
        "2": {"class_type": "VAELoader", "inputs": {"vae_name": "tiny_taesd.safetensors"}},
        "3": {"class_type": "PlacementTestConditioning", "inputs": {"seed": 1}},
        "4": {"class_type": "PlacementTestConditioning", "inputs": {"seed": 2}},
        "5": {"class_type": "EmptySD3LatentImage",
              "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "10": {"class_type": "PlacementBackendAssignment", "inputs": inputs},
        "11": {"class_type": "PlacementApply",
               "inputs": {"placement": ["10", 0], "model": ["1", 0], "vae": ["2", 0]}},
        "6": {"class_type": "KSampler", "inputs": {
            "model": ["11", 0], "seed": 3, "steps": 2, "cfg": 1.0,
            "sampler_name": "euler", "scheduler": "simple", "positive": ["3", 0],
            "negative": ["4", 0], "latent_image": ["5", 0], "denoise": 1.0}},
        "7": {"class_type": "VAEDecode", "inputs": {"samples": ["6", 0], "vae": ["11", 2]}},
        "8": {"class_type": "PreviewImage", "inputs": {"images": ["7", 0]}},
        "9": {"class_type": "PlacementDevices", "inputs": {}},
    }


def load(page, prompt):
    page.evaluate("(p) => window.__app.loadApiJson(p, 'placement-test.json')", prompt)
    page.wait_for_timeout(500)
    # seeds fixed (the editor's default randomizes them after each queue: that is a
    # changed input, not the cache failing)
    page.evaluate("""() => { for (const n of window.__app.graph._nodes)
        for (const w of n.widgets ?? []) if (w.name === 'control_after_generate')
          w.value = 'fixed'; }""")
    page.evaluate("() => { const c = window.__app.canvas; c.ds.scale = 0.8; "
                  "c.ds.offset = [20, 20]; c.setDirty(true, true); }")
    page.wait_for_timeout(300)


def focus(page, type_):
    """Scroll the canvas so the node of this type is at the top left."""
    page.evaluate("""(t) => { const a = window.__app, n = a.graph._nodes.find((n) => n.comfyClass === t);
        const c = a.canvas; c.ds.scale = 1.0; c.ds.offset = [-n.pos[0] + 80, -n.pos[1] + 60];
        c.setDirty(true, true); }""", type_)
    page.wait_for_timeout(400)


def graph_prompt(page):
    return page.evaluate("async () => (await window.__app.graphToPrompt())")


def queue(page, timeout=180):
    """Queue the graph in the editor; wait for its end; the events of this run."""
    page.evaluate("() => { window.__events = []; }")
    t0 = time.time()
    page.evaluate("() => window.__app.queuePrompt(0, 1)")
    page.wait_for_function(
        "() => window.__events.some(([t]) => t === 'execution_success' || "
        "t === 'execution_error')", timeout=timeout * 1000)
    seconds = time.time() - t0
    events = page.evaluate("() => window.__events")
    executed = [d if isinstance(d, str) else d.get("node") for t, d in events
                if t == "executing" and d and (isinstance(d, str) or d.get("node"))]
    cached = [n for t, d in events if t == "execution_cached" for n in d.get("nodes", [])]
    return {"events": events, "executed": executed, "cached": cached, "seconds": seconds,
            "ok": any(t == "execution_success" for t, _ in events)}


def node_of(page, type_):
    return page.evaluate(
        "(t) => window.__app.graph._nodes.find((n) => n.comfyClass === t).id", type_)


def view(page, type_):
    """What the node's view shows: its text as the user sees and copies it, and whether
    it is on screen (a DOM element inside the node in either renderer)."""
    return page.evaluate("""(t) => { const n = window.__app.graph._nodes.find((n) => n.comfyClass === t);
        const el = n.__placement?.el; if (!el) return {text: "", visible: false};
        const r = el.getBoundingClientRect();
        return {text: el.innerText, visible: el.isConnected && r.width > 50 && r.height > 10,
                clipped: el.scrollHeight - el.clientHeight > 2}; }""", type_)


def test_the_cache_holds_and_nothing_shown_is_serialized(page, server):
    load(page, api_prompt())
    page.shots.joinpath("01_loaded_before_run.png").write_bytes(page.screenshot())
    first = queue(page)
    assert first["ok"], first["events"][-3:]
    page.wait_for_timeout(500)
    page.shots.joinpath("02_plan_after_run.png").write_bytes(page.screenshot())
    # the plan arrived as UI output and is drawn from the plan JSON
    drawn = page.evaluate("""() => { const n = window.__app.graph._nodes.find(
        (n) => n.comfyClass === 'PlacementApply');
        const st = window.comfyPlacement.state(n);
        return {plan: st.plan, bars: window.comfyPlacement.phaseBars(st.plan)}; }""")
    assert drawn["plan"]["components"]["diffusion"]["runtime"] == ["cuda0"]
    # shown as text inside the node, in whichever renderer is on
    shown = view(page, "PlacementApply")
    assert shown["visible"] and "diffusion: runs on cuda0" in shown["text"], shown
    assert "cuda0 sample" in shown["text"] and "planned " in shown["text"], shown
    assert not shown["clipped"], "the node did not grow to show its whole view"
    # a bar where a component computes on a device the plan counts (planned bytes); each
    # device's largest bar is the table's planned bytes for it
    assert {(b["device"]["name"], b["phase"]) for b in drawn["bars"]} >= {("cuda0", "sample")}
    largest = {}
    for b in drawn["bars"]:
        name = b["device"]["name"]
        largest[name] = max(largest.get(name, 0), b["resident"] + b["ring"] + b["work"])
    planned = {d["name"]: d["planned_bytes"] for d in drawn["plan"]["devices"]}
    assert largest == {n: p for n, p in planned.items() if p}, (largest, planned)
    # nothing the pack displays goes back: not in the API prompt, not in the workflow
    sent = graph_prompt(page)
    text = json.dumps(sent)
    assert "placement_plan" not in text and "schema v1" not in text
    assert "resident_bytes" not in text and "free_bytes" not in text
    assert sent["output"]["10"]["inputs"].keys() <= set(BASE_INPUTS)
    second = queue(page)
    assert second["ok"]
    pack_and_loaders = {"1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11"}
    assert second["executed"] == [], second["executed"]     # nothing ran again
    assert pack_and_loaders <= set(second["cached"]), second["cached"]
    focus(page, "PlacementBackendAssignment")
    page.shots.joinpath("03_second_run_cached.png").write_bytes(page.screenshot())
    (page.shots / "second_run.json").write_text(json.dumps(
        {"first": {"executed": len(first["executed"]), "seconds": round(first["seconds"], 2)},
         "second": {"executed": len(second["executed"]), "cached": len(second["cached"]),
                    "seconds": round(second["seconds"], 2)}}))
    print(f"first run: {len(first['executed'])} nodes executed in {first['seconds']:.2f} s; "
          f"second run: {len(second['executed'])} executed, {len(second['cached'])} cached, "
          f"{second['seconds']:.2f} s")


def test_search_finds_the_nodes(page):
    words = ["gpu", "vram", "offload", "multi-gpu", "block swap", "device", "placement",
             "low vram"]
    # the frontend searches name, display_name and search_aliases (fuse): the defs
    info = get_json(page.url.rstrip("/") + "/object_info")
    ours = {k: v for k, v in info.items() if k.startswith("Placement") and
            k != "PlacementTestConditioning"}
    for word in words:
        hits = [k for k, v in ours.items()
                if any(word in a for a in v.get("search_aliases") or [])]
        assert hits, word
    # and in the editor's node library (n), whose search reads the same fields
    page.locator("button[aria-label^='Node Library']").first.click()
    # 'Search...' on the pinned frontend, 'Search Nodes...' on 1.58
    box = page.locator("input[placeholder^='Search']:visible").first
    box.wait_for(timeout=10000)
    for word, shot in (("vram", "04_search_vram.png"), ("block swap", "05_search_block_swap.png"),
                       ("multi-gpu", None), ("offload", None)):
        box.fill(word)
        page.wait_for_timeout(800)
        listed = page.evaluate("""() => {
            const i = [...document.querySelectorAll("input[placeholder^='Search']")]
                .find((e) => e.offsetParent !== null);
            // the library's panel: the widest ancestor of the box that is still a side panel
            let panel = i;
            for (let p = i.parentElement; p && p.getBoundingClientRect().width < 700; p = p.parentElement)
                panel = p;
            const hit = [...panel.querySelectorAll('*')].find((e) => e.children.length === 0 &&
                e.textContent.trim() === 'Apply Placement');
            hit?.scrollIntoView(); return panel.innerText; }""")
        if shot:
            page.shots.joinpath(shot).write_bytes(page.screenshot())
        assert "Apply Placement" in listed and "Backend Assignment" in listed, (word, listed[-800:])


def test_device_picker_writes_the_grammar(page, server):
    inv = get_json(server["url"] + "/placement/devices")
    assert [d["name"] for d in inv["devices"]] == ["cuda0", "cuda1", "cpu"]
    assert "cuda0&cuda1" in inv["runtime"] and "disk" in inv["params"]
    sim = get_json(server["url"] + "/placement/devices?simulate=cuda0=24GiB,cuda1=12GiB,cuda2=8GiB")
    assert "cuda0&cuda1&cuda2" in sim["runtime"]
    load(page, api_prompt(backend="te=cpu"))
    nid = node_of(page, "PlacementBackendAssignment")
    focus(page, "PlacementBackendAssignment")
    page.locator(f".placement-view[data-node-id='{nid}'] .pl-pick").click()
    page.wait_for_selector("#placement-picker")
    # ComfyUI shows GPU 0 only (the server runs with CUDA_VISIBLE_DEVICES=0): said, with
    # the flag that lifts it
    notice = page.locator("#placement-picker .placement-pick-notice").inner_text()
    assert "CUDA_VISIBLE_DEVICES=0" in notice and "--cuda-device all" in notice, notice
    page.select_option(".placement-pick-backend-diffusion", "cuda0&cuda1")
    page.select_option(".placement-pick-params_backend-vae", "disk")
    page.shots.joinpath("06_device_picker.png").write_bytes(page.screenshot())
    page.click("#placement-pick-apply")
    values = page.evaluate("""(id) => Object.fromEntries(window.__app.graph.getNodeById(id)
        .widgets.map((w) => [w.name, w.value]))""", nid)
    assert values["backend"] == "te=cpu,diffusion=cuda0&cuda1", values
    assert values["params_backend"] == "vae=disk", values
    sent = graph_prompt(page)["output"][str(nid)]["inputs"]
    assert sent["backend"] == "te=cpu,diffusion=cuda0&cuda1"
    # typed grammar still works: the API prompt validates as typed
    r = get_json(server["url"] + "/prompt", {"prompt": api_prompt(backend="te=cpu,diffusion=cuda:0"),
                                              "client_id": "typed"})
    assert r.get("prompt_id") and not r.get("node_errors"), r


def test_bad_spec_is_one_clear_error(page, server):
    load(page, api_prompt(backend="te=cpu,diffusion=cuda7", strict=True))
    page.evaluate("() => window.__app.queuePrompt(0, 1).catch(() => null)")
    page.wait_for_timeout(2500)
    focus(page, "PlacementBackendAssignment")
    page.wait_for_timeout(300)
    page.shots.joinpath("07_bad_spec.png").write_bytes(page.screenshot())
    errors = page.evaluate("""() => { const e = window.__app.lastNodeErrors ??
        window.comfyAPI?.app?.app?.lastNodeErrors; return e; }""")
    req = urllib_post(server["url"], api_prompt(backend="te=cpu,diffusion=cuda7", strict=True))
    # the server holds ONE error, on the input that is wrong, naming the real fault
    assert list(req["node_errors"]) == ["10"], req["node_errors"]
    errs = req["node_errors"]["10"]["errors"]
    assert len(errs) == 1, errs
    assert errs[0]["extra_info"]["input_name"] == "backend", errs
    details = errs[0]["details"]
    assert "cuda7" in details and "unknown" in details and "cuda0, cuda1, cpu" in details
    # not strict, the same spec is no error: it falls back (test_fallback_...)
    ok = urllib_post(server["url"], api_prompt(backend="te=cpu,diffusion=cuda7", strict=False))
    assert ok.get("prompt_id") and not ok.get("node_errors"), ok
    # a malformed spec is one error too, whatever else the node says
    bad = urllib_post(server["url"], api_prompt(backend="te=cpu,diffusion=cuda0&",
                                                split_mode="layer"))
    errs = bad["node_errors"]["10"]["errors"]
    assert len(errs) == 1 and "backend" in errs[0]["details"], errs
    # the editor shows the message itself in the node, once (drawn from its node errors)
    drawn = page.evaluate("""(id) => window.comfyPlacement.state(
        window.__app.graph.getNodeById(id)).shown.errors""", node_of(page, "PlacementBackendAssignment"))
    assert len(drawn) == 1 and "cuda7" in drawn[0] and "unknown" in drawn[0], drawn
    shown = view(page, "PlacementBackendAssignment")
    assert shown["visible"] and shown["text"].count("cuda7") == 1, shown
    assert not shown["clipped"], "the node did not grow to show its whole view"


def urllib_post(url, prompt):
    import urllib.error
    try:
        return get_json(url + "/prompt", {"prompt": prompt, "client_id": "t"})
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


def test_fallback_is_one_toast_and_a_marked_node(page):
    load(page, api_prompt(backend="cuda"))
    run = queue(page)
    assert run["ok"]
    page.wait_for_timeout(800)
    focus(page, "PlacementApply")
    page.shots.joinpath("08_fallback_toast.png").write_bytes(page.screenshot())
    # one toast (the frontends mark toasts up differently: found by its summary)
    fell = page.evaluate("""() => [...document.querySelectorAll('*')]
        .filter((e) => e.children.length === 0 && e.textContent.trim() === 'Placement fell back')
        .map((e) => { let p = e; while (p && !p.innerText.includes('ambiguous')
                                             && p !== document.body) p = p.parentElement;
                      return p ? p.innerText : ''; })""")
    assert len(fell) == 1, fell
    assert "ambiguous" in fell[0], fell
    warnings = page.evaluate("""() => window.__app.graph._nodes.filter((n) => n.__placement)
        .map((n) => [n.comfyClass, n.__placement.fallbacks])""")
    marked = [c for c, w in warnings if w]
    assert "PlacementApply" in marked, warnings
    # the line is in the node itself, structured (component, asked, used, why)
    shown = view(page, "PlacementApply")
    assert shown["visible"] and "fell back: " in shown["text"], shown
    assert "backend cuda -> runs on" in shown["text"] and "ambiguous" in shown["text"], shown


def test_auto_fit_plan_is_drawn_per_device_and_phase(page):
    load(page, api_prompt(backend="", auto_fit=True, max_vram="cuda0=0.004,cuda1=0.004"))
    focus(page, "PlacementApply")
    page.shots.joinpath("09_autofit_before_run.png").write_bytes(page.screenshot())
    run = queue(page)
    assert run["ok"], run["events"][-3:]
    page.wait_for_timeout(600)
    focus(page, "PlacementApply")
    page.shots.joinpath("10_autofit_after_run.png").write_bytes(page.screenshot())
    got = page.evaluate("""() => { const n = window.__app.graph._nodes.find(
        (n) => n.comfyClass === 'PlacementApply'); const st = window.comfyPlacement.state(n);
        return {plan: st.plan, bars: window.comfyPlacement.phaseBars(st.plan)}; }""")
    table = {r["name"]: r for r in got["plan"]["device_table"]}
    assert got["bars"], got["plan"]["components"]
    fitc, comps = got["plan"]["fit"]["components"], got["plan"]["components"]
    for bar in got["bars"]:     # the drawing's figures are the plan's own
        name, used = bar["device"]["name"], table[bar["device"]["name"]]["phases"][bar["phase"]]
        # working memory: the planner's for what runs there, drawn whole (never clipped
        # to fit the bar), and the rest split into parts that are none of them negative
        work = sum(fitc[c]["headroom_bytes"] for c in bar["who"] if name in comps[c]["runtime"])
        assert bar["work"] == work and bar["ring"] >= 0 and bar["resident"] >= 0, (bar, used)
        assert bar["resident"] + bar["ring"] + bar["work"] == used, (bar, used)
    assert any(b["work"] > 0 for b in got["bars"] if b["phase"] == "sample"), got["bars"]
    assert {b["phase"] for b in got["bars"]} >= {"sample", "decode"}
    # a plan over several GPUs says that ComfyUI hides the others, in the node
    shown = view(page, "PlacementApply")
    assert "--cuda-device all" in shown["text"], shown
    devices = view(page, "PlacementDevices")
    assert "CUDA_VISIBLE_DEVICES=0" in devices["text"], devices
    assert got["plan"]["fit"]["predicted"]["step_s"] > 0
    # predicted and measured side by side, each prediction printed as the text report
    # prints it (one source: the plan JSON, one format)
    seen = page.evaluate("""() => { const st = window.comfyPlacement.state(window.__app.graph
        ._nodes.find((n) => n.comfyClass === 'PlacementApply'));
        return {predicted: st.shown.predicted, measured: st.shown.measured, text: st.text}; }""")
    step = seen["predicted"].split("predicted ")[1].split(" per sampling step")[0]
    gen = seen["predicted"].split(", ")[1].split(" per generation")[0]
    text = " ".join(seen["text"].split())           # the report wraps at 100 columns
    assert f"predicted: {step} per sampling step" in text, text
    assert f"{gen} per generation" in text, text
    assert f"predicted {step} per sampling step" in seen["measured"][0], seen["measured"]
    assert f"predicted {gen} (encode" in seen["measured"][1], seen["measured"]


def test_old_workflows_still_load(page):
    """A workflow saved with the old plan text box: its value trails the schema's widget
    values (Backend Assignment) or is the only one (Apply Placement, Placement Devices);
    it lands where the optional `workers` input is now, and is dropped. A workflow saved
    after the text box went but before `workers` existed loads with workers empty."""
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "example_workflows" / "layer_split_two_gpus.json"
    def saved_before_workers():
        """The template as the editor saved it before `workers` existed: its value and
        its input entry were not there."""
        graph = json.loads(path.read_text())
        for n in graph["nodes"]:
            if n["type"] == "PlacementBackendAssignment":
                n["widgets_values"] = list(n["widgets_values"])[:13]
                n["inputs"] = [i for i in n.get("inputs", []) if i.get("name") != "workers"]
        return graph
    saved = saved_before_workers()
    before_workers = next(n["widgets_values"] for n in saved["nodes"]
                          if n["type"] == "PlacementBackendAssignment")
    # the schema's widgets in order, as a workflow saved before `workers` lists them
    order = ["backend", "params_backend", "max_vram", "split_mode", "stream_layers",
             "auto_fit", "offload_mode", "offload_to_cpu", "clip_on_cpu", "vae_on_cpu",
             "control_net_cpu", "strict", "lora_mode"]
    assert len(before_workers) == len(order), before_workers
    expected = {**dict(zip(order, before_workers)), "workers": ""}
    old_text = "placement plan (schema v1)\n\ncomponent  runtime ..."
    workflow = saved_before_workers()
    for node in workflow["nodes"]:
        if node["type"] == "PlacementBackendAssignment":
            node["widgets_values"] = list(node["widgets_values"]) + [old_text]
        if node["type"] == "PlacementApply":
            node["widgets_values"] = [old_text]
    # Placement Devices, as saved then: no input, the text box's value alone
    workflow["nodes"].append({
        "id": 900, "type": "PlacementDevices", "pos": [0, 1200], "size": [400, 150],
        "flags": {}, "order": len(workflow["nodes"]), "mode": 0, "inputs": [],
        "outputs": [{"name": "devices", "type": "STRING", "links": None}],
        "properties": {}, "widgets_values": [old_text]})
    for label, graph in (("with the old text box", workflow), ("before workers", saved)):
        page.evaluate("(w) => window.__app.loadGraphData(w, true, true, 'old')", graph)
        page.wait_for_timeout(600)
        sent = page.evaluate("async () => (await window.__app.graphToPrompt())")
        text = json.dumps(sent)
        assert "schema v1" not in text, label
        assign = next(n for n in sent["output"].values()
                      if n["class_type"] == "PlacementBackendAssignment")
        assert assign["inputs"]["backend"] == "te=cpu,diffusion=cuda0&cuda1"
        assert assign["inputs"]["split_mode"] == "layer"
        assert set(assign["inputs"]) <= set(BASE_INPUTS)
        # every widget in its place, workers empty (in the prompt and on the node)
        assert assign["inputs"] == expected, (label, assign["inputs"])
        widgets = page.evaluate("""() => window.__app.graph._nodes.filter((n) =>
            n.comfyClass === 'PlacementBackendAssignment' || n.comfyClass === 'PlacementDevices')
            .map((n) => [n.comfyClass, n.widgets.find((w) => w.name === 'workers')?.value])""")
        assert widgets and all(v == "" for _, v in widgets), (label, widgets)
        if graph is workflow:
            devices = next(n for n in sent["output"].values()
                           if n["class_type"] == "PlacementDevices")
            assert devices["inputs"].get("workers", "") == "", devices


def test_measured_figures_appear_after_a_run_and_agree_with_the_log(page, server):
    """After a run the node shows what it measured (seconds per step and generation,
    peak bytes per device and phase) beside the plan; the lines drawn are the server's
    log lines, and each bar's measured peak is the record's figure."""
    load(page, api_prompt(backend="vae=cuda1,diffusion=cuda0", **{"max_vram": "cuda1=1"}))
    state = """() => { const n = window.__app.graph._nodes.find((n) => n.comfyClass === 'PlacementApply');
        const st = window.comfyPlacement.state(n);
        return {measured: st.measured, drawn: st.shown?.measured ?? [], labels: st.shown?.bars ?? [],
                plan: st.plan}; }"""
    before = page.evaluate(state)
    assert before["measured"] is None and before["drawn"] == []
    run = queue(page)
    assert run["ok"], run["events"][-3:]
    page.wait_for_timeout(800)
    focus(page, "PlacementApply")
    page.shots.joinpath("12_measured_after_run.png").write_bytes(page.screenshot())
    got = page.evaluate(state)
    rec = got["measured"]
    assert rec is not None, "no measured record after the run"
    assert rec["sample"]["steps"] == 2 and rec["sample"]["seconds"] > 0
    assert rec["decode"]["seconds"] > 0
    assert abs(rec["generation_s"] - rec["sample"]["seconds"] - rec["decode"]["seconds"]) < 1e-9
    # peaks from the engine's ledger on both simulated devices, each in its own phase
    assert rec["peaks"]["cuda0"]["sample"] > 0 and rec["peaks"]["cuda1"]["decode"] > 0
    # the node draws exactly the lines the server logged
    assert got["drawn"] == rec["lines"] and len(rec["lines"]) == 3, got["drawn"]
    log = server["log"].read_text()
    for line in rec["lines"]:
        assert line in log, (line, log[-2000:])
    # a bar's measured peak is the logged figure, to the digit
    bar = next(b for b in got["labels"] if b["device"] == "cuda0" and b["phase"] == "sample")
    peak_text = bar["label"].split("measured peak ")[1]
    assert f"cuda0 sample {peak_text}" in rec["lines"][-1], (bar, rec["lines"])
    # the measured line compares the peak with the plan that ran: the node's plan made
    # again at the first model call with the working memory rehearsed there (the node
    # shows that plan's table too, sent when sampling started)
    ran = page.evaluate("""() => window.comfyPlacement.state(window.__app.graph._nodes.find(
        (n) => n.comfyClass === 'PlacementApply')).ranText""")
    assert "plan that ran" in ran and "rehearsed at this run's first model call" in ran, ran
    ran_row = next(l for l in ran.splitlines() if l.startswith("cuda0 "))
    ran_planned = rec["lines"][-1].split("cuda0 sample ")[1].split("(planned ")[1].split(")")[0]
    assert ran_planned in ran_row, (ran_planned, ran_row)
    assert f"cuda0 sample {peak_text} (planned {ran_planned})" in rec["lines"][-1], rec["lines"]
    # one planned figure per phase (issue 29 item 3): after the run each bar's planned
    # figure is the plan that ran, the same as the measured line's, not the node-time one
    planned = bar["label"].split("planned ")[1].split(" of ")[0]
    assert planned == ran_planned, (bar["label"], rec["lines"][-1])
    # nothing measured goes back into the prompt
    assert "measured" not in json.dumps(graph_prompt(page))


def test_a_reloaded_page_shows_the_plan_again_after_a_cached_run(page):
    """After a page reload the editor has no node output; a run that ComfyUI serves
    entirely from its cache sends the kept UI output again (Backend Assignment is an
    output node, Apply Placement has intermediate output), so both nodes show the plan."""
    from conftest import ready
    load(page, api_prompt())
    first = queue(page)
    assert first["ok"], first["events"][-3:]
    page.reload()
    ready(page)
    page.wait_for_timeout(500)
    before = {t: view(page, t)["text"] for t in ("PlacementBackendAssignment", "PlacementApply")}
    assert all("runs on" not in text for text in before.values()), before
    again = queue(page)
    assert again["ok"] and again["executed"] == [], again["executed"]
    page.wait_for_timeout(600)
    for t, shot in (("PlacementBackendAssignment", "13_reloaded_assignment.png"),
                    ("PlacementApply", "14_reloaded_apply.png")):
        focus(page, t)                # a DOM view off screen is hidden in the classic canvas
        page.shots.joinpath(shot).write_bytes(page.screenshot())
        shown = view(page, t)
        assert shown["visible"] and "diffusion: runs on cuda0" in shown["text"], (t, shown)

"""A workflow whose Backend Assignment names a REAL worker process runs from the editor
and gives the image of the same workflow run locally.

A worker (`python -m comfyui_placement worker`, ComfyUI's Python, the test server's tiny
models, ComfyUI's compute flags of the server) listens on loopback; the workflow, loaded
in the editor and queued there, splits the diffusion model's blocks over this machine's
(simulated) cuda0 and the worker's cpu. Its image is, pixel for pixel, the image of the
same workflow without the worker. Apply Placement shows the plan over w1.cpu, with no
notice that the worker was left out and nothing fallen back; Placement Devices, given the
same workers text, lists the worker's device. Two combinations (conftest's TWO)."""
import io
import os
import select
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "integration"))
from browser_support import COMFY_FLAGS, free_port, get_json  # noqa: E402
from harness import COMFYUI_PATH, comfy_python  # noqa: E402
from test_editor import (api_prompt, focus, graph_prompt, load, node_of, queue,  # noqa: E402
                         urllib_post, view)

# The test server (a session fixture, started after collection) inherits this process's
# environment; the worker is given the same value explicitly (the shared secret).
os.environ.setdefault("COMFYUI_PLACEMENT_SECRET", "placement-browser-tests")

LOCAL = "vae=cpu,diffusion=cuda0"
SPLIT = "vae=cpu,diffusion=cuda0&w1.cpu"        # cuda0 is simulated here: it computes on cpu
# the tiny Flux's blocks in order (make_models.py: depth 2, depth_single_blocks 2), as the
# worker's log names a range
BLOCKS = ["double_blocks.0", "double_blocks.1", "single_blocks.0", "single_blocks.1"]


@pytest.fixture
def worker(server):
    """A worker process serving the test server's models; killed at the end."""
    base = Path(server["base"])
    log_path = base / f"worker_{time.monotonic_ns()}.log"
    log = open(log_path, "w+")
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "COMFYUI_PLACEMENT_SECRET": os.environ["COMFYUI_PLACEMENT_SECRET"]}
    env.pop("COMFYUI_PLACEMENT_SIMULATE", None)          # the worker offers its own cpu
    proc = subprocess.Popen(
        [comfy_python(), "-m", "comfyui_placement", "worker", "--listen", "127.0.0.1:0",
         "--models", str(base / "models"), "--comfyui", COMFYUI_PATH,
         "--comfyui-args=" + " ".join(COMFY_FLAGS)],
        stdout=subprocess.PIPE, stderr=log, env=env, text=True, cwd=str(base))

    def logs():
        log.flush()
        return log_path.read_text()
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 180)
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("listening on "):
            pytest.fail(f"the worker did not start: {line!r}\n{logs()[-3000:]}")
        yield {"address": line.split()[-1], "logs": logs}
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()
        log.close()


def run_in_editor(page, server, prompt, label):
    """Load `prompt` in the editor, queue it there (as the editor's client) and return
    its history record, with the PNG bytes of its PreviewImage."""
    load(page, prompt)
    run = queue(page, timeout=240)
    assert run["ok"], (label, run["events"][-3:])
    pid = next(d["prompt_id"] for t, d in run["events"] if t == "execution_start")
    for _ in range(150):                      # the history is written just after the end
        hist = get_json(server["url"] + f"/history/{pid}")
        if pid in hist and hist[pid].get("status", {}).get("completed"):
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"{label}: no history for {pid}")
    record = hist[pid]
    sent = record["prompt"][2]
    assert sent["10"]["inputs"]["workers"] == prompt["10"]["inputs"]["workers"], sent["10"]
    (image,) = record["outputs"]["8"]["images"]
    query = urllib.parse.urlencode({k: image[k] for k in ("filename", "subfolder", "type")})
    with urllib.request.urlopen(f"{server['url']}/view?{query}", timeout=30) as r:
        record["png"] = r.read()
    return record


def pixels(png):
    from PIL import Image, ImageStat
    img = Image.open(io.BytesIO(png))
    img.load()
    return img.mode, img.size, img.tobytes(), ImageStat.Stat(img.convert("L")).stddev[0]


def notices(page, type_):
    """The node's notice and fell-back lines, as shown."""
    return page.evaluate("""(t) => { const n = window.__app.graph._nodes.find(
        (n) => n.comfyClass === t);
        return [...n.__placement.el.querySelectorAll('.pl-notice, .pl-fallback')]
            .map((e) => e.innerText); }""", type_)


def test_a_workflow_with_a_worker_runs_from_the_editor_and_equals_the_local_run(
        page, server, worker):
    workers = f"w1={worker['address']}"
    local = run_in_editor(page, server, api_prompt(backend=LOCAL), "local")

    prompt = api_prompt(backend=SPLIT, split_mode="layer", workers=workers)
    prompt["9"]["inputs"]["workers"] = workers            # Placement Devices lists it too
    split = run_in_editor(page, server, prompt, "with the worker")
    page.wait_for_timeout(600)

    # the same image, decoded pixel for pixel: the worker computes its blocks with the
    # server's ComfyUI flags (--comfyui-args), on the same tiny models
    # (a worker given --use-pytorch-cross-attention besides them differs: tried)
    mode, size, got, spread = pixels(split["png"])
    want = pixels(local["png"])
    assert (mode, size) == want[:2], ((mode, size), want[:2])
    assert spread > 0, "a flat image proves nothing"
    differ = [abs(a - b) for a, b in zip(got, want[2]) if a != b]
    assert not differ, (f"the run with the worker differs from the local run: "
                        f"{len(differ)} of {len(got)} bytes, by up to {max(differ)}\n"
                        + worker["logs"]()[-3000:])

    # the worker joined once and computed the plan's last blocks of the diffusion model
    plan = page.evaluate("""() => window.comfyPlacement.state(window.__app.graph._nodes
        .find((n) => n.comfyClass === 'PlacementApply')).plan""")
    diffusion = plan["components"]["diffusion"]
    assert diffusion["runtime"] == ["cuda0", "w1.cpu"], diffusion
    first, last = diffusion["blocks"]["w1.cpu"]
    assert 1 <= first <= last == len(BLOCKS) - 1, diffusion
    log = worker["logs"]()
    assert log.count("joined; rank 1") == 1, log[-3000:]
    loaded = f"tiny_flux.safetensors blocks {BLOCKS[first]}..{BLOCKS[last]} ("
    assert loaded in log and ") on cpu" in log, (loaded, log[-3000:])

    # Apply Placement shows the plan over the worker's cpu, and no notice
    focus(page, "PlacementApply")
    page.shots.joinpath("19_worker_split_apply.png").write_bytes(page.screenshot())
    shown = view(page, "PlacementApply")
    assert shown["visible"], shown
    assert "diffusion: runs on cuda0&w1.cpu" in shown["text"], shown
    assert not shown["clipped"], "the node did not grow to show its whole view"
    # no notice that the worker was left out, nothing fell back: the one line there is
    # the test server's CUDA_VISIBLE_DEVICES=0 note, which any plan running a component
    # on several devices gets (nodes/common.py plan_ui; test_editor asserts it)
    for t in ("PlacementApply", "PlacementBackendAssignment"):
        lines = notices(page, t)
        assert all(n.startswith("⚠ ComfyUI shows only GPU 0 (CUDA_VISIBLE_DEVICES=0)")
                   for n in lines), (t, lines)
    # Placement Devices, given the same workers text, lists the worker's device
    focus(page, "PlacementDevices")
    devices = view(page, "PlacementDevices")
    assert f"worker w1 ({worker['address']}) joined: w1.cpu" in devices["text"], devices


# an unreachable worker (moved from test_editor.py: two combinations are enough here)
def unreachable_worker():
    """`w1=127.0.0.1:PORT` with a port nothing listens on (bound once, then closed): the
    server's connect is refused at once."""
    return f"w1=127.0.0.1:{free_port()}"


def test_an_unreachable_worker_is_one_line_and_the_run_goes_on(page, server):
    """strict off: the node says which worker it could not join and plans without it
    (the line in Backend Assignment and in Apply Placement); the run succeeds; the
    device picker, asked for the node's workers, says the same and offers no w1 device."""
    workers = unreachable_worker()
    where = f"worker w1 ({workers.split('=', 1)[1]})"
    load(page, api_prompt(workers=workers, strict=False))
    nid = node_of(page, "PlacementBackendAssignment")
    sent = graph_prompt(page)["output"][str(nid)]["inputs"]
    assert sent["workers"] == workers and sent["strict"] is False, sent
    run = queue(page, timeout=120)
    assert run["ok"], run["events"][-3:]
    page.wait_for_timeout(600)
    for t, shot in (("PlacementBackendAssignment", "15_worker_unreachable_assignment.png"),
                    ("PlacementApply", "16_worker_unreachable_apply.png")):
        focus(page, t)
        page.shots.joinpath(shot).write_bytes(page.screenshot())
        notices = page.evaluate("""(t) => { const n = window.__app.graph._nodes.find(
            (n) => n.comfyClass === t);
            return [...n.__placement.el.querySelectorAll('.pl-warn.pl-notice')]
                .map((e) => e.innerText); }""", t)
        mine = [n for n in notices if "worker w1" in n]
        assert len(mine) == 1, (t, notices)
        assert where in mine[0] and "cannot connect" in mine[0], (t, mine)
        assert mine[0].rstrip().endswith("planned without it"), (t, mine)
        shown = view(page, t)
        assert shown["visible"] and mine[0] in shown["text"], (t, shown)
        assert "diffusion: runs on cuda0" in shown["text"], (t, shown)
        assert not shown["clipped"], f"{t}: the node did not grow to show its whole view"
    # the picker asks GET /placement/devices?workers=<the node's workers>
    focus(page, "PlacementBackendAssignment")
    page.locator(f".placement-view[data-node-id='{nid}'] .pl-pick").click()
    page.wait_for_selector("#placement-picker .placement-pick-worker", timeout=15000)
    lines = page.locator("#placement-picker .placement-pick-worker").all_inner_texts()
    assert len(lines) == 1, lines
    assert lines[0].startswith(where) and "cannot connect" in lines[0], lines
    assert " joined: " not in lines[0], lines
    choices = page.evaluate("""() => [...document.querySelectorAll(
        '#placement-picker select option')].map((o) => o.value)""")
    assert "cuda0" in choices and not [c for c in choices if "w1." in c], choices
    page.shots.joinpath("17_picker_worker_unreachable.png").write_bytes(page.screenshot())
    box = page.evaluate("""() => { const d = document.getElementById('placement-picker');
        const r = d.getBoundingClientRect(); const l = d.querySelector('.placement-pick-worker')
        .getBoundingClientRect();
        return {inside: l.left >= r.left && l.right <= r.right && l.bottom <= r.bottom,
                onscreen: r.left >= 0 && r.right <= innerWidth && r.bottom <= innerHeight}; }""")
    assert box["inside"] and box["onscreen"], box
    page.locator("#placement-picker button", has_text="Cancel").click()


def test_an_unreachable_worker_with_strict_is_one_clear_error(page, server):
    """strict on: queueing is refused with one node error on Backend Assignment that
    names the workers input and the worker it cannot connect to."""
    workers = unreachable_worker()
    prompt = api_prompt(workers=workers, strict=True)
    load(page, prompt)
    page.evaluate("() => window.__app.queuePrompt(0, 1).catch(() => null)")
    nid = node_of(page, "PlacementBackendAssignment")
    page.wait_for_function("""(id) => window.comfyPlacement.state(
        window.__app.graph.getNodeById(id)).shown?.errors?.length > 0""", arg=nid,
        timeout=15000)
    focus(page, "PlacementBackendAssignment")
    page.wait_for_timeout(300)
    page.shots.joinpath("18_worker_unreachable_strict.png").write_bytes(page.screenshot())
    req = urllib_post(server["url"], prompt)
    assert list(req["node_errors"]) == ["10"], req["node_errors"]
    errs = req["node_errors"]["10"]["errors"]
    assert len(errs) == 1, errs
    details = errs[0]["details"]
    where = f"worker w1 ({workers.split('=', 1)[1]})"
    assert "placement error in workers: " in details, details
    assert where in details and "cannot connect" in details, details
    assert "planned without it" not in details, details
    # the editor shows it in the node, once
    drawn = page.evaluate("""(id) => window.comfyPlacement.state(
        window.__app.graph.getNodeById(id)).shown.errors""", nid)
    assert len(drawn) == 1 and "workers" in drawn[0] and "cannot connect" in drawn[0], drawn
    shown = view(page, "PlacementBackendAssignment")
    assert shown["visible"] and shown["text"].count("cannot connect") == 1, shown
    assert not shown["clipped"], "the node did not grow to show its whole view"

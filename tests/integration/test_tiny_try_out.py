"""The try-out with no downloads, end to end against a real ComfyUI server on 127.0.0.1:

- `python <pack folder> tiny-models` (the command a Manager install has) writes the tiny
  models into a fresh models tree, keeps its own files when run again, refuses a file of
  the same name it did not write, and says one line for a wrong --comfyui;
- example_workflows/tiny_try_out.json, converted to an API prompt as "Export (API)"
  does, is POSTed to /prompt and finishes well under a minute; /history/<id> then holds,
  in Placement Report's output, the plan that ran and the measured peak;
- a prompt whose model file is missing is refused whole (HTTP 400 naming the loader),
  and one whose model file fails to load ends in status "error": Backend Assignment no
  longer runs on its own and makes such a prompt look successful.
"""
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness import COMFYUI_PATH, MARKS, PACK, comfy_python

pytestmark = MARKS

TEMPLATE = PACK / "example_workflows" / "tiny_try_out.json"
FILES = {"diffusion_models": "placement-tiny-sd3.safetensors",
         "text_encoders": "placement-tiny-clip-l.safetensors",
         "vae": "placement-tiny-sd3-vae.safetensors"}
SIMULATE = "cuda0=4GiB"
CONTROL_VALUES = {"fixed", "increment", "decrement", "randomize"}


def to_api(workflow: dict) -> dict:
    """An editor workflow as the API prompt "Export (API)" writes: node id -> class_type
    and inputs (widget values by the names of the node's widget inputs, in order; a
    link as [source id, output slot]); notes are left out."""
    links = {l[0]: (str(l[1]), l[2]) for l in workflow["links"]}
    out = {}
    for node in workflow["nodes"]:
        if node["type"] in ("Note", "MarkdownNote") or node.get("mode", 0) != 0:
            continue
        values = list(node.get("widgets_values") or [])
        inputs = {}
        for slot in node.get("inputs") or []:
            if slot.get("link") is not None:
                inputs[slot["name"]] = list(links[slot["link"]])
                if slot.get("widget"):
                    values.pop(0) if values else None
            elif slot.get("widget"):
                inputs[slot["name"]] = values.pop(0)
                if slot["name"] in ("seed", "noise_seed") and values and values[0] in CONTROL_VALUES:
                    values.pop(0)         # the editor's "control after generate" value
        out[str(node["id"])] = {"class_type": node["type"], "inputs": inputs}
    return out


def tiny_models(args, timeout=300):
    """The command as a Manager install runs it: ComfyUI's Python, the pack's folder."""
    return subprocess.run([comfy_python(), str(PACK), "tiny-models", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def http(url, body=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@pytest.fixture(scope="module")
def tree():
    base = Path(tempfile.mkdtemp(prefix="placement-tiny-"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def written(tree):
    t0 = time.perf_counter()
    proc = tiny_models(["--comfyui", COMFYUI_PATH, "--models", str(tree / "models")])
    return proc, time.perf_counter() - t0


@pytest.fixture(scope="module")
def server(tree, written):
    assert written[0].returncode == 0, written[0].stderr[-3000:]
    custom = tree / "custom_nodes"
    custom.mkdir(exist_ok=True)
    os.symlink(PACK, custom / "comfyui-placement")
    # a model file that is listed (it exists) but is no model: its loader fails at run time
    (tree / "models" / "diffusion_models" / "placement-broken.safetensors").write_bytes(b"x" * 64)
    port = _free_port()
    log = open(tree / "server.log", "w")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COMFYUI_PLACEMENT_SIMULATE": SIMULATE}
    proc = subprocess.Popen(
        [comfy_python(), "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
         "--base-directory", str(tree), "--disable-auto-launch"],
        cwd=COMFYUI_PATH, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            if proc.poll() is not None:
                break
            try:
                if http(url + "/object_info/PlacementReport", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        if proc.poll() is not None:
            raise RuntimeError("ComfyUI exited:\n" + (tree / "server.log").read_text()[-3000:])
        yield {"url": url, "log": tree / "server.log"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_and_wait(server, prompt, limit=120):
    """POST /prompt, then GET /history/<id> until it is there: (seconds, history entry)."""
    t0 = time.perf_counter()
    status, body = http(server["url"] + "/prompt", {"prompt": prompt, "client_id": "tiny-test"})
    assert status == 200 and body.get("prompt_id"), (status, body)
    pid = body["prompt_id"]
    while time.perf_counter() - t0 < limit:
        _, hist = http(f"{server['url']}/history/{pid}")
        if hist and pid in hist:
            return time.perf_counter() - t0, hist[pid]
        time.sleep(0.25)
    raise AssertionError(f"no history after {limit} s:\n" + server["log"].read_text()[-3000:])


def test_the_command_writes_the_tiny_models(tree, written):
    proc, seconds = written
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [l for l in proc.stdout.splitlines() if l.startswith("written\t")]
    assert len(lines) == 3, proc.stdout
    for folder, name in FILES.items():
        path = tree / "models" / folder / name
        assert path.is_file() and path.stat().st_size > 1_000_000, path
        assert str(path) in proc.stdout
        with open(path, "rb") as fh:     # safetensors: an 8-byte header length, a JSON header
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        meta = header["__metadata__"]
        assert "Not a real model" in meta["description"], meta
        assert json.loads(meta["comfyui_placement_tiny"])["file"] == name, meta
    # nothing but safetensors files written, no temporary left behind
    made = sorted(p.relative_to(tree / "models").as_posix()
                  for p in (tree / "models").rglob("*") if p.is_file())
    assert made == sorted(f"{f}/{n}" for f, n in FILES.items()), made
    print(f"tiny-models wrote {len(made)} files in {seconds:.1f} s")


def test_the_command_keeps_its_own_files_and_refuses_others(tree, written):
    assert written[0].returncode == 0
    again = tiny_models(["--comfyui", COMFYUI_PATH, "--models", str(tree / "models")])
    assert again.returncode == 0, again.stderr
    assert [l.split("\t")[0] for l in again.stdout.splitlines() if "\t" in l] == ["kept"] * 3
    # a file of the same name the command did not write: refused, one line, nothing written
    other = tree / "other-models"
    (other / "vae").mkdir(parents=True)
    (other / "vae" / FILES["vae"]).write_bytes(b"not ours")
    refused = tiny_models(["--comfyui", COMFYUI_PATH, "--models", str(other)])
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    err = refused.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("placement error: ") and FILES["vae"] in err[0] \
        and "not written by this command" in err[0], err
    assert (other / "vae" / FILES["vae"]).read_bytes() == b"not ours"
    assert sorted(p.name for p in other.rglob("*") if p.is_file()) == [FILES["vae"]]


@pytest.mark.parametrize("where, words", [("/nonexistent/ComfyUI", "is not a folder"),
                                          (str(PACK), "is not a ComfyUI folder")])
def test_a_wrong_comfyui_path_is_one_line(where, words):
    proc = tiny_models(["--comfyui", where], timeout=120)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, (proc.returncode, proc.stderr)
    assert err[0].startswith("placement error: --comfyui") and words in err[0], err


def test_the_tiny_template_runs_and_history_holds_the_plan_that_ran(server):
    workflow = json.loads(TEMPLATE.read_text())
    prompt = to_api(workflow)
    loaders = {n["class_type"]: n["inputs"] for n in prompt.values()
               if n["class_type"] in ("UNETLoader", "CLIPLoader", "VAELoader")}
    assert loaders["UNETLoader"]["unet_name"] == FILES["diffusion_models"]
    assert loaders["CLIPLoader"]["clip_name"] == FILES["text_encoders"]
    assert loaders["VAELoader"]["vae_name"] == FILES["vae"]
    seconds, entry = post_and_wait(server, prompt)
    print(f"tiny_try_out: POST /prompt to /history in {seconds:.1f} s")
    assert entry["status"]["status_str"] == "success", entry["status"]
    assert seconds < 60, f"the try-out took {seconds:.1f} s"
    outputs = entry["outputs"]
    report_id = next(k for k, n in prompt.items() if n["class_type"] == "PlacementReport")
    apply_id = next(k for k, n in prompt.items() if n["class_type"] == "PlacementApply")
    assign_id = next(k for k, n in prompt.items()
                     if n["class_type"] == "PlacementBackendAssignment")
    # the node-time plans are kept too (the nodes' own UI outputs)
    assert "placement_plan" in outputs[assign_id] and "placement_plan" in outputs[apply_id]
    report = outputs[report_id]
    records = report["placement_measured"]
    assert len(records) == 1 and records[0]["node"] == apply_id, records
    rec = records[0]
    # the plan that ran: the diffusion model streamed on the simulated cuda0, the text
    # encoder on the cpu, as the template asks
    ran = rec["plan"]
    diffusion = ran["components"]["diffusion"]
    assert diffusion["runtime"] == ["cuda0"] and diffusion["stream"] is not None, diffusion
    assert ran["components"]["te"]["runtime"] == ["cpu"], ran["components"]["te"]
    assert json.loads(report["placement_plan"][0]) == ran
    # the measured figures: sampling and decode timed, the peak on cuda0 while sampling
    assert rec["sample"]["steps"] == 4 and rec["sample"]["seconds"] > 0, rec["sample"]
    assert rec["decode"] and rec["decode"]["seconds"] > 0, rec["decode"]
    peak = rec["peaks"]["cuda0"]["sample"]
    assert 0 < peak <= 4 * 2 ** 30, rec["peaks"]
    text = "\n".join(report["text"])
    assert "plan that ran" in text and "measured peak: cuda0 sample" in text, text
    # the image was made
    assert any("images" in o for o in outputs.values()), list(outputs)
    # queued again unchanged: all cached, and history holds the kept report of that run
    _, again = post_and_wait(server, prompt)
    assert again["status"]["status_str"] == "success", again["status"]
    assert again["outputs"][report_id]["placement_measured"] == records


def test_a_report_without_a_placed_model_says_so_in_one_line(server):
    prompt = {"1": {"class_type": "EmptySD3LatentImage",
                    "inputs": {"width": 64, "height": 64, "batch_size": 1}},
              "2": {"class_type": "PlacementReport", "inputs": {"after": ["1", 0]}}}
    _, entry = post_and_wait(server, prompt)
    assert entry["status"]["status_str"] == "success", entry["status"]
    report = entry["outputs"]["2"]
    assert report["text"] == ["this workflow has no Apply Placement: nothing placed to report"]
    assert "placement_measured" not in report


def test_a_missing_model_file_refuses_the_prompt(server):
    prompt = to_api(json.loads(TEMPLATE.read_text()))
    unet = next(k for k, n in prompt.items() if n["class_type"] == "UNETLoader")
    prompt[unet]["inputs"]["unet_name"] = "flux1-dev.safetensors"
    status, body = http(server["url"] + "/prompt", {"prompt": prompt})
    assert status == 400, (status, body)
    assert body["error"]["type"] == "prompt_outputs_failed_validation", body["error"]
    assert list(body["node_errors"]) == [unet], body["node_errors"]
    assert "flux1-dev.safetensors" in json.dumps(body["node_errors"][unet])


def test_a_model_that_fails_to_load_ends_in_error(server):
    prompt = to_api(json.loads(TEMPLATE.read_text()))
    unet = next(k for k, n in prompt.items() if n["class_type"] == "UNETLoader")
    prompt[unet]["inputs"]["unet_name"] = "placement-broken.safetensors"
    _, entry = post_and_wait(server, prompt)
    status = entry["status"]
    assert status["status_str"] == "error" and not status["completed"], status
    errors = [m[1] for m in status["messages"] if m[0] == "execution_error"]
    assert errors and errors[0]["node_type"] == "UNETLoader", status["messages"]

"""The corpus of ComfyUI's official templates that the pack is tested on (issue 31): the
pinned `comfyui-workflow-templates-json` package downloaded once into a cache, its local
(non-API) workflows, those whose every node type exists in a given ComfyUI, and those
converted to API prompts by ComfyUI's own frontend (cached per package, ComfyUI and
frontend version).

    python tools/templates_corpus.py --comfyui PATH [--python PY] [--json OUT] [--convert]

prints the counts and, for each node type ComfyUI lacks, how many templates it excludes.
The node types ComfyUI has come from its own `/object_info`, from a server this script
starts on 127.0.0.1 (`main.py --cpu --disable-api-nodes`: its API nodes call paid cloud
services, so a template that needs one is not runnable here) and stops. Chosen by code,
not by hand: 309 local templates, 217 runnable in ComfyUI 0.29.0.
"""
import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections import Counter
from pathlib import Path

PACKAGE = "comfyui-workflow-templates-json"
VERSION = "0.1.123"
CACHE = Path(os.environ.get("PLACEMENT_TEMPLATES_CACHE",
                            Path.home() / ".cache" / "comfyui-placement" / "templates"))
# node types the frontend resolves itself and never sends to the server (a subgraph's
# instance is typed by the subgraph's id and is expanded by graphToPrompt)
FRONTEND_ONLY = {"Note", "MarkdownNote", "Reroute", "PrimitiveNode"}
CHROMIUM = os.environ.get("PLACEMENT_CHROMIUM", "/usr/bin/chromium")
SUBGRAPH_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def templates_folder() -> Path:
    """The pinned package's templates/ folder, downloaded (pip) and unpacked once."""
    import fcntl
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wheel = CACHE / f"{PACKAGE.replace('-', '_')}-{VERSION}-py3-none-any.whl"
        if not wheel.exists():
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                            f"{PACKAGE}=={VERSION}", "-d", str(CACHE)], check=True,
                           timeout=600)
        root = CACHE / wheel.stem
        folder = root / PACKAGE.replace("-", "_") / "templates"
        if not (folder / "index.json").exists():
            with zipfile.ZipFile(wheel) as z:
                z.extractall(root)
    return folder


def local_workflows(folder: Path) -> dict:
    """{name: workflow} of every template file that is a workflow and not an API one
    (their names start with api_; index*.json and option files are not workflows)."""
    out = {}
    for path in sorted(folder.glob("*.json")):
        if path.name.startswith(("index", "api_")):
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and "nodes" in data:
            out[path.stem] = data
    return out


def node_types(workflow: dict) -> set:
    """The node types a workflow sends to the server: its nodes' and its subgraphs'
    nodes' types, less frontend-only nodes and subgraph instances."""
    nodes = list(workflow.get("nodes", []))
    for sub in (workflow.get("definitions") or {}).get("subgraphs", []):
        nodes += sub.get("nodes", [])
    return {n["type"] for n in nodes if n.get("type") and n["type"] not in FRONTEND_ONLY
            and not SUBGRAPH_ID.match(n["type"])}


@contextlib.contextmanager
def comfyui_server(comfyui: str, python: str):
    """The URL of ComfyUI at `comfyui` serving on 127.0.0.1 (`main.py --cpu
    --disable-api-nodes`, its own nodes only: an empty custom_nodes, no cloud API
    nodes), stopped on exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = tempfile.mkdtemp(prefix="templates-corpus-")
    os.makedirs(os.path.join(base, "custom_nodes"))
    # ComfyUI's API nodes call paid cloud services (the network and an account): a
    # template that needs one does not run on its own, so they are not counted as there
    proc = subprocess.Popen([python, "main.py", "--cpu", "--disable-api-nodes", "--listen",
                             "127.0.0.1", "--port", str(port), "--base-directory", base,
                             "--disable-auto-launch"],
                            cwd=comfyui, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"ComfyUI at {comfyui} exited: "
                                 f"{proc.stderr.read().decode()[-2000:]}")
            try:
                _get(url + "/system_stats")
                break
            except OSError:
                if time.time() > deadline:
                    raise SystemExit(f"ComfyUI at {comfyui} did not answer on {url}")
                time.sleep(1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        shutil.rmtree(base, ignore_errors=True)


def _get(url, data=None, timeout=60):
    req = urllib.request.Request(url, data=None if data is None else json.dumps(data).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
        return json.loads(body) if body.strip() else None


def comfyui_node_types(comfyui: str, python: str) -> set:
    """The node types of ComfyUI at `comfyui`, from its own /object_info."""
    with comfyui_server(comfyui, python) as url:
        return set(_get(url + "/object_info"))


def comfyui_version(comfyui: str) -> str:
    text = Path(comfyui, "comfyui_version.py").read_text(encoding="utf-8")
    return re.search(r"__version__\s*=\s*[\"']([^\"']+)", text).group(1)


# what the editor must not open over the canvas while templates load: the first-run
# template browser and the missing-model and missing-node dialogs (the stand-ins are
# made later, from the names the prompts carry)
QUIET = {"Comfy.TutorialCompleted": True, "Comfy.Minimap.Visible": False,
         "Comfy.Workflow.ShowMissingModelsWarning": False,
         "Comfy.Workflow.ShowMissingNodesWarning": False}
CONVERT_JS = """async ([name, wf]) => {
    const app = window.app ?? window.comfyAPI.app.app;
    try {
        await app.loadGraphData(structuredClone(wf), true, true, name);
        const p = await app.graphToPrompt();
        return {prompt: p.output};
    } catch (e) { return {error: String(e?.stack ?? e).split('\\n')[0]}; }
}"""


def converted(comfyui: str, python: str, names=None, chromium: str = CHROMIUM) -> dict:
    """{template: {"prompt": API prompt} or {"error": one line}}: each runnable template
    (or each of `names`) loaded into ComfyUI's own frontend in headless Chromium and
    turned into an API prompt by its graphToPrompt, as the editor does when a user
    queues it (subgraphs, primitives and links resolved by the client itself). Cached
    per package, ComfyUI and frontend version; only templates not in the cache load."""
    import fcntl
    workflows = local_workflows(templates_folder())
    names = sorted(names if names is not None else corpus(comfyui, python)["runnable"])
    unknown = [n for n in names if n not in workflows]
    if unknown:
        raise SystemExit(f"not local templates of {PACKAGE} {VERSION}: {', '.join(unknown)}")
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cache = CACHE / f"prompts-{VERSION}-comfyui-{comfyui_version(comfyui)}-" \
                        f"frontend-{frontend_version(python)}.json"
        done = json.loads(cache.read_text()) if cache.exists() else {}
        todo = [n for n in names if n not in done]
        if todo:
            done.update(_convert_in_browser(comfyui, python, chromium,
                                            {n: workflows[n] for n in todo}))
            tmp = cache.with_suffix(".tmp")
            tmp.write_text(json.dumps(done, sort_keys=True))
            tmp.replace(cache)
    return {n: done[n] for n in names}


def frontend_version(python: str) -> str:
    """The frontend package ComfyUI's Python has installed (what the server serves)."""
    out = subprocess.run([python, "-c", "import importlib.metadata as m; "
                          "print(m.version('comfyui-frontend-package'))"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode:
        raise SystemExit(f"{python} has no comfyui-frontend-package: {out.stderr[-500:]}")
    return out.stdout.strip()


def _convert_in_browser(comfyui, python, chromium, workflows: dict) -> dict:
    from playwright.sync_api import sync_playwright
    out = {}
    with comfyui_server(comfyui, python) as url, sync_playwright() as pw:
        _get(url + "/settings", QUIET)
        browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                     args=["--no-sandbox", "--disable-gpu",
                                           "--disable-background-networking"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url)
            page.wait_for_function("() => (window.app ?? window.comfyAPI?.app?.app)"
                                   "?.graph?._nodes?.length", timeout=120000)
            for i, (name, wf) in enumerate(sorted(workflows.items())):
                out[name] = page.evaluate(CONVERT_JS, [name, wf])
                if (i + 1) % 25 == 0:
                    print(f"  converted {i + 1}/{len(workflows)}", file=sys.stderr)
        finally:
            browser.close()
    return out


def corpus(comfyui: str, python: str) -> dict:
    """{"local": [...], "runnable": [...], "missing": {node type: templates it excludes}}"""
    workflows = local_workflows(templates_folder())
    have = comfyui_node_types(comfyui, python)
    missing = Counter()
    runnable = []
    for name, wf in workflows.items():
        lacking = node_types(wf) - have
        missing.update(lacking)
        if not lacking:
            runnable.append(name)
    return {"package": f"{PACKAGE}=={VERSION}", "local": sorted(workflows),
            "runnable": runnable, "missing": dict(missing.most_common())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--comfyui", required=True, help="a ComfyUI checkout (main.py)")
    ap.add_argument("--python", default=sys.executable, help="ComfyUI's Python")
    ap.add_argument("--json", help="write the corpus here as JSON")
    ap.add_argument("--convert", action="store_true",
                    help="also convert the runnable templates to API prompts in the browser "
                         "(cached); their count and any that failed are printed")
    a = ap.parse_args(argv)
    if not os.path.isfile(os.path.join(a.comfyui, "main.py")):
        ap.error(f"--comfyui {a.comfyui!r} is not a ComfyUI checkout (no main.py there)")
    t0 = time.time()
    c = corpus(a.comfyui, a.python)
    print(f"{c['package']}: {len(c['local'])} local templates, {len(c['runnable'])} with "
          f"every node type in this ComfyUI ({time.time() - t0:.1f} s)")
    for node, count in c["missing"].items():
        print(f"  missing {node}: excludes {count}")
    if a.convert:
        t0 = time.time()
        prompts = converted(a.comfyui, a.python, c["runnable"])
        bad = {n: r["error"] for n, r in prompts.items() if "error" in r}
        print(f"converted by ComfyUI's frontend: {len(prompts) - len(bad)} of {len(prompts)} "
              f"({time.time() - t0:.1f} s)")
        for n, e in bad.items():
            print(f"  {n}: {e}")
    if a.json:
        Path(a.json).write_text(json.dumps(c, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The corpus of ComfyUI's official templates that the pack is tested on (issue 31, first
part): the pinned `comfyui-workflow-templates-json` package downloaded once into a cache,
its local (non-API) workflows, and those whose every node type exists in a given ComfyUI.

    python tools/templates_corpus.py --comfyui PATH [--python PY] [--json OUT]

prints the counts and, for each node type ComfyUI lacks, how many templates it excludes.
The node types ComfyUI has come from its own `/object_info`, from a server this script
starts on 127.0.0.1 (`main.py --cpu`) and stops. Chosen by code, not by hand.
"""
import argparse
import json
import os
import re
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


def comfyui_node_types(comfyui: str, python: str) -> set:
    """The node types of ComfyUI at `comfyui`, from its own /object_info (a server on
    127.0.0.1 started here with --cpu, stopped after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = tempfile.mkdtemp(prefix="templates-corpus-")
    os.makedirs(os.path.join(base, "custom_nodes"))     # ComfyUI's own nodes only
    proc = subprocess.Popen([python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port",
                             str(port), "--base-directory", base, "--disable-auto-launch"],
                            cwd=comfyui, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"ComfyUI at {comfyui} exited: "
                                 f"{proc.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/object_info",
                                            timeout=30) as r:
                    return set(json.load(r))
            except OSError:
                time.sleep(1)
        raise SystemExit(f"ComfyUI at {comfyui} did not answer on 127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


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
    a = ap.parse_args(argv)
    if not os.path.isfile(os.path.join(a.comfyui, "main.py")):
        ap.error(f"--comfyui {a.comfyui!r} is not a ComfyUI checkout (no main.py there)")
    t0 = time.time()
    c = corpus(a.comfyui, a.python)
    print(f"{c['package']}: {len(c['local'])} local templates, {len(c['runnable'])} with "
          f"every node type in this ComfyUI ({time.time() - t0:.1f} s)")
    for node, count in c["missing"].items():
        print(f"  missing {node}: excludes {count}")
    if a.json:
        Path(a.json).write_text(json.dumps(c, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

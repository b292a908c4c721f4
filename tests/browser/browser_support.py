"""Helpers the browser tests and their fixtures share."""
import json
import os
import socket
import urllib.request
from pathlib import Path

SHOTS = Path(os.environ.get("PLACEMENT_SCREENSHOTS", Path(__file__).resolve().parent / "screenshots"))
# ComfyUI's compute flags for the test server (conftest.py); a worker a test starts gets
# the same (--comfyui-args), so a block range computes there as it does here
COMFY_FLAGS = ["--cpu"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url, data=None, timeout=30):
    req = urllib.request.Request(url, data=None if data is None else json.dumps(data).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
        return json.loads(body) if body.strip() else None


def run_as_client(page, server, prompt, label, seconds=120):
    """Queue `prompt` on the test server as the editor's own client (so its UI output and
    measured figures reach the loaded graph) and wait for it: (prompt id, history
    status). A rejected prompt or one that does not finish fails the test."""
    import time
    import urllib.error
    import pytest
    client = page.evaluate("() => window.__api.clientId")
    try:
        r = get_json(server["url"] + "/prompt", {"prompt": prompt, "client_id": client})
    except urllib.error.HTTPError as exc:
        pytest.fail(f"{label}: the server rejected it: {exc.read().decode()[:2000]}")
    assert not r.get("node_errors"), r
    pid = r["prompt_id"]
    for _ in range(int(seconds / 0.2)):
        hist = get_json(server["url"] + f"/history/{pid}")
        if pid in hist and hist[pid].get("status", {}).get("completed") is not None:
            return pid, hist[pid]["status"]
        time.sleep(0.2)
    pytest.fail(f"{label} did not finish in {seconds} s")

"""Joining a worker never freezes ComfyUI (issue 33 item 2): Backend Assignment's
validation joins its workers off the server's event loop. A worker address that accepts
and then never answers (a loopback socket that listens and never reads) holds the join
until its handshake deadline; meanwhile `/queue` and `/system_stats` answer at once, and
the prompt's one-line error arrives within the deadline. Loopback only."""
import json
import os
import socket
import statistics
import threading
import time
import urllib.error
import urllib.request

# the server these fixtures start inherits it: joining is attempted, not refused for
# want of a secret (set before the session's server starts)
os.environ.setdefault("COMFYUI_PLACEMENT_SECRET", "placement-browser-tests")

CONNECT_TIMEOUT_S = 5.0       # runtime/distributed/pool.py: what one worker may cost


def silent_worker() -> socket.socket:
    """Listens on 127.0.0.1 and never answers: a connection completes in the kernel, no
    byte ever comes back."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)
    return hole


def post_prompt(url: str, prompt: dict, timeout: float = 60):
    """(HTTP status, body) of POST /prompt; a refused prompt is a 400 with node errors."""
    req = urllib.request.Request(url + "/prompt", json.dumps({"prompt": prompt}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def assignment(workers: str) -> dict:
    inputs = {"backend": "", "params_backend": "", "max_vram": "", "split_mode": "",
              "stream_layers": False, "auto_fit": False, "offload_mode": "auto",
              "offload_to_cpu": False, "clip_on_cpu": False, "vae_on_cpu": False,
              "control_net_cpu": False, "strict": True, "lora_mode": "auto",
              "workers": workers}
    return {"10": {"class_type": "PlacementBackendAssignment", "inputs": inputs},
            "20": {"class_type": "PlacementReport", "inputs": {"after": ["10", 0]}}}


def test_a_silent_worker_never_freezes_the_server(server):
    url = server["url"]
    hole = silent_worker()
    port = hole.getsockname()[1]
    answers, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            for path in ("/queue", "/system_stats"):
                t0 = time.monotonic()
                with urllib.request.urlopen(url + path, timeout=30) as r:
                    r.read()
                answers.append(time.monotonic() - t0)
            time.sleep(0.05)
    poller = threading.Thread(target=poll, daemon=True)
    try:
        poller.start()
        t0 = time.monotonic()
        status, body = post_prompt(url, assignment(f"w1=127.0.0.1:{port}"))
        took = time.monotonic() - t0
    finally:
        stop.set()
        poller.join(timeout=30)
        hole.close()
    errors = body.get("node_errors", {}).get("10", {}).get("errors", [])
    assert status == 400 and len(errors) == 1, body
    line = errors[0]["details"]
    assert "placement error in workers:" in line and f"127.0.0.1:{port}" in line, line
    assert "\n" not in line, line
    assert took < CONNECT_TIMEOUT_S + 3, f"the error took {took:.1f} s"
    # the join waited (about the deadline) while the server went on answering: a frozen
    # event loop would hold these answers for the whole join
    assert took > 1.0 and len(answers) >= 20, (took, len(answers))
    print(f"join refused after {took:.2f} s; {len(answers)} answers, median "
          f"{statistics.median(answers) * 1000:.0f} ms, slowest {max(answers) * 1000:.0f} ms")
    assert statistics.median(answers) < 0.2 and max(answers) < 1.0, sorted(answers)[-5:]


def test_placement_devices_workers_text_is_checked_when_queued(server):
    """Placement Devices' own workers input: text that is not ALIAS=HOST:PORT entries is a
    node error at queue time, in one line; nothing is joined."""
    prompt = {"1": {"class_type": "PlacementDevices", "inputs": {"workers": "w1=nowhere"}}}
    t0 = time.monotonic()
    status, body = post_prompt(server["url"], prompt)
    errors = body.get("node_errors", {}).get("1", {}).get("errors", [])
    assert status == 400 and len(errors) == 1, body
    line = errors[0]["details"]
    assert "placement error in workers: invalid address 'nowhere' for worker w1" in line, line
    assert time.monotonic() - t0 < 5

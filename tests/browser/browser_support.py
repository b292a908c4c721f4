"""Helpers the browser tests and their fixtures share."""
import json
import os
import socket
import urllib.request
from pathlib import Path

SHOTS = Path(os.environ.get("PLACEMENT_SCREENSHOTS", Path(__file__).resolve().parent / "screenshots"))


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

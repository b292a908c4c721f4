"""The catalog's stored tables are what ComfyUI's own classes give (marked `comfyui`).

placement/catalog/build.py instantiates each model on the meta device from ComfyUI's
classes at its released size, checks that ComfyUI's detection reads the built table back
as the same model (diffusion: the same config and model class; text encoders: the same
encoder), and writes the tables; regenerated here in ComfyUI's Python, they must equal
placement/catalog/tables.json byte for byte.
"""
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import COMFYUI_PATH, MARKS, PACK, comfy_python  # noqa: E402

pytestmark = MARKS


def test_stored_tables_are_what_comfyui_s_classes_give(tmp_path):
    out = tmp_path / "tables.json"
    proc = subprocess.run([comfy_python(), str(PACK / "placement/catalog/build.py"),
                           "--comfyui", COMFYUI_PATH, "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stored = (PACK / "placement/catalog/tables.json").read_bytes()
    assert out.read_bytes() == stored, "tables.json is stale: rerun placement/catalog/build.py"

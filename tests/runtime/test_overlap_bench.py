"""benchmarks/stream_overlap.py runs end to end on a tiny model: both block mixes, the
planner's depth marked, the copy-load row present, and each streamed step
copying exactly the streamed bytes (a benchmark that stops running, or whose streamed
rows copy more or less than one step's blocks, fails here)."""
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "stream_overlap.py"


def test_stream_overlap_runs_and_copies_each_block_once():
    out = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "1", "--steps", "1",
                          "--hidden", "64", "--tokens", "16"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert text.count("<- planner") == 2
    assert text.count("res+copies ") >= 2
    per_step = [float(x) for x in re.findall(r"([\d.]+) MiB per step", text)]
    assert len(per_step) == 2
    sections = text.split("== ")[1:]
    for mib, section in zip(per_step, sections):
        rows = re.findall(r"^\s+depth (\d+)\s.*?\s([\d.]+)\s+[\d.]+ \d+-\d+", section, re.M)
        assert len(rows) >= 4
        for _, h2d in rows:
            assert abs(float(h2d) - mib) < 0.11

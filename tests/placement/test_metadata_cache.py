"""Issue 10 item 8: headers read once per (path, size, mtime)."""
import os

from helpers import tiny_files as tf

from comfyui_placement.placement.metadata import describe_component
from comfyui_placement.placement.metadata import safetensors_header


def test_header_read_once_until_the_file_changes(tmp_path, monkeypatch):
    path = tf.write_header_file(tmp_path / "t5.safetensors", tf.t5())
    calls = []
    real = safetensors_header.read_safetensors

    def counting(p):
        calls.append(p)
        return real(p)
    monkeypatch.setattr(safetensors_header, "read_safetensors", counting)
    first = describe_component("te", [path])
    again = describe_component("te", [path], resolution=(512, 512))
    assert len(calls) == 1 and again.total_bytes == first.total_bytes
    # rewritten in place (another size and mtime): read again, and the new size is seen
    tf.write_header_file(path, tf.t5(depth=5))
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    changed = describe_component("te", [path])
    assert len(calls) == 2 and changed.total_bytes > first.total_bytes

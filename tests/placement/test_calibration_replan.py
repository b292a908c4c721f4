"""Issue 10 item 8: re-planning the same files skips recognition and the block scan
(describe results cached by path, size, mtime and the description's inputs)."""
import os

from helpers import tiny_files as tf

from comfyui_placement.placement.metadata import describe, describe_component
import importlib

describe_module = importlib.import_module("comfyui_placement.placement.metadata.describe")


def test_description_reused_until_the_file_or_the_inputs_change(tmp_path, monkeypatch):
    path = tf.write_header_file(tmp_path / "t5.safetensors", tf.t5())
    calls = []
    real = describe_module.find_blocks

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(describe_module, "find_blocks", counting)
    first = describe_component("te", [path])
    assert describe_component("te", [path]) == first and len(calls) == 1
    # another resolution is another description (headroom depends on it)
    describe_component("te", [path], resolution=(512, 512))
    assert len(calls) == 2
    # another spelling of the same file keeps its own label in the sources
    other = os.path.join(str(tmp_path), ".", "t5.safetensors")
    assert describe_component("te", [other]).sources != first.sources
    # rewritten in place: described again, the new size seen
    tf.write_header_file(path, tf.t5(depth=5))
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    changed = describe_component("te", [path])
    assert changed.total_bytes > first.total_bytes and len(calls) == 4
    assert describe(path, "te")[0].total_bytes == changed.total_bytes

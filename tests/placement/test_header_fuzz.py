"""Every malformed model file is one PlacementError line (issue 21 item 7), from the
planner's readers and from the runtime's disk reader alike: headers fuzzed by
hypothesis (JSON of any shape, lengths that lie, offsets out of range, truncations and
flipped bytes of a valid file)."""
import json
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.placement.metadata.gguf_file import read_gguf
from comfyui_placement.placement.metadata.safetensors_header import read_safetensors
from comfyui_placement.runtime.weights.weightfile import open_weight_file

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                               max_size=4),
    max_leaves=12)
entries = st.fixed_dictionaries({}, optional={
    "dtype": st.sampled_from(["F32", "BF16", "F8_E4M3", "Q4", "", 3]) | json_values,
    "shape": st.lists(st.integers(-3, 9), max_size=3) | json_values,
    "data_offsets": st.lists(st.integers(-4, 80), max_size=3) | json_values})
headers = st.dictionaries(st.text(max_size=6), entries | json_values, max_size=4)


def _readers(path):
    """Each reader's outcome: 'ok' or the PlacementError; anything else fails."""
    out = []
    for read in (lambda p: read_safetensors(p) if p.suffix == ".safetensors"
                 else read_gguf(p), lambda p: open_weight_file(str(p)).close()):
        try:
            read(path)
            out.append("ok")
        except PlacementError as e:
            text = str(e)
            assert text and "\n" not in text, text
            out.append(text)
    return out


def _write(path, header_bytes: bytes, data: bytes, length=None) -> None:
    n = len(header_bytes) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + header_bytes + data)


@SETTINGS
@given(header=headers, data=st.binary(max_size=64))
def test_any_json_header(tmp_path, header, data):
    path = tmp_path / "m.safetensors"
    _write(path, json.dumps(header).encode(), data)
    _readers(path)


@SETTINGS
@given(raw=st.binary(max_size=48), length=st.integers(0, 2 ** 64 - 1) | st.none(),
       data=st.binary(max_size=16))
def test_any_bytes_and_any_length(tmp_path, raw, length, data):
    path = tmp_path / "m.safetensors"
    _write(path, raw, data, length)
    _readers(path)


def test_an_entry_without_data_offsets_is_one_line(tmp_path):
    """What the issue saw: KeyError from the runtime's reader."""
    path = tmp_path / "m.safetensors"
    _write(path, json.dumps({"w": {"dtype": "F32", "shape": [1]}}).encode(), b"\0" * 4)
    for outcome in _readers(path):
        assert "needs dtype, shape and two data_offsets" in outcome


def test_a_valid_file_reads_the_same_in_both(tmp_path):
    path = tmp_path / "m.safetensors"
    _write(path, json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                             "__metadata__": {"a": "b"}}).encode(), b"\0" * 8)
    assert _readers(path) == ["ok", "ok"]
    f = open_weight_file(str(path))
    try:
        assert f.entries["w"][1:] == ((2,), 8 + len(path.read_bytes()) - 16, 8)
    finally:
        f.close()


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory):
    gguf = pytest.importorskip("gguf")
    path = tmp_path_factory.mktemp("gguf") / "m.gguf"
    w = gguf.GGUFWriter(str(path), "test")
    w.add_tensor("blocks.0.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    w.add_tensor("blocks.1.weight", np.ones((8, 4), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def test_a_valid_gguf_reads(tmp_path, gguf_bytes):
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes)
    assert _readers(path) == ["ok", "ok"]


@SETTINGS
@given(cut=st.integers(0, 10 ** 6), flips=st.lists(
    st.tuples(st.integers(0, 10 ** 6), st.integers(0, 255)), max_size=6))
def test_a_gguf_cut_or_flipped(tmp_path, gguf_bytes, cut, flips):
    raw = bytearray(gguf_bytes[:cut % (len(gguf_bytes) + 1)])
    for at, value in flips:
        if raw:
            raw[at % len(raw)] = value
    path = tmp_path / "m.gguf"
    path.write_bytes(bytes(raw))
    _readers(path)

"""Readers: safetensors headers, GGUF tensor tables, nn.Modules. Exact bytes, and one
PlacementError line for every broken or hostile file."""
import json
import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.placement.metadata import describe
from comfyui_placement.placement.metadata.gguf_file import read_gguf
from comfyui_placement.placement.metadata.module_info import read_module
from comfyui_placement.placement.metadata.safetensors_header import (
    MAX_HEADER_BYTES, parse_header, read_safetensors)

from helpers import tiny_files as tf


# -- safetensors ------------------------------------------------------------------------
def test_header_agrees_with_the_safetensors_writer(tmp_path):
    layout = {"a.weight": ("F32", (3, 5)), "b.bias": ("F16", (7,)), "c.idx": ("I64", (2, 2)),
              "d.mask": ("U8", (9,)), "e.scalar": ("F64", ())}
    path = tf.write_random_file(tmp_path / "x.safetensors", layout)
    tensors, meta = read_safetensors(path)
    from safetensors import safe_open
    with safe_open(path, "np") as f:
        assert {t.name for t in tensors} == set(f.keys())
        for t in tensors:
            assert t.shape == tuple(f.get_slice(t.name).get_shape())
    with open(path, "rb") as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
    data_section = os.path.getsize(path) - 8 - header_len
    assert sum(t.nbytes for t in tensors) == data_section          # every byte accounted for
    assert {t.name: t.nbytes for t in tensors} == {k: tf.nbytes(*v) for k, v in layout.items()}
    assert {t.name: t.dtype for t in tensors}["b.bias"] == "f16"


@pytest.mark.parametrize("dtype,shape,expected", [
    ("BF16", (4, 4), 32), ("F8_E4M3", (10,), 10), ("F8_E5M2", (3, 3), 9), ("F64", (2,), 16),
    ("I32", (5,), 20), ("U16", (3,), 6), ("BOOL", (7,), 7), ("F4", (5,), 3), ("I8", (0, 4), 0)])
def test_dtype_sizes(dtype, shape, expected):
    n = 1
    for d in shape:
        n *= d
    raw = json.dumps({"t": {"dtype": dtype, "shape": list(shape),
                            "data_offsets": [0, expected]}}).encode()
    (t,), _ = parse_header(raw, expected)
    assert t.nbytes == expected and t.shape == shape


def test_metadata_strings_are_returned(tmp_path):
    path = tf.write_header_file(tmp_path / "m.safetensors", {"x": ("F16", (2,))},
                                metadata={"format": "pt", "modelspec.architecture": "flux"})
    assert read_safetensors(path)[1]["modelspec.architecture"] == "flux"


def _hostile(tmp_path, name, payload: bytes):
    p = tmp_path / name
    p.write_bytes(payload)
    return str(p)


@pytest.mark.parametrize("payload,words", [
    (b"", "shorter than the 8-byte header length"),
    (b"\x05\x00\x00", "shorter than the 8-byte header length"),
    (struct.pack("<Q", 1 << 40) + b"{}", "above the 100000000-byte limit"),
    (struct.pack("<Q", 50) + b"{}", "header cut short: it declares 50 bytes, the file holds 2"),
    (struct.pack("<Q", 5) + b"{nope", "not JSON"),
    (struct.pack("<Q", 4) + b"\xff\xfe\xfd\xfc", "not JSON"),
    (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    (struct.pack("<Q", 9) + b'{"a": 1} ', "needs dtype, shape"),
    (struct.pack("<Q", 2000) + b"[" * 2000, "not JSON"),      # nesting bomb
])
def test_broken_files_give_one_line(tmp_path, payload, words):
    path = _hostile(tmp_path, "bad.safetensors", payload)
    with pytest.raises(PlacementError) as e:
        describe(path, "diffusion")
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("entry,data,words", [
    ({"dtype": "F16", "shape": [4], "data_offsets": [0, 100]}, 8, "outside"),
    ({"dtype": "F16", "shape": [4], "data_offsets": [4, 2]}, 8, "outside"),
    ({"dtype": "F16", "shape": [4], "data_offsets": [-8, 0]}, 8, "outside"),
    ({"dtype": "F16", "shape": [4], "data_offsets": [0, 6]}, 8, "need 8"),
    ({"dtype": "F17", "shape": [4], "data_offsets": [0, 8]}, 8, "unknown dtype"),
    ({"dtype": "F16", "shape": [-4], "data_offsets": [0, 8]}, 8, "non-negative integers"),
    ({"dtype": "F16", "shape": [2.0, 2], "data_offsets": [0, 8]}, 8, "non-negative integers"),
    ({"dtype": "F16", "shape": [True], "data_offsets": [0, 2]}, 8, "non-negative integers"),
    ({"dtype": "F16", "shape": [1 << 62, 1 << 62], "data_offsets": [0, 8]}, 8, "need"),
    ({"dtype": "F16", "shape": [4], "data_offsets": [0]}, 8, "two data_offsets"),
])
def test_hostile_entries(entry, data, words):
    with pytest.raises(PlacementError, match=words):
        parse_header(json.dumps({"t": entry}).encode(), data, "f")


def test_overlapping_tensors_are_refused():
    header = {"a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]},
              "b": {"dtype": "F16", "shape": [4], "data_offsets": [4, 12]}}
    with pytest.raises(PlacementError, match="overlap"):
        parse_header(json.dumps(header).encode(), 16, "f")


def test_truncated_real_file(tmp_path):
    path = tf.write_random_file(tmp_path / "t.safetensors", {"w": ("F32", (64, 64))})
    raw = open(path, "rb").read()
    cut = _hostile(tmp_path, "cut.safetensors", raw[:len(raw) - 100])
    with pytest.raises(PlacementError, match="outside"):
        read_safetensors(cut)
    cut = _hostile(tmp_path, "cut2.safetensors", raw[:20])
    with pytest.raises(PlacementError, match="header cut short"):
        read_safetensors(cut)


def test_header_cap_is_the_libraries():
    assert MAX_HEADER_BYTES == 100_000_000


def test_missing_file_and_pickle_are_refused(tmp_path):
    with pytest.raises(PlacementError, match="cannot read"):
        describe(str(tmp_path / "absent.safetensors"), "vae")
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes(b"PK")
    with pytest.raises(PlacementError, match="pickle"):
        describe(str(ckpt), "diffusion")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_fuzz_random_headers_raise_only_placement_error(raw):
    try:
        parse_header(raw, 64, "fuzz")
    except PlacementError as e:
        assert "\n" not in str(e)


_ENTRY = st.fixed_dictionaries({
    "dtype": st.sampled_from(["F16", "BF16", "F32", "U8", "X", 3, None]),
    "shape": st.one_of(st.lists(st.integers(-2, 5), max_size=3), st.text(max_size=3), st.none()),
    "data_offsets": st.one_of(st.lists(st.integers(-5, 80), max_size=3), st.none()),
})


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=5), _ENTRY, max_size=4), st.integers(0, 100))
def test_fuzz_structured_headers(header, data):
    try:
        tensors, _ = parse_header(json.dumps(header).encode(), data, "fuzz")
    except PlacementError as e:
        assert "\n" not in str(e)
        return
    for t in tensors:        # whatever is accepted is consistent with the data section
        assert 0 <= t.nbytes <= data


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=0, max_size=64))
def test_fuzz_whole_files(tmp_path, raw):
    path = _hostile(tmp_path, "f.safetensors", raw)
    try:
        read_safetensors(path)
    except PlacementError:
        pass


# -- GGUF -----------------------------------------------------------------------------
def _write_gguf(path):
    import gguf
    from gguf.quants import quantize
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch="flux")
    q = quantize(rng.standard_normal((64, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("double_blocks.0.img_attn.qkv.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("double_blocks.0.img_attn.qkv.bias", rng.standard_normal(64).astype(np.float16))
    w.add_tensor("double_blocks.1.img_attn.qkv.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("double_blocks.1.img_attn.qkv.bias", rng.standard_normal(64).astype(np.float16))
    w.add_tensor("single_blocks.0.linear1.weight", rng.standard_normal((16, 64)).astype(np.float32))
    w.add_tensor("img_in.weight", rng.standard_normal((64, 32)).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_gguf_sizes_are_exact(tmp_path):
    import gguf
    path = _write_gguf(tmp_path / "m.gguf")
    tensors, meta = read_gguf(path)
    by = {t.name: t for t in tensors}
    q = by["double_blocks.0.img_attn.qkv.weight"]
    assert q.quant == "Q8_0" and q.dtype == "q8_0" and q.shape == (64, 64)
    assert q.nbytes == 64 * 64 // 32 * 34          # Q8_0: 32 weights in 34 bytes
    assert by["double_blocks.0.img_attn.qkv.bias"].nbytes == 128
    assert by["single_blocks.0.linear1.weight"].nbytes == 16 * 64 * 4
    assert by["img_in.weight"].shape == (64, 32) and by["img_in.weight"].quant is None
    assert meta["general.architecture"] == "flux"
    # against the file: each tensor's bytes end where the next one's (aligned) data starts
    reader = gguf.GGUFReader(path)
    offsets = sorted((t.data_offset, t.name) for t in reader.tensors)
    size = os.path.getsize(path)
    for (off, name), nxt in zip(offsets, offsets[1:] + [(size, None)]):
        assert off + by[name].nbytes <= nxt[0] < off + by[name].nbytes + reader.alignment + 1


def test_gguf_describe(tmp_path):
    info, = describe(_write_gguf(tmp_path / "m.gguf"))
    assert info.arch == "flux" and info.quant == "Q8_0"
    assert [b.name for b in info.blocks] == ["double_blocks.0", "double_blocks.1", "single_blocks.0"]
    assert info.total_bytes == 2 * (64 * 64 // 32 * 34 + 128) + 16 * 64 * 4 + 64 * 32 * 2


@pytest.mark.parametrize("payload", [b"", b"GGUF", b"GGUF\x03\x00\x00\x00" + b"\xff" * 16,
                                     b"GGUF\x09\x00\x00\x00" + b"\x00" * 16, b"NOPE" * 10])
def test_broken_gguf(tmp_path, payload):
    path = _hostile(tmp_path, "bad.gguf", payload)
    with pytest.raises(PlacementError) as e:
        describe(path, "diffusion")
    assert "\n" not in str(e.value)


# -- nn.Module ------------------------------------------------------------------------
def test_module_reader_counts_parameters_buffers_and_shared_once():
    torch = pytest.importorskip("torch")

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight          # tied
            self.register_buffer("scale", torch.ones(3, dtype=torch.float16))
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))

    m = Tied()
    tensors = read_module(m)
    names = [t.name for t in tensors]
    assert names == ["scale", "embed.weight", "blocks.0.weight", "blocks.0.bias",
                     "blocks.1.weight", "blocks.1.bias"]
    expected = sum(p.numel() * p.element_size() for p in m.parameters()) + 6
    assert sum(t.nbytes for t in tensors) == expected
    assert {t.name: t.dtype for t in tensors}["scale"] == "f16"


def test_module_on_meta_device_and_bf16():
    torch = pytest.importorskip("torch")
    with torch.device("meta"):
        m = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.Linear(1000, 10)).to(torch.bfloat16)
    tensors = read_module(m)
    assert sum(t.nbytes for t in tensors) == (1000 * 1000 + 1000 + 10 * 1000 + 10) * 2
    assert {t.dtype for t in tensors} == {"bf16"}


def test_not_a_module():
    with pytest.raises(PlacementError, match="expected a path, an nn.Module"):
        describe(object(), "vae")


def test_gguf_text_encoder_with_llama_cpp_names(tmp_path):
    import gguf
    rng = np.random.default_rng(1)
    path = str(tmp_path / "t5xxl-Q8_0.gguf")
    w = gguf.GGUFWriter(path, arch="t5encoder")
    w.add_tensor("token_embd.weight", rng.standard_normal((100, 64)).astype(np.float16))
    for i in range(3):
        for name, shape in (("attn_q", (64, 64)), ("attn_k", (64, 64)), ("ffn_up", (160, 64)),
                            ("ffn_down", (64, 160))):
            q = gguf.quants.quantize(rng.standard_normal(shape).astype(np.float32),
                                     gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(f"enc.blk.{i}.{name}.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("enc.blk.0.attn_rel_b.weight", rng.standard_normal((32, 8)).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info, = describe(path)
    assert (info.component, info.arch, info.quant) == ("te", "t5", "Q8_0")
    assert [b.name for b in info.blocks] == ["enc.blk.0", "enc.blk.1", "enc.blk.2"]
    per_block = (2 * 64 * 64 + 2 * 160 * 64) // 32 * 34
    assert info.blocks[1].nbytes == per_block
    assert info.blocks[0].nbytes == per_block + 32 * 8 * 2
    assert "t5: 512 tokens x (8 x 64 + 4 x 160)" in info.headroom_basis


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=120))
def test_fuzz_gguf_bodies_raise_only_placement_error(tmp_path, body):
    path = _hostile(tmp_path, "f.gguf", b"GGUF" + struct.pack("<I", 3) + body)
    try:
        read_gguf(path)
    except PlacementError as e:
        assert "\n" not in str(e)

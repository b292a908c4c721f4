"""runtime/gguf: our torch dequantizers against the `gguf` package's numpy reference
(bit-exact in fp32, one rounding of it in bf16/fp16), refusals by name, and the reader."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.runtime.gguf import SUPPORTED, dequantize, quantized_nbytes

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

# Byte offsets of the fp16 scale fields in one block (the GGML block layouts), used to
# set edge-case scales; the oracle is always gguf.quants.dequantize.
SCALE_FIELDS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ4_NL": (0,), "IQ4_XS": (0,),
}
QUANTS = tuple(SCALE_FIELDS)
PLAIN = ("F32", "F16", "BF16")
EDGE_F16 = {
    "zero": 0x0000, "neg_zero": 0x8000, "min_subnormal": 0x0001, "max_subnormal": 0x03FF,
    "neg_subnormal": 0x8001, "min_normal": 0x0400, "max": 0x7BFF, "neg_max": 0xFBFF,
    "inf": 0x7C00, "neg_inf": 0xFC00, "nan": 0x7E00, "one": 0x3C00,
}


def sizes(name):
    return gguf.GGML_QUANT_SIZES[Q[name]]


def reference(raw: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(gguf.quants.dequantize(raw, Q[name]), dtype=np.float32)


def ours(raw: np.ndarray, name: str, shape, dtype=torch.float32, **kw) -> torch.Tensor:
    return dequantize(torch.from_numpy(np.ascontiguousarray(raw)), name, shape, dtype, **kw)


def assert_bit_exact(got: torch.Tensor, ref: np.ndarray):
    got = got.numpy()
    assert got.shape == ref.shape and got.dtype == np.float32
    nan_g, nan_r = np.isnan(got), np.isnan(ref)
    assert np.array_equal(nan_g, nan_r), "NaN positions differ"
    g, r = got.view(np.uint32)[~nan_g], ref.view(np.uint32)[~nan_r]
    bad = np.flatnonzero(g != r)
    assert bad.size == 0, (f"{bad.size} of {g.size} differ, first at {bad[0]}: "
                           f"{got[~nan_g][bad[0]]!r} vs {ref[~nan_r][bad[0]]!r}")


def assert_rounded(got: torch.Tensor, ref: np.ndarray):
    """got (bf16/fp16) is the fp32 reference rounded once to got's dtype."""
    want = torch.from_numpy(ref).to(got.dtype)
    assert got.shape == want.shape
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    keep = ~torch.isnan(want)
    assert torch.equal(got[keep], want[keep])


def random_blocks(name, rng, n_blocks, scales="finite"):
    """n_blocks random blocks; fp16 scale fields random finite (or random bits)."""
    _, ts = sizes(name)
    raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    if scales == "finite" and name in SCALE_FIELDS:
        for at in SCALE_FIELDS[name]:
            s = rng.standard_normal(n_blocks).astype(np.float16)
            raw[:, at:at + 2] = s.view(np.uint8).reshape(n_blocks, 2)
    return raw


def shaped(raw, name, rows):
    bs, ts = sizes(name)
    n_blocks = raw.shape[0]
    assert n_blocks % rows == 0
    return raw.reshape(rows, n_blocks // rows * ts), (rows, n_blocks // rows * bs)


# -- random blocks, all quantized types ----------------------------------------------
@pytest.mark.parametrize("name", QUANTS)
@pytest.mark.parametrize("rows", [1, 3])
def test_random_blocks_bit_exact(name, rows):
    rng = np.random.default_rng(hash((name, rows)) & 0xFFFF)
    raw, shape = shaped(random_blocks(name, rng, 12 * rows), name, rows)
    ref = reference(raw, name)
    assert ref.shape == shape
    assert_bit_exact(ours(raw, name, shape), ref)


@pytest.mark.parametrize("name", QUANTS)
def test_random_bits_including_nan_inf_scales(name):
    """Every byte random: the scale fields take every f16 class, codes every value."""
    rng = np.random.default_rng(7)
    raw, shape = shaped(random_blocks(name, rng, 400, scales="bits"), name, 4)
    assert_bit_exact(ours(raw, name, shape), reference(raw, name))


@pytest.mark.parametrize("name", QUANTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_outputs_are_the_reference_rounded_once(name, dtype):
    rng = np.random.default_rng(11)
    raw, shape = shaped(random_blocks(name, rng, 40), name, 2)
    got = ours(raw, name, shape, dtype)
    assert got.dtype == dtype
    assert_rounded(got, reference(raw, name))


# -- edge cases ------------------------------------------------------------------------
@pytest.mark.parametrize("name", QUANTS)
@pytest.mark.parametrize("scale", sorted(EDGE_F16))
def test_edge_scales(name, scale):
    rng = np.random.default_rng(3)
    raw = random_blocks(name, rng, 8)
    bits = np.array([EDGE_F16[scale]], dtype=np.uint16).view(np.uint8)
    for i, at in enumerate(SCALE_FIELDS[name]):
        if i == 0 or scale != "nan":      # with a NaN d, keep a finite dmin (and the reverse
            raw[:, at:at + 2] = bits      # below): each field's NaN must show alone
    if len(SCALE_FIELDS[name]) > 1:
        raw[4:, SCALE_FIELDS[name][1]:SCALE_FIELDS[name][1] + 2] = bits
    raw, shape = shaped(raw, name, 2)
    assert_bit_exact(ours(raw, name, shape), reference(raw, name))


@pytest.mark.parametrize("name", QUANTS)
@pytest.mark.parametrize("fill", [0x00, 0xFF, 0x55, 0xAA, 0x0F, 0xF0, 0x80, 0x7F])
def test_extreme_codes(name, fill):
    """All code bytes equal (min/max codes, alternating bits), random finite scales; the
    scale bytes of the K-quants are taken over too (6-bit scales at 0 and 63)."""
    rng = np.random.default_rng(fill)
    raw = random_blocks(name, rng, 6)
    keep = {b for at in SCALE_FIELDS[name] for b in (at, at + 1)}
    code_bytes = [i for i in range(raw.shape[1]) if i not in keep]
    raw[:, code_bytes] = fill
    raw, shape = shaped(raw, name, 3)
    assert_bit_exact(ours(raw, name, shape), reference(raw, name))


def test_zero_scales_give_zeros():
    rng = np.random.default_rng(0)
    for name in QUANTS:
        raw = random_blocks(name, rng, 4)
        for at in SCALE_FIELDS[name]:
            raw[:, at:at + 2] = 0
        raw, shape = shaped(raw, name, 1)
        got = ours(raw, name, shape)
        assert torch.all(got == 0), name
        assert_bit_exact(got, reference(raw, name))      # signs of the zeros too


# -- quantized from real data where the package can quantize -----------------------
def quantizable():
    out = []
    for name in QUANTS + PLAIN:
        try:
            gguf.quants.quantize(np.zeros((1, 256), np.float32), Q[name])
        except NotImplementedError:
            continue
        out.append(name)
    return out


@pytest.mark.parametrize("name", quantizable())
def test_quantized_data_round_trips_like_the_reference(name):
    rng = np.random.default_rng(5)
    data = (rng.standard_normal((5, 512)) * rng.uniform(0.01, 10, (5, 1))).astype(np.float32)
    data[1, :64] = 0                       # a zero block
    data[2, 32:64] = 1e-6                  # a tiny, flat block
    q = gguf.quants.quantize(data, Q[name])
    ref = reference(q, name)
    assert ref.shape == data.shape
    assert_bit_exact(ours(q.view(np.uint8), name, data.shape), ref)
    if name not in PLAIN:                  # the oracle itself reconstructs the data
        assert np.abs(ref - data).max() <= np.abs(data).max() * 0.2


def test_the_package_quantizes_the_legacy_types():
    """The round-trip test above is not silently empty."""
    assert {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "BF16"} <= set(quantizable())


# -- plain float types -----------------------------------------------------------------
@pytest.mark.parametrize("name", PLAIN)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_plain_types(name, dtype):
    rng = np.random.default_rng(9)
    _, ts = sizes(name)
    raw = rng.integers(0, 256, size=(3, 40 * ts), dtype=np.uint8)
    if name == "F32":                      # keep F32 finite-ish: random bits, no NaN
        v = raw.view(np.float32)
        v[np.isnan(v)] = 1.5
    ref = reference(raw, name)
    got = ours(raw, name, (3, 40), dtype)
    if dtype == torch.float32:
        assert_bit_exact(got, ref)
    else:
        assert_rounded(got, ref)


# -- hypothesis: any block count, rows, chunking, scale bits -----------------------------
@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(QUANTS + PLAIN), rows=st.integers(1, 4),
       per_row=st.integers(1, 5), seed=st.integers(0, 2**32 - 1),
       chunk=st.sampled_from([None, 0, 1, 33, 256, 1000]),
       scales=st.sampled_from(["finite", "bits"]))
def test_hypothesis_any_shape_and_chunking(name, rows, per_row, seed, chunk, scales):
    rng = np.random.default_rng(seed)
    raw, shape = shaped(random_blocks(name, rng, rows * per_row, scales), name, rows)
    if name == "F32":
        v = raw.view(np.float32)
        v[np.isnan(v)] = 0.25
    got = ours(raw, name, shape, chunk_elements=chunk)
    assert_bit_exact(got, reference(raw, name))


# -- calling conventions -----------------------------------------------------------------
def test_type_given_as_enum_id_or_name_and_out_buffer():
    rng = np.random.default_rng(1)
    raw, shape = shaped(random_blocks("Q4_K", rng, 4), "Q4_K", 2)
    ref = reference(raw, "Q4_K")
    t = torch.from_numpy(raw)
    for qtype in (Q.Q4_K, int(Q.Q4_K), "q4_k"):
        assert_bit_exact(dequantize(t, qtype, shape), ref)
    out = torch.full(shape, 7.0, dtype=torch.bfloat16)
    assert dequantize(t, "Q4_K", shape, out=out) is out
    assert_rounded(out, ref)


def test_unaligned_and_strided_raw_bytes():
    """Bytes at an odd offset of a bigger buffer (a slot, a file read) dequantize alike."""
    rng = np.random.default_rng(2)
    for name in QUANTS + PLAIN:
        raw, shape = shaped(random_blocks(name, rng, 8), name, 2)
        if name == "F32":
            v = raw.view(np.float32)
            v[np.isnan(v)] = 3.0
        buf = torch.zeros(raw.size + 3, dtype=torch.uint8)
        buf[1:1 + raw.size] = torch.from_numpy(raw.reshape(-1))
        assert_bit_exact(dequantize(buf[1:1 + raw.size], name, shape), reference(raw, name))


def test_every_other_type_is_refused_by_name():
    raw = torch.zeros(4096, dtype=torch.uint8)
    refused = [t for t in Q if t.name not in SUPPORTED]
    assert {"Q8_1", "Q8_K", "IQ2_XXS", "IQ1_S", "TQ1_0", "MXFP4", "I8", "F64"} <= \
        {t.name for t in refused}
    for t in refused:
        for qtype in (t, t.name):
            with pytest.raises(PlacementError) as e:
                dequantize(raw, qtype, (32,))
            msg = str(e.value)
            assert t.name in msg and "\n" not in msg


def test_wrong_sizes_are_refused():
    with pytest.raises(PlacementError, match=r"Q4_K tensor of shape \(2, 256\) is 288 bytes"):
        dequantize(torch.zeros(144, dtype=torch.uint8), "Q4_K", (2, 256))
    with pytest.raises(PlacementError, match="blocks of 32"):
        dequantize(torch.zeros(18, dtype=torch.uint8), "Q4_0", (31,))
    with pytest.raises(PlacementError, match="uint8"):
        dequantize(torch.zeros(18, dtype=torch.int8), "Q4_0", (32,))
    with pytest.raises(PlacementError, match="out="):
        dequantize(torch.zeros(18, dtype=torch.uint8), "Q4_0", (32,),
                   out=torch.zeros(31))
    assert quantized_nbytes((3072, 3072), "Q4_K") == 3072 * 3072 // 256 * 144


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", QUANTS + PLAIN)
def test_cuda_matches_the_reference(name):
    rng = np.random.default_rng(4)
    raw, shape = shaped(random_blocks(name, rng, 64, scales="bits"), name, 4)
    if name == "F32":
        v = raw.view(np.float32)
        v[np.isnan(v)] = 2.0
    ref = reference(raw, name)
    t = torch.from_numpy(raw).cuda()
    assert_bit_exact(dequantize(t, name, shape).cpu(), ref)
    assert_rounded(dequantize(t, name, shape, torch.bfloat16).cpu(), ref)


# -- the reader: tensor table and byte-range reads of tiny files -------------------------
def write_gguf(path, entries, orig_shapes=()):
    """entries: name -> (type name, numpy array: float data, or raw uint8 block bytes)."""
    w = gguf.GGUFWriter(str(path), "test")
    for name, shape in dict(orig_shapes).items():
        w.add_array("comfy.gguf.orig_shape." + name, list(shape))
    for name, (tname, arr) in entries.items():
        if arr.dtype == np.uint8:
            w.add_tensor(name, arr, raw_shape=arr.shape, raw_dtype=Q[tname])
        else:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def tiny_gguf(tmp_path):
    rng = np.random.default_rng(21)
    entries = {
        "embed.weight": ("F32", rng.standard_normal((4, 8)).astype(np.float32)),
        "norm.weight": ("F16", rng.standard_normal(64).astype(np.float16)),
        "blocks.0.bf16": ("BF16", gguf.quants.quantize(
            rng.standard_normal((3, 32)).astype(np.float32), Q.BF16)),
        "blocks.0.q8": ("Q8_0", gguf.quants.quantize(
            rng.standard_normal((2, 64)).astype(np.float32), Q.Q8_0)),
        "blocks.0.q4": ("Q4_0", gguf.quants.quantize(
            rng.standard_normal((2, 64)).astype(np.float32), Q.Q4_0)),
    }
    for name in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ4_NL", "Q5_1"):
        raw, _ = shaped(random_blocks(name, rng, 4), name, 2)
        entries["blocks.1." + name.lower()] = (name, raw)
    path = tmp_path / "tiny.gguf"
    # a conv weight stored flattened, with ComfyUI-GGUF's torch shape beside it
    entries["conv.weight"] = ("Q8_0", gguf.quants.quantize(
        rng.standard_normal((4, 96)).astype(np.float32), Q.Q8_0))
    write_gguf(path, entries, orig_shapes={"conv.weight": (4, 3, 4, 8)})
    return path, entries


def test_reader_lists_name_type_shape_and_byte_range(tiny_gguf):
    from comfyui_placement.runtime.gguf import GGUFTensors, list_tensors
    path, entries = tiny_gguf
    table = GGUFTensors(path)
    assert [t.name for t in table] == list(entries)
    assert table.types()["Q8_0"] == 2
    data = path.read_bytes()
    ends = []
    for t in list_tensors(path):
        tname, arr = entries[t.name]
        assert t.type == tname
        n = int(np.prod(t.shape))
        assert t.nbytes == quantized_nbytes(t.shape, t.type) == arr.nbytes
        start, end = t.byte_range
        assert data[start:end] == arr.tobytes()          # the range holds exactly its bytes
        ends.append(end)
        if t.name == "conv.weight":
            assert t.shape == (4, 3, 4, 8)
        elif tname in PLAIN and arr.dtype != np.uint8:
            assert t.shape == arr.shape
        else:
            assert n == dequantize(torch.from_numpy(arr.reshape(-1)), tname, (n,)).numel()
    assert max(ends) <= len(data)


def test_reader_reads_one_tensor_into_a_buffer_and_it_dequantizes(tiny_gguf, monkeypatch):
    import os as _os
    from comfyui_placement.runtime.gguf import GGUFTensors
    path, entries = tiny_gguf
    reads = []
    real = _os.preadv

    def spy(fd, bufs, off):
        got = real(fd, bufs, off)
        reads.append((off, got))
        return got

    monkeypatch.setattr(_os, "preadv", spy)
    table = GGUFTensors(path)
    total = sum(t.nbytes for t in table)
    buf = torch.full((total + 64,), 0xAB, dtype=torch.uint8)
    at = 7                                               # any offset, not aligned
    with table:
        for t in table:
            tname, arr = entries[t.name]
            view = table.read_into(t.name, buf, at)
            assert view.data_ptr() == buf.data_ptr() + at
            assert bytes(view.numpy()) == arr.tobytes()
            ref = reference(arr, tname).reshape(-1)
            assert_bit_exact(dequantize(view, tname, t.shape).reshape(-1), ref)
            at += t.nbytes
        assert int(buf[at:].eq(0xAB).all()) == 1 and int(buf[:7].eq(0xAB).all()) == 1
    assert sum(n for _, n in reads) == total             # only the tensors' own bytes
    assert sorted(reads) == sorted((t.offset, t.nbytes) for t in table)   # each its range
    one = GGUFTensors(path).read("blocks.1.q4_k")
    assert one.numel() == entries["blocks.1.q4_k"][1].nbytes


def test_reader_refusals(tiny_gguf, tmp_path):
    from comfyui_placement.runtime.gguf import GGUFTensors
    path, _ = tiny_gguf
    table = GGUFTensors(path)
    with pytest.raises(PlacementError, match="no tensor 'nope'"):
        table["nope"]
    with pytest.raises(PlacementError, match="do not fit"):
        table.read_into("embed.weight", torch.empty(10, dtype=torch.uint8))
    with pytest.raises(PlacementError, match="CPU uint8"):
        table.read_into("embed.weight", torch.empty(1000, dtype=torch.float32))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(PlacementError, match="not a readable GGUF"):
        GGUFTensors(bad)
    short = tmp_path / "short.gguf"
    short.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(PlacementError):
        t = GGUFTensors(short)
        last = list(t)[-1]
        t.read(last.name)


# -- a block's quantized tensors, dequantized from its slot on arrival -------------------
def test_block_dequantizes_from_its_slot_into_bound_parameters(tiny_gguf):
    from comfyui_placement.runtime.gguf import GGUFTensors, QuantizedBlock
    path, entries = tiny_gguf
    table = GGUFTensors(path)
    quant = [t for t in table if t.type not in PLAIN]
    slot = torch.full((sum(t.nbytes for t in quant) + 64,), 0x55, dtype=torch.uint8)
    specs, at = [], 5
    for t in quant:                                      # packed as a block's slot would be
        specs.append((at, t.type, t.shape))
        at += t.nbytes
    block = QuantizedBlock(specs, torch.bfloat16)
    assert block.slot_bytes == at
    assert block.scratch_bytes >= sum(2 * int(np.prod(t.shape)) for t in quant)
    scratch = torch.zeros(block.scratch_bytes, dtype=torch.uint8)
    weights = block.views(scratch)
    params = [torch.nn.Parameter(torch.zeros(t.shape, dtype=torch.bfloat16),
                                 requires_grad=False) for t in quant]
    for p, v in zip(params, weights):                    # bound once, as the ring binds
        p.data = v
    block.dequantize(slot, weights)                      # stale bytes first: all 0x55
    for (off, tname, shape), t in zip(specs, quant):     # the block arrives
        table.read_into(t.name, slot, off)
    block.dequantize(slot, weights)
    for p, t in zip(params, quant):
        tname, arr = entries[t.name]
        assert p.shape == t.shape and p.dtype == torch.bfloat16
        assert_rounded(p.detach().reshape(-1), reference(arr, tname).reshape(-1))
    with pytest.raises(PlacementError, match="slot holds"):
        block.dequantize(slot[:10], weights)
    with pytest.raises(PlacementError, match="scratch"):
        block.views(torch.zeros(8, dtype=torch.uint8))
    with pytest.raises(PlacementError, match="IQ2_XXS"):
        QuantizedBlock([(0, "IQ2_XXS", (1, 256))], torch.bfloat16)

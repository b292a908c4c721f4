"""What a worker reads for a remote range, without ComfyUI (issue 22 item 3): the model
file found under its models folder by ComfyUI's names for it, the builder descriptor that
hands a factory the file, GGUF ranges read as ComfyUI-GGUF holds them and hashed over
their bytes, and a loaded range whose slots keep their tensor class."""
import os

import pytest
import torch
from torch import nn

from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.runtime.distributed import builder, rangefile
from comfyui_placement.runtime.distributed.ggufrange import GGUFRangeFile, read_table
from comfyui_placement.runtime.distributed.loaded import LoadedRange
from comfyui_placement.runtime.distributed.held import HeldTensors
from comfyui_placement.runtime.gguf import GGUFTensors
from comfyui_placement.runtime.gguf.write import write_gguf

THIS = __name__           # pytest imports this file by its name: builders live here
KINDS = {"blocks.0.w.weight": "Q8_0", "blocks.0.b": "F32", "blocks.1.h.weight": "F16",
         "blocks.1.v": "BF16", "blocks.1.m.weight": "BF16", "blocks.1.q.weight": "Q8_0"}


def _touch(path, data=b"x"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)


def test_worker_finds_a_file_by_comfyuis_names_for_it(tmp_path):
    d = tmp_path / "models"
    _touch(d / "unet" / "a.gguf")
    _touch(d / "diffusion_models" / "c.safetensors")
    _touch(d / "b.safetensors")
    _touch(d / "sub" / "e.safetensors")
    _touch(d / "diffusion_models" / "both.safetensors", b"exact")
    _touch(d / "unet" / "both.safetensors", b"alias")
    assert rangefile.candidates("diffusion_models/sub/x.gguf") == [
        "diffusion_models/sub/x.gguf", "unet/sub/x.gguf", "sub/x.gguf", "x.gguf"]
    assert rangefile.candidates("x.gguf") == ["x.gguf"]
    find = lambda rel: os.path.relpath(rangefile.resolve_under(str(d), rel), d)  # noqa: E731
    assert find("diffusion_models/a.gguf") == "unet/a.gguf"          # the old folder name
    assert find("unet/c.safetensors") == "diffusion_models/c.safetensors"
    assert find("checkpoints/b.safetensors") == "b.safetensors"       # a flat folder
    assert find("diffusion_models/sub/e.safetensors") == "sub/e.safetensors"
    assert find("diffusion_models/both.safetensors") == "diffusion_models/both.safetensors"
    with pytest.raises(PlacementError, match=r"not found .*looked for checkpoints/z\.gguf, "
                                             r"z\.gguf\)"):
        rangefile.resolve_under(str(d), "checkpoints/z.gguf")
    with pytest.raises(PlacementError, match=r"\.safetensors and \.gguf files only"):
        rangefile.resolve_under(str(d), "diffusion_models/x.ckpt")
    for bad in ("/etc/passwd.gguf", "../a.gguf", "unet/../../a.gguf", "unet\\a.gguf", ""):
        with pytest.raises(PlacementError, match="relative to the worker's models folder"):
            rangefile.resolve_under(str(d), bad)


def test_a_name_that_leads_out_of_the_folder_is_refused(tmp_path):
    d, outside = tmp_path / "models", tmp_path / "outside"
    _touch(outside / "a.gguf")
    d.mkdir()
    os.symlink(outside, d / "unet")         # found under the other folder name, outside
    with pytest.raises(PlacementError, match="'unet/a.gguf' leaves the worker's models"):
        rangefile.resolve_under(str(d), "diffusion_models/a.gguf")


# -- the builder descriptor ------------------------------------------------------------------
def tiny_factory(width, file):
    m = nn.Linear(width, width)
    m.file_seen = file
    return m


def test_a_builder_asks_for_the_range_file(tmp_path):
    desc = builder.describe_module(None, (f"{THIS}:tiny_factory", {"width": 4},
                                          {"file_arg": "file"}))
    assert desc == {"target": f"{THIS}:tiny_factory", "kwargs": {"width": 4},
                    "file_arg": "file"}
    assert "file_arg" not in builder.describe_module(None, ("a.b:f", {}))
    for bad in (("a.b:f", {"file": 1}, {"file_arg": "file"}), ("a.b:f", {}, {"other": 1}),
                ("a.b:f", {}, {"file_arg": "no way"}), ("a.b:f", {}, {}, {}), ("a.b:f",),
                ("a.b", {})):
        with pytest.raises(PlacementError, match="invalid builder"):
            builder.describe_module(None, bad)
    m = builder.build_on_meta(desc, (THIS + ".",), file=str(tmp_path / "f.gguf"))
    assert m.file_seen == str(tmp_path / "f.gguf") and m.weight.device.type == "meta"
    with pytest.raises(PlacementError, match="wants the range's file"):
        builder.build_on_meta(desc, (THIS + ".",))
    newer = dict(desc, kwargs={"width": 4, "depth": 2})        # a kwarg it does not take
    with pytest.raises(PlacementError, match=r"tiny_factory' failed on this worker: "
                                             r"TypeError: .*'depth'"):
        builder.build_on_meta(newer, (THIS + ".",), file="f")


def test_comfyuis_builder_without_comfyui_names_the_flag():
    try:
        import comfy.model_detection  # noqa: F401
        pytest.skip("ComfyUI is importable here")
    except ImportError:
        pass
    with pytest.raises(PlacementError, match=r"needs ComfyUI on this worker; start it with "
                                             r"--comfyui PATH"):
        builder.build_on_meta({"target": "comfyui_placement.runtime.comfy.worker.remote_model:"
                                         "build_diffusion", "kwargs": {}},
                              builder.DEFAULT_ALLOWED)


def test_worker_comfyui_flag_wants_a_comfyui_folder(tmp_path, monkeypatch, capsys):
    from comfyui_placement.cli import main
    (tmp_path / "m").mkdir()
    monkeypatch.setenv("CP_TEST_REMOTE_FILES_SECRET", "s")
    assert main(["worker", "--listen", "127.0.0.1:0", "--models", str(tmp_path / "m"),
                 "--secret-env", "CP_TEST_REMOTE_FILES_SECRET",
                 "--comfyui", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("placement error: --comfyui") and "not a ComfyUI folder" in err


# -- GGUF ranges -----------------------------------------------------------------------------
def _gguf(path, seed=0, arch="flux"):
    g = torch.Generator().manual_seed(seed)
    sd = {"blocks.0.w.weight": torch.randn(64, 64, generator=g),
          "blocks.0.b": torch.randn(64, generator=g),
          "blocks.1.h.weight": torch.randn(16, 32, generator=g),
          "blocks.1.v": torch.randn(32, generator=g),
          "blocks.1.m.weight": torch.randn(32, 32, generator=g),
          "blocks.1.q.weight": torch.randn(8, 64, generator=g)}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_gguf(path, sd, "Q8_0", arch=arch, choose=lambda n, t, q: KINDS[n])
    return sd


def test_gguf_tensors_read_as_comfyui_gguf_holds_them(tmp_path):
    path = str(tmp_path / "t.gguf")
    sd = _gguf(path)
    wf = rangefile.open_range_file(path)
    try:
        assert isinstance(wf, GGUFRangeFile)
        # quantized and BF16 matrices: raw rows of uint8, their torch shape in the entry
        assert wf.lookup("blocks.0.w.weight")[:2] == (torch.uint8, (64, 64))
        assert tuple(rangefile.read_tensor(wf, "blocks.0.w.weight").shape) == (64, 68)
        assert wf.lookup("blocks.1.m.weight")[:2] == (torch.uint8, (32, 32))
        assert tuple(rangefile.read_tensor(wf, "blocks.1.m.weight").shape) == (32, 64)
        with GGUFTensors(path) as raw:
            for key in ("blocks.0.w.weight", "blocks.1.m.weight"):
                assert torch.equal(rangefile.read_tensor(wf, key).reshape(-1), raw.read(key))
        # F32/F16 typed; a BF16 vector as the float32 ComfyUI-GGUF makes of it (exact)
        assert torch.equal(rangefile.read_tensor(wf, "blocks.0.b"), sd["blocks.0.b"])
        assert torch.equal(rangefile.read_tensor(wf, "blocks.1.h.weight"),
                           sd["blocks.1.h.weight"].half())
        assert torch.equal(rangefile.read_tensor(wf, "blocks.1.v"),
                           sd["blocks.1.v"].bfloat16().float())
        with pytest.raises(PlacementError, match="has no tensor 'nope'"):
            rangefile.read_tensor(wf, "nope")
    finally:
        wf.close()


def _flip_byte(path, offset):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0x01]))


def test_gguf_hashes_cover_header_and_range_bytes(tmp_path):
    path = str(tmp_path / "t.gguf")
    _gguf(path)
    ident = rangefile.identity(path)
    table, data_offset = read_table(path)
    assert data_offset <= min(t.offset for t in table.values())

    def digest(keys):
        wf = rangefile.open_range_file(path)
        try:
            return rangefile.range_digest(wf, keys)
        finally:
            wf.close()
    inside, outside = ["blocks.1.q.weight", "blocks.1.v"], ["blocks.0.w.weight"]
    before = digest(inside), digest(outside)
    _flip_byte(path, table["blocks.1.q.weight"].offset + 5)      # a quantized byte
    assert rangefile.identity(path) == ident                     # header untouched
    assert digest(inside) != before[0] and digest(outside) == before[1]
    _gguf(path, arch="sd1")                                       # same tensors, other KV
    assert rangefile.identity(path)["header_sha256"] != ident["header_sha256"]


# -- a loaded GGUF range -----------------------------------------------------------------------
class Tagged(torch.Tensor):
    """As ComfyUI-GGUF's GGMLTensor: raw bytes, the torch shape (and type) beside them."""

    @property
    def shape(self):
        return self.tensor_shape


def tagged_model(file):
    """Each tensor of the GGUF file a meta slot as ComfyUI-GGUF's loader holds it."""
    table, _ = read_table(file)
    root = nn.Module()
    root.blocks = nn.ModuleList([nn.Module(), nn.Module()])
    for key, t in table.items():
        owner, _, leaf = key.rpartition(".")
        mod = root
        for part in owner.split("."):
            if part.isdigit():
                mod = mod[int(part)]
            else:
                if not hasattr(mod, part):
                    mod.add_module(part, nn.Module())
                mod = getattr(mod, part)
        p = nn.Parameter(torch.empty(t.storage, dtype=t.dtype, device="meta"),
                         requires_grad=False)
        if t.dtype == torch.uint8:
            p = nn.Parameter(p.data.as_subclass(Tagged), requires_grad=False)
            p.tensor_type, p.tensor_shape = t.qtype, torch.Size(t.shape)
        mod.register_parameter(leaf, p)
    return root


def _request(path, rel, blocks, keys):
    wf = rangefile.open_range_file(path)
    try:
        loaded = {k: rangefile.read_tensor(wf, k) for k in keys.values()}
        digest = rangefile.range_digest(wf, keys.values(), loaded)
    finally:
        wf.close()
    return dict({"file": rel, "device": "cpu", "blocks": blocks, "keys": keys,
                 "range_sha256": digest,
                 "builder": {"target": f"{THIS}:tagged_model", "kwargs": {},
                             "file_arg": "file"}}, **rangefile.identity(path)), loaded


def test_a_loaded_gguf_range_keeps_the_slots_class_and_bytes(tmp_path):
    models = tmp_path / "models"
    path = str(models / "unet" / "t.gguf")
    _gguf(path)
    keys = {k: k for k in KINDS if k.startswith("blocks.1.")}
    request, loaded = _request(path, "diffusion_models/t.gguf", ["blocks.1"], keys)
    r = LoadedRange(request, str(models), (THIS + ".",), HeldTensors(), 1)
    block = r.blocks[0]
    q = block.q.weight
    assert type(q) is Tagged and isinstance(q, nn.Parameter) and q.tensor_type == "Q8_0"
    assert tuple(q.shape) == (8, 64) and q.size() == (8, 68) and q.device.type == "cpu"
    assert torch.equal(q.as_subclass(torch.Tensor), loaded["blocks.1.q.weight"])
    assert type(block.h.weight) is nn.Parameter and block.h.weight.dtype == torch.float16
    assert block.v.dtype == torch.float32 and torch.equal(block.v.data, loaded["blocks.1.v"])
    assert r.model.blocks[0].w.weight.device.type == "meta"      # outside the range
    assert r.nbytes == sum(t.numel() * t.element_size() for t in loaded.values())
    bad = dict(request, range_sha256="0" * 64)
    with pytest.raises(PlacementError, match="range's bytes hash differently"):
        LoadedRange(bad, str(models), (THIS + ".",), HeldTensors(), 2)
    more = dict(request, keys=dict(keys, **{"blocks.1.extra": "blocks.0.b"}))
    with pytest.raises(PlacementError, match="no 'blocks.1.extra' that the main"):
        LoadedRange(more, str(models), (THIS + ".",), HeldTensors(), 3)

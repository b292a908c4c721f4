"""The pack's own GGUF loading (issue 12 items 2 and 4): quantized Linear weights stay
quantized bytes (GGUFLinear), dequantized in the forward; streamed, layer-split,
row-split and disk-resident runs equal the resident dequantized run; blocks move as
their quantized bytes; a lazy load reads nothing and disk residency reads byte ranges."""
import copy
import os

import pytest
import torch

from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan, StreamPlan
from comfyui_placement.runtime import place
from comfyui_placement.runtime.gguf import (GGUFLinear, GGUFTensors, dequantize, load_gguf,
                                            write_gguf)
from comfyui_placement.runtime.split.row import eligible_linears

gguf = pytest.importorskip("gguf")
INVENTORY = "cuda0=256MiB,cuda1=256MiB"
TOL = 1e-5


def flux256():
    """Hidden size 256: block Linears row split can shard and Q4_K rows can hold."""
    from diffusers import FluxTransformer2DModel
    torch.manual_seed(0)
    m = FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=1, num_single_layers=2,
                               attention_head_dim=128, num_attention_heads=2,
                               joint_attention_dim=32, pooled_projection_dim=16,
                               axes_dims_rope=(32, 48, 48)).eval()
    L, T = 16, 8
    inp = dict(hidden_states=torch.randn(1, L, 8), encoder_hidden_states=torch.randn(1, T, 32),
               pooled_projections=torch.randn(1, 16), timestep=torch.tensor([0.5]),
               img_ids=torch.zeros(L, 3), txt_ids=torch.zeros(T, 3), return_dict=False)
    return m, inp


def run(model, inp):
    with torch.no_grad():
        return model(**inp)[0]


def plan(runtime=("cuda0",), params="cpu", stream=None, split=None):
    devices = [DevicePlan(n, "gpu", 256 << 20, 256 << 20, None) for n in runtime]
    comp = ComponentPlan("diffusion", list(runtime), params, split_mode=split,
                         stream=StreamPlan(*stream) if stream else None)
    return Plan(devices, {"diffusion": comp})


@pytest.fixture(scope="module", params=["Q8_0", "Q4_K"])
def quantized(request, tmp_path_factory):
    model, inp = flux256()
    path = tmp_path_factory.mktemp("gguf") / f"flux-{request.param}.gguf"
    written = write_gguf(path, model.state_dict(), request.param)
    return request.param, model, inp, str(path), written


def dequantized_copy(model, path):
    """The float model: every quantized weight dequantized once into a plain Linear."""
    out = copy.deepcopy(model)
    with GGUFTensors(path) as table:
        sd = {t.name: dequantize(table.read(t.name), t.type, t.shape) for t in table}
    out.load_state_dict(sd)
    return out


def test_quantized_weights_stay_raw_and_the_skeleton_is_untouched(quantized):
    qtype, skeleton, inp, path, written = quantized
    before = {k: v.clone() for k, v in skeleton.state_dict().items()}
    model = load_gguf(path, skeleton)
    assert all(torch.equal(v, skeleton.state_dict()[k]) for k, v in before.items())
    q = [m for m in model.modules() if isinstance(m, GGUFLinear)]
    assert len(q) == sum(1 for k in written.values() if k == qtype) > 10
    assert all(m.weight.dtype == torch.uint8 and m.qtype == qtype for m in q)
    copied = copy.deepcopy(q[0])                      # the type tag survives a copy
    assert (copied.weight.tensor_type, copied.weight.tensor_shape) == \
        (qtype, torch.Size((q[0].out_features, q[0].in_features)))
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    assert held < sum(p.numel() * 4 for p in skeleton.parameters()) / 3
    # the forward dequantizes: bit-equal to the float model holding the dequantized weights
    assert torch.equal(run(model, inp), run(dequantized_copy(skeleton, path), inp))


@pytest.mark.parametrize("params", ["cpu", "disk"])
def test_streamed_run_equals_resident_and_moves_quantized_bytes(quantized, params):
    qtype, skeleton, inp, path, _ = quantized
    model = load_gguf(path, skeleton)
    ref = run(model, inp)
    if params == "disk":
        model = load_gguf(path, skeleton, lazy=True)
    inv = Inventory.simulated(INVENTORY)
    with place(model, plan(params=params, stream=(0, 1)), "diffusion", inv,
               weights_file=path if params == "disk" else None) as placed:
        h2d = []
        for _ in range(3):
            assert torch.equal(run(model, inp), ref)
            h2d.append(placed.stats()["devices"]["cuda0"]["h2d_bytes"])
        stats = placed.stats()
    # from the file's table, not the stats: the blocks' quantized bytes
    with GGUFTensors(path) as table:
        block_bytes = sum(t.nbytes for t in table if "blocks." in t.name)
    assert stats["streamed_bytes_per_forward"] == block_bytes
    # what a forward copied host-to-device: every block's quantized bytes once
    assert [b - a for a, b in zip(h2d, h2d[1:])] == [block_bytes, block_bytes]
    # checked and metered: the dequantized weights count as working memory
    largest = max(m.out_features * m.in_features * 4 for m in model.modules()
                  if isinstance(m, GGUFLinear))
    assert stats["device_check"] == "on"
    assert stats["devices"]["cuda0"]["working_peak_bytes"] >= largest
    if params == "cpu":
        assert torch.equal(run(model, inp), ref)               # restored


def test_a_gguf_block_that_never_arrives_raises_device_mismatch(quantized):
    """A block run with no hook on it or inside it (its own code called directly) is never
    brought to the device: its quantized weight is read where it rests, which a GPU
    refuses."""
    from comfyui_placement.runtime.device.simcheck import DeviceMismatch
    from test_gguf_checks import never_arrives
    qtype, skeleton, inp, path, _ = quantized
    model = load_gguf(path, skeleton)
    ref = run(model, inp)
    inv = Inventory.simulated(INVENTORY)
    with place(model, plan(stream=(0, 1)), "diffusion", inv):
        with never_arrives(model, model.single_transformer_blocks[1]):
            with pytest.raises(DeviceMismatch, match=r"single_transformer_blocks\.1\.\S+ was "
                                                     r"read .* rests in host memory, not on cuda0"):
                run(model, inp)
        assert torch.equal(run(model, inp), ref)


def test_layer_and_row_split_equal_resident(quantized):
    qtype, skeleton, inp, path, _ = quantized
    model = load_gguf(path, skeleton)
    ref = run(model, inp)
    inv = Inventory.simulated(INVENTORY)
    with place(model, plan(("cuda0", "cuda1"), split="layer"), "diffusion", inv):
        assert torch.equal(run(model, inp), ref)
    assert all(isinstance(m, GGUFLinear) for _, m in eligible_linears(model))
    assert len(eligible_linears(model)) >= 8
    with place(model, plan(("cuda0", "cuda1"), split="row"), "diffusion", inv) as placed:
        got = run(model, inp)
        assert placed.stats()["hops"] > 0
    assert (got - ref).abs().max().item() <= TOL * max(1.0, ref.abs().max().item())


def test_lazy_load_reads_nothing_and_disk_residency_reads_byte_ranges(quantized, monkeypatch):
    qtype, skeleton, inp, path, _ = quantized
    ref = run(load_gguf(path, skeleton), inp)
    read = []
    real = os.preadv

    def counting(fd, buffers, offset, *a):
        n = real(fd, buffers, offset, *a)
        read.append(n)
        return n
    monkeypatch.setattr(os, "preadv", counting)
    model = load_gguf(path, skeleton, lazy=True)
    assert read == [] and all(p.is_meta for p in model.parameters())
    size = os.path.getsize(path)
    with GGUFTensors(path) as table:
        tensor_bytes = sum(t.nbytes for t in table)
        per_block = {}
        for t in table:
            if "blocks." in t.name:
                key = t.name.split(".")[0] + "." + t.name.split(".")[1]
                per_block[key] = per_block.get(key, 0) + t.nbytes
    inv = Inventory.simulated(INVENTORY)
    for p in (plan(params="disk", stream=(0, 1)),
              plan(("cuda0", "cuda1"), params="disk", split="layer")):
        read.clear()
        with place(model, p, "diffusion", inv, weights_file=path):
            assert torch.equal(run(model, inp), ref)
        # byte ranges of at most one block per read (the ring may read the first blocks
        # ahead for a next forward): never the file whole
        assert 0 < max(read) <= max(per_block.values()) < tensor_bytes < size
        assert sum(read) <= 2 * tensor_bytes
    assert all(p.is_meta for p in model.parameters())


def test_refusals_name_what_is_wrong(tmp_path):
    model, _ = flux256()
    sd = model.state_dict()
    path = tmp_path / "f.gguf"
    write_gguf(path, sd, "Q8_0")
    other = copy.deepcopy(model)
    other.extra = torch.nn.Linear(2, 2)
    with pytest.raises(PlacementError, match="lacks 'extra.weight'"):
        load_gguf(path, other)
    # a quantized tensor that is not a Linear weight
    conv = torch.nn.Sequential(torch.nn.Conv1d(64, 64, 1))
    write_gguf(tmp_path / "c.gguf", {"0.weight": torch.randn(64, 64), "0.bias": torch.zeros(64)},
               "Q8_0")
    with pytest.raises(PlacementError, match="belongs to Conv1d"):
        load_gguf(tmp_path / "c.gguf", conv)
    with pytest.raises(PlacementError, match="writing GGUF type Q6_K is not available"):
        write_gguf(tmp_path / "x.gguf", sd, "Q6_K")
    # a type the pack cannot dequantize, refused by name
    w = gguf.GGUFWriter(str(tmp_path / "q81.gguf"), "test")
    w.add_tensor("0.weight", torch.zeros(2, 40, dtype=torch.uint8).numpy(), raw_shape=(2, 40),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(PlacementError, match="is Q8_1, which the pack cannot dequantize"):
        load_gguf(tmp_path / "q81.gguf", torch.nn.Sequential(torch.nn.Linear(32, 2)))


def test_runtime_lora_on_quantized_weights_is_refused(quantized):
    qtype, skeleton, inp, path, _ = quantized
    model = load_gguf(path, skeleton)
    name = "single_transformer_blocks.0.proj_mlp.weight"
    lin = model.get_submodule(name.rsplit(".", 1)[0])
    assert isinstance(lin, GGUFLinear)
    patch = {name: [(torch.zeros(4, lin.in_features), torch.zeros(lin.out_features, 4),
                     4.0, 1.0)]}
    with place(model, plan(stream=(0, 1)), "diffusion", Inventory.simulated(INVENTORY)) as p:
        with pytest.raises(PlacementError, match="quantized GGUF bytes"):
            p.set_lora(patch)

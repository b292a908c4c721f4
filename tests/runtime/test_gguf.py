"""Disk residency from GGUF: unquantized tensors stream raw; quantized ones are refused
with a message naming what is missing."""
import numpy as np
import pytest
import torch

from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.runtime import place

gguf = pytest.importorskip("gguf")


def write_gguf(path, tensors, quantize=()):
    w = gguf.GGUFWriter(str(path), "test")
    for name, t in tensors.items():
        arr = t.detach().float().numpy()
        if name in quantize:
            q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_unquantized_gguf_streams_from_disk(tiny, run_model, plan_for, sim_inventory,
                                            tmp_path):
    model, inp = tiny("flux")
    ref = run_model(model, inp)
    path = tmp_path / "flux.gguf"
    write_gguf(path, model.state_dict())
    other, _ = tiny("flux", seed=5)
    with place(other, plan_for("disk", stream=(1, 1)), "diffusion", sim_inventory,
               weights_file=str(path)):
        assert torch.equal(run_model(other, inp), ref)


def test_quantized_gguf_is_refused_with_the_reason(tiny, plan_for, sim_inventory, tmp_path):
    model, _ = tiny("flux")
    sd = model.state_dict()
    name = "single_transformer_blocks.0.proj_mlp.weight"      # 128 x 32: Q8_0-able
    path = tmp_path / "flux-q8.gguf"
    write_gguf(path, sd, quantize={name})
    with pytest.raises(PlacementError, match=r"quantized \(Q8_0\).*no on-device dequant"):
        with place(model, plan_for("disk", stream=(0, 1)), "diffusion", sim_inventory,
                   weights_file=str(path)):
            pass


class QLinear(torch.nn.Module):
    """Holds Q8_0 bytes raw and dequantizes in its forward, as ComfyUI-GGUF's ops do."""

    def __init__(self, out_f, in_f, raw_bytes):
        super().__init__()
        self.out_f = out_f
        self.register_buffer("qweight", torch.zeros(raw_bytes, dtype=torch.uint8))

    def forward(self, x):
        raw = self.qweight.numpy().reshape(self.out_f, -1)
        w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0)
        return torch.tanh(x @ torch.from_numpy(w).float().T)


class QStack(torch.nn.Module):
    def __init__(self, raw_bytes):
        super().__init__()
        self.blocks = torch.nn.ModuleList(QLinear(32, 32, raw_bytes) for _ in range(3))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def test_quantized_bytes_stream_raw_into_modules_that_keep_them_raw(plan_for, sim_inventory,
                                                                    tmp_path):
    g = torch.Generator().manual_seed(0)
    quantized = {f"blocks.{i}.qweight": gguf.quants.quantize(
        torch.randn(32, 32, generator=g).numpy(), gguf.GGMLQuantizationType.Q8_0)
        for i in range(3)}
    raw_bytes = quantized["blocks.0.qweight"].nbytes
    reference = QStack(raw_bytes)
    for name, q in quantized.items():
        reference.get_buffer(name).copy_(torch.from_numpy(q.reshape(-1).copy()))
    x = torch.randn(4, 32, generator=g)
    ref = reference(x)
    path = tmp_path / "q.gguf"
    w = gguf.GGUFWriter(str(path), "test")
    for name, q in quantized.items():
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    empty = QStack(raw_bytes)                                   # zeros: the file must run
    with place(empty, plan_for("disk", stream=(0, 1)), "diffusion", sim_inventory,
               weights_file=str(path)):
        assert torch.equal(empty(x), ref)

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

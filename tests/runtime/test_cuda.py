"""The CUDA transfer path on a real GPU (skipped where there is none): streamed equals
resident bit for bit, pinned host buffers, the slots given back."""
import copy

import pytest
import torch

from comfyui_placement.placement.devices import Inventory
from comfyui_placement.runtime import place

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("arch,k,depth", [("flux", 0, 1), ("unet", 1, 2), ("wan", 0, 4)])
def test_streaming_on_cuda_equals_resident(arch, k, depth, tiny, plan_for, tmp_path):
    model, inp = tiny(arch)
    gpu = copy.deepcopy(model).cuda()
    dev_inp = {key: v.cuda() if isinstance(v, torch.Tensor) else v for key, v in inp.items()}
    with torch.no_grad():
        ref = gpu(**dev_inp)[0]
    inventory = Inventory.detect()
    plan = plan_for("cpu", stream=(k, depth), budget=1 << 30)
    with place(model, plan, "diffusion", inventory) as placed:
        with torch.no_grad():
            outs = [model(**inp)[0] for _ in range(3)]    # inputs moved by the root hook
        assert placed.stats()["pinned_bytes"] > 0
    for out in outs:
        assert out.is_cuda and torch.equal(out, ref)
    assert next(model.parameters()).device.type == "cpu"
    assert placed.stats()["devices"]["cuda0"]["slot_bytes"] == 0

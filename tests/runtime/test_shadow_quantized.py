"""A model whose weights are a wrapper tensor subclass (comfy_kitchen's QuantizedTensor
in ComfyUI's int8/fp8 files with comfy_quant) is refused in one line by the engine's
structural copy, instead of a copy that breaks inside the sampler ("Cannot set
version_counter for inference tensor")."""
import pytest
import torch
from torch import nn
from torch.testing._internal.two_tensor import TwoTensor

from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.runtime.engine.shadow import Shadow


def test_a_wrapper_subclass_weight_is_refused_in_one_line():
    layer = nn.Linear(4, 4)
    with torch.no_grad():
        w = layer.weight.detach()
        layer.weight = nn.Parameter(TwoTensor(w, w.clone()), requires_grad=False)
    with pytest.raises(PlacementError) as err:
        Shadow(layer)
    msg = str(err.value)
    assert "\n" not in msg and "TwoTensor" in msg and "resident" in msg


def test_plain_and_storage_subclasses_still_copy():
    class Tagged(torch.Tensor):        # a subclass over a storage of its own, as GGUF's
        pass
    layer = nn.Linear(4, 4)
    layer.bias = nn.Parameter(layer.bias.detach().as_subclass(Tagged), requires_grad=False)
    shadow = Shadow(layer)
    assert shadow.module.weight.data_ptr() == layer.weight.data_ptr()
    assert type(shadow.module.bias.data) is Tagged
    assert shadow.module.bias.data_ptr() == layer.bias.data_ptr()

"""Read tensor sizes from an nn.Module (any device, `meta` included) without importing
torch: the module is walked through the attributes every nn.Module has. This runs for
every plan of a loaded model, so the loop is kept lean (no per-tensor calls beyond
what a size needs)."""
from typing import List

from ..errors import PlacementError
from .tensors import TORCH_DTYPES, TensorInfo

_DTYPE_NAMES = {}   # torch dtype object -> our name, filled on first sight
_PLAIN_TYPES = set()  # tensor classes known to carry no quantization attribute


def is_module(obj) -> bool:
    return hasattr(obj, "_modules") and hasattr(obj, "_parameters") and hasattr(obj, "_buffers")


def read_module(module) -> List[TensorInfo]:
    """Parameters and buffers in registration order (the order nn.Module walks them),
    each shared tensor counted once."""
    if not is_module(module):
        raise PlacementError(f"cannot read {type(module).__name__}: expected an nn.Module, "
                             f"a .safetensors/.sft/.gguf path or a ComponentInfo")
    out: List[TensorInfo] = []
    append = out.append
    seen = set()
    dtype_names = _DTYPE_NAMES
    plain = _PLAIN_TYPES
    make = TensorInfo._make
    # An explicit stack (not recursion): deep models must not hit the recursion limit.
    stack = [("", module)]
    pop, push = stack.pop, stack.append
    while stack:
        prefix, mod = pop()
        for table in (mod._parameters, mod._buffers):
            if not table:
                continue
            for key, t in table.items():
                if t is None:
                    continue
                i = id(t)
                if i in seen:
                    continue
                seen.add(i)
                cls = type(t)
                if cls not in plain:
                    quant = _quantized(prefix + key, t)
                    if quant is not None:
                        append(quant)
                        continue
                dname = dtype_names.get(t.dtype) or _dtype_name(t.dtype)
                append(make((prefix + key, t.shape, dname, t.nbytes, None)))
        children = mod._modules
        if children:
            for key, child in reversed(children.items()):
                if child is not None:
                    push((prefix + key + ".", child))
    return out


def _dtype_name(dtype) -> str:
    text = str(dtype)
    name = _DTYPE_NAMES[dtype] = TORCH_DTYPES.get(text.rsplit(".", 1)[-1], text)
    return name


def _quantized(name: str, t):
    """A ComfyUI-GGUF GGMLTensor carries `tensor_type` and `tensor_shape`; plain torch
    classes are remembered so that the attribute lookup happens once per class."""
    qtype = getattr(t, "tensor_type", None)
    if qtype is None:
        if type(t).__module__.startswith("torch"):
            _PLAIN_TYPES.add(type(t))
        return None
    qname = getattr(qtype, "name", str(qtype))
    if qname in ("F32", "F16", "BF16"):
        return None
    shape = tuple(getattr(t, "tensor_shape", t.shape))
    return TensorInfo(name, shape, qname.lower(), t.nbytes, qname)

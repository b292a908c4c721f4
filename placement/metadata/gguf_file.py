"""Read tensor sizes from a GGUF file through the `gguf` package (memory-mapped: the
tensor table is parsed, the weights are never read). Quantized sizes are exact."""
import os
from typing import Dict, Iterable, List, Optional, Tuple

from ..errors import PlacementError
from .tensors import TensorInfo

PLAIN_TYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "F64": "f64",
               "I8": "i8", "I16": "i16", "I32": "i32", "I64": "i64"}
# city96's ComfyUI-GGUF converter stores the torch shape of tensors it had to reshape.
ORIG_SHAPE_KEY = "comfy.gguf.orig_shape."


def open_reader(path, label=None):
    """gguf.GGUFReader over `path` (memory-mapped), or a one-line PlacementError naming
    the file (`label`, default the path): no gguf package, unreadable, not GGUF."""
    name = os.fspath(path)
    label = label or name
    try:
        import gguf   # lazy: importing placement must stay light
    except ImportError:
        raise PlacementError(f"{label}: reading GGUF needs the 'gguf' package "
                             f"(pip install gguf)") from None
    try:
        return gguf.GGUFReader(name, "r")
    except OSError as e:
        raise PlacementError(f"cannot read {name}: {e.strerror or e}") from None
    except Exception as e:  # the reader raises whatever numpy/struct raise on bad files
        detail = (str(e).splitlines() or [""])[0][:120]
        raise PlacementError(f"{label}: not a readable GGUF file ({type(e).__name__}: "
                             f"{detail})") from None


def read_gguf(path) -> Tuple[List[TensorInfo], Dict[str, str]]:
    """(tensors, string metadata such as 'general.architecture')."""
    reader = open_reader(path)
    try:
        meta = _string_fields(reader)
        tensors = []
        for t in reader.tensors:
            qname = t.tensor_type.name
            orig = reader.fields.get(ORIG_SHAPE_KEY + t.name)
            if orig is not None:
                shape = tuple(int(x) for x in orig.contents())
            else:
                shape = tuple(int(x) for x in reversed(t.shape.tolist()))
            plain = PLAIN_TYPES.get(qname)
            tensors.append(TensorInfo(t.name, shape, plain or qname.lower(), int(t.n_bytes),
                                      None if plain else qname))
        return tensors, meta
    except Exception as e:
        raise PlacementError(f"{os.fspath(path)}: bad GGUF tensor table "
                             f"({type(e).__name__})") from None
    finally:
        del reader          # drops the memory map


def _string_fields(reader) -> Dict[str, str]:
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("general.") and len(field.types) == 1:
            try:
                out[key] = str(field.contents())
            except Exception:       # a malformed value is metadata we can live without
                continue
    return out


def quant_label(by_quant: Dict[str, int]) -> Optional[str]:
    """The quant type(s) a component's weights rest in, from bytes per type: "Q4_K", or
    "mixed: Q4_K+Q6_K" (most bytes first); None for float weights."""
    kinds = sorted((t for t, n in by_quant.items() if n > 0), key=lambda t: -by_quant[t])
    if not kinds:
        return None
    return kinds[0] if len(kinds) == 1 else "mixed: " + "+".join(kinds)


def dequant_scratch_bytes(tensors: Iterable[TensorInfo], act_bytes: int) -> int:
    """Working memory for dequantization: the largest quantized tensor in the compute
    dtype. ComfyUI-GGUF's layers and the pack's GGUFLinear dequantize one weight at a
    time, right before its matmul, so one such tensor is alive at once."""
    largest = 0
    for t in tensors:
        if t.quant:
            n = 1
            for d in t.shape:
                n *= int(d)
            largest = max(largest, n)
    return largest * act_bytes

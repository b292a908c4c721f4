"""One tensor as the readers see it (no data), and the dtype names they agree on."""
from dataclasses import dataclass
from typing import NamedTuple, Optional, Tuple


class TensorInfo(NamedTuple):
    name: str
    shape: Tuple[int, ...]
    dtype: str                  # 'bf16', 'f16', 'f32', 'f8_e4m3', 'q8_0', ...
    nbytes: int                 # exact bytes the tensor occupies
    quant: Optional[str] = None  # GGML block-quant type ('Q8_0'); None for plain dtypes


@dataclass(frozen=True)
class TensorTable:
    """A model's tensor table without a file (placement/catalog: the built-in tables of
    the common models); describe() reads it as it reads a file's header. `label` stands
    where a file's path would (block sources, warnings)."""
    label: str
    tensors: Tuple[TensorInfo, ...]


# safetensors dtype -> (our name, bits per element). Sub-byte types pack elements.
SAFETENSORS_DTYPES = {
    "BOOL": ("bool", 8), "U8": ("u8", 8), "I8": ("i8", 8),
    "F8_E4M3": ("f8_e4m3", 8), "F8_E5M2": ("f8_e5m2", 8),
    "F8_E4M3FNUZ": ("f8_e4m3fnuz", 8), "F8_E5M2FNUZ": ("f8_e5m2fnuz", 8),
    "F8_E8M0": ("f8_e8m0", 8), "E8M0": ("f8_e8m0", 8),
    "F4": ("f4", 4), "F6_E2M3": ("f6_e2m3", 6), "F6_E3M2": ("f6_e3m2", 6),
    "I16": ("i16", 16), "U16": ("u16", 16), "F16": ("f16", 16), "BF16": ("bf16", 16),
    "I32": ("i32", 32), "U32": ("u32", 32), "F32": ("f32", 32),
    "I64": ("i64", 64), "U64": ("u64", 64), "F64": ("f64", 64), "C64": ("c64", 64),
}

# torch dtype (str(dtype) without 'torch.') -> our name
TORCH_DTYPES = {
    "bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64",
    "float8_e4m3fn": "f8_e4m3", "float8_e5m2": "f8_e5m2",
    "float8_e4m3fnuz": "f8_e4m3fnuz", "float8_e5m2fnuz": "f8_e5m2fnuz",
    "float8_e8m0fnu": "f8_e8m0", "float4_e2m1fn_x2": "f4x2",
    "int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16", "int32": "i32",
    "uint32": "u32", "int64": "i64", "uint64": "u64", "bool": "bool",
    "complex64": "c64", "complex128": "c128",
}

# Bytes per activation element when a component computes in this weight dtype: low
# precision and quantized weights compute in 16-bit, f32/f64 weights in 32-bit.
def activation_bytes(dtype: str) -> int:
    return 4 if dtype in ("f32", "f64") else 2

"""The GGML tensor types: ids, names, block layout (elements per block, bytes per block).

From the GGML format definition (ggml.h `enum ggml_type`, ggml.c `type_traits`); the
`gguf` package's `GGML_QUANT_SIZES` holds the same numbers. Only the types in
`SUPPORTED` are dequantized here; every other one is known by name so that refusing it
says which type it is.
"""
from typing import Dict, NamedTuple, Union

from ...placement.errors import PlacementError

QK_K = 256      # elements per K-quant / IQ super-block


class GGMLType(NamedTuple):
    name: str
    id: int
    block_size: int     # elements per block
    type_size: int      # bytes per block


_ALL = [
    GGMLType("F32", 0, 1, 4),
    GGMLType("F16", 1, 1, 2),
    GGMLType("Q4_0", 2, 32, 2 + 16),
    GGMLType("Q4_1", 3, 32, 2 + 2 + 16),
    GGMLType("Q5_0", 6, 32, 2 + 4 + 16),
    GGMLType("Q5_1", 7, 32, 2 + 2 + 4 + 16),
    GGMLType("Q8_0", 8, 32, 2 + 32),
    GGMLType("Q8_1", 9, 32, 4 + 4 + 32),
    GGMLType("Q2_K", 10, QK_K, 2 + 2 + QK_K // 16 + QK_K // 4),
    GGMLType("Q3_K", 11, QK_K, 2 + QK_K // 4 + QK_K // 8 + 12),
    GGMLType("Q4_K", 12, QK_K, 2 + 2 + QK_K // 2 + 12),
    GGMLType("Q5_K", 13, QK_K, 2 + 2 + QK_K // 2 + QK_K // 8 + 12),
    GGMLType("Q6_K", 14, QK_K, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16),
    GGMLType("Q8_K", 15, QK_K, 4 + QK_K + QK_K // 8),
    GGMLType("IQ2_XXS", 16, QK_K, 2 + QK_K // 4),
    GGMLType("IQ2_XS", 17, QK_K, 2 + QK_K // 4 + QK_K // 32),
    GGMLType("IQ3_XXS", 18, QK_K, 2 + QK_K // 4 + QK_K // 8),
    GGMLType("IQ1_S", 19, QK_K, 2 + QK_K // 8 + QK_K // 16),
    GGMLType("IQ4_NL", 20, 32, 2 + 16),
    GGMLType("IQ3_S", 21, QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    GGMLType("IQ2_S", 22, QK_K, 2 + QK_K // 4 + QK_K // 16),
    GGMLType("IQ4_XS", 23, QK_K, 2 + 2 + QK_K // 2 + QK_K // 64),
    GGMLType("I8", 24, 1, 1),
    GGMLType("I16", 25, 1, 2),
    GGMLType("I32", 26, 1, 4),
    GGMLType("I64", 27, 1, 8),
    GGMLType("F64", 28, 1, 8),
    GGMLType("IQ1_M", 29, QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    GGMLType("BF16", 30, 1, 2),
    GGMLType("TQ1_0", 34, QK_K, 2 + 4 * 13),
    GGMLType("TQ2_0", 35, QK_K, 2 + 64),
    GGMLType("MXFP4", 39, 32, 1 + 16),
]

BY_NAME: Dict[str, GGMLType] = {t.name: t for t in _ALL}
BY_ID: Dict[int, GGMLType] = {t.id: t for t in _ALL}

SUPPORTED = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
             "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")


def ggml_type(qtype: Union[str, int, GGMLType]) -> GGMLType:
    """The type for a name ("Q4_K", case-insensitive), a ggml id, or a
    `gguf.GGMLQuantizationType` member (an int with a `.name`)."""
    if isinstance(qtype, GGMLType):
        return qtype
    if isinstance(qtype, str):
        t = BY_NAME.get(qtype.upper())
        if t is None:
            raise PlacementError(f"unknown GGML tensor type {qtype!r}; known: "
                                 f"{', '.join(BY_NAME)}")
        return t
    if isinstance(qtype, int):
        t = BY_ID.get(int(qtype))
        if t is None:
            name = getattr(qtype, "name", None)
            label = f"{name} (id {int(qtype)})" if name else f"id {int(qtype)}"
            raise PlacementError(f"unknown GGML tensor type {label}; dequantizable: "
                                 f"{', '.join(SUPPORTED)}")
        return t
    raise PlacementError(f"GGML tensor type must be a name or an id, not "
                         f"{type(qtype).__name__}")


def dequantizable(qtype: Union[str, int, GGMLType]) -> GGMLType:
    """The type, or a one-line PlacementError naming it when it cannot be dequantized."""
    t = ggml_type(qtype)
    if t.name not in SUPPORTED:
        raise PlacementError(f"GGUF tensor type {t.name} cannot be dequantized on the device; "
                             f"supported: {', '.join(SUPPORTED)}")
    return t

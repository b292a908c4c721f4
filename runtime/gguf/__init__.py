"""GGUF in the runtime: quantized bytes dequantized on the compute device (pure torch).

- `dequantize(raw_uint8, qtype, shape, dtype)`: one tensor's raw bytes to floats
  (types in `SUPPORTED`; any other is refused by name with a PlacementError).
- `GGUFTensors(path)`: a file's tensor table (name, type, shape, byte range) and reads of
  one tensor's bytes into a caller's uint8 buffer (the `gguf` package parses the table).
- `load_gguf(path, skeleton)`: a model with the file's weights, quantized Linear weights
  kept raw in `GGUFLinear`s (dequantized in their forward); `write_gguf` writes tiny ones.
- `QuantizedBlock`: a streamed block's quantized tensors, dequantized from its slot into a
  compute-dtype scratch right after arrival (the ring's on_arrive seam; docs/gguf.md).
"""
from .arrive import QuantizedBlock
from .dequant import dequantize, quantized_nbytes
from .linear import GGUFLinear, quantized_rows
from .load import load_gguf
from .reader import GGUFTensor, GGUFTensors, list_tensors
from .types import SUPPORTED, GGMLType, dequantizable, ggml_type
from .write import write_gguf

__all__ = ["dequantize", "quantized_nbytes", "SUPPORTED", "GGMLType", "ggml_type",
           "dequantizable", "GGUFTensor", "GGUFTensors", "list_tensors", "QuantizedBlock",
           "GGUFLinear", "quantized_rows", "load_gguf", "write_gguf"]

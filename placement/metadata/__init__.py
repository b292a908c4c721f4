"""What models weigh, from file headers and module attributes: no weights are read.

describe(source, component=None, *, resolution, frames, batch, headroom) -> [ComponentInfo]
describe_component(component, sources, ...) -> ComponentInfo   (several files merged)
"""
from .describe import describe, describe_component, merge
from .info import BlockInfo, ComponentInfo
from .tensors import TensorInfo, TensorTable

__all__ = ["describe", "describe_component", "merge", "BlockInfo", "ComponentInfo",
           "TensorInfo", "TensorTable"]

"""What a component weighs, as pure data: the planner's only view of a model."""
from dataclasses import dataclass, field
from typing import Optional, Tuple


@dataclass(frozen=True)
class BlockInfo:
    """One repeated unit (a transformer block, a UNet stage): the unit of streaming
    and of layer split. `name` is the key prefix, e.g. 'double_blocks.3'."""
    name: str
    nbytes: int
    group: str = ""
    index: int = 0
    source: str = ""                    # the file path or 'module:ClassName' it came from
    root: str = ""                      # key prefix of the component in that source
                                        # ('model.diffusion_model.'); module path = root + name


@dataclass(frozen=True)
class ComponentInfo:
    """One component's weights. `blocks` are in execution order; whatever is not in a
    block (embeddings, final layers) is `non_block_bytes` and stays resident."""
    component: str                      # canonical name, placement.components.COMPONENTS
    total_bytes: int
    blocks: Tuple[BlockInfo, ...] = ()
    arch: str = "unknown"
    dtype: str = ""                     # dominant dtype, e.g. 'bf16'
    quant: Optional[str] = None         # e.g. 'Q8_0' for GGUF
    headroom_bytes: Optional[int] = None  # compute working memory; None: the fixed reserve
    sources: Tuple[str, ...] = ()       # file paths or 'module:ClassName'
    warnings: Tuple[str, ...] = field(default_factory=tuple)
    root: str = ""                      # key prefix stripped from block names (one source)
    irregular_groups: Tuple[str, ...] = ()  # block groups whose blocks are not alike
    headroom_basis: str = ""            # how headroom_bytes was reached, in words
    tensor_count: int = 0
    # the part of headroom_bytes that is the GPU's kernel workspace (an estimate's fixed
    # WORKSPACE); the planner puts the inventory's own workspace in its place
    workspace_bytes: int = 0
    # a layer split's working memory on each of its devices, workspace included
    # ((device, bytes), ...); empty: headroom_bytes on every device
    headroom_per_device: Tuple[Tuple[str, int], ...] = ()
    # the matrices a row split shards (runtime/split/row.py: 2-D weights of at least
    # 256x256 inside blocks), as (rows, bytes per row with the bias element, how many);
    # None: not known (a hand-made description), () none (the runtime splits by layer)
    row_shards: Optional[Tuple[Tuple[int, int, int], ...]] = None
    # the run measures the working memory before any weight moves (inside ComfyUI, the
    # first model call is rehearsed and the run planned again with what it measured):
    # an estimate that does not fit beside the weights is then no reason to refuse
    headroom_measured_later: bool = False

    @property
    def block_bytes(self) -> int:
        return sum(b.nbytes for b in self.blocks)

    @property
    def non_block_bytes(self) -> int:
        return self.total_bytes - self.block_bytes

    @property
    def largest_block_bytes(self) -> int:
        return max((b.nbytes for b in self.blocks), default=0)

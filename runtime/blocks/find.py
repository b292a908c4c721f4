"""The repeated blocks of a module, in execution order: the unit of streaming.

Found from the module's structure: the shallowest module holding known block groups
(transformer_blocks, double_blocks, down_blocks/mid_block/up_blocks, layers, ...),
groups taken in the order they run in the architectures we know; failing those, the
ModuleLists that hold most of a module's weights, whatever their names. The streamer
checks the order on the first forward and adopts what it sees, and a block is entered by
whatever of it runs (entry.py: a container's own forward may never be called).
Everything outside the blocks (embeddings, final layers) is non-block and stays resident.
"""
from collections import deque
from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

from ...placement.errors import PlacementError

# Group attribute names in the order they execute in the architectures we know.
GROUP_ORDER = (
    "noise_refiner", "context_refiner",                        # Lumina2 / Z-Image
    "text_transformer_blocks",                                  # Kandinsky5
    "down_blocks", "input_blocks",                              # UNets (diffusers, ldm)
    "double_blocks", "double_stream_blocks", "joint_blocks",    # Flux/HiDream/SD3 (ldm)
    "double_layers",                                            # AuraFlow
    "transformer_blocks", "visual_transformer_blocks",          # diffusers DiTs, Kandinsky5
    "mid_block", "middle_block",
    "single_blocks", "single_stream_blocks", "single_transformer_blocks",
    "single_layers", "single_stream_layers",
    "up_blocks", "output_blocks",
    "blocks", "layers", "block", "h",                           # Wan, LLMs, T5, GPT-style
)
SINGLE_GROUPS = ("mid_block", "middle_block")   # one module, not a list

Block = Tuple[str, nn.Module]


def _has_tensors(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None or \
        next(module.buffers(), None) is not None


def _members(name: str, child: nn.ModuleList) -> List[Block]:
    """A group's blocks; an element that is itself a ModuleList (Stable Cascade's levels:
    no forward, the model loops their layers) gives its layers as blocks."""
    out: List[Block] = []
    for i, b in enumerate(child):
        if isinstance(b, nn.ModuleList):
            out += [(f"{name}.{i}.{j}", u) for j, u in enumerate(b) if _has_tensors(u)]
        elif _has_tensors(b):
            out.append((f"{name}.{i}", b))
    return out


def _groups_of(module: nn.Module) -> List[Block]:
    children = dict(module.named_children())
    lists = [n for n in GROUP_ORDER if isinstance(children.get(n), nn.ModuleList)
             and len(children[n]) > 0]
    if not lists:
        return []
    blocks: List[Block] = []
    for name in GROUP_ORDER:
        child = children.get(name)
        if isinstance(child, nn.ModuleList):
            blocks += _members(name, child)
        elif name in SINGLE_GROUPS and child is not None and _has_tensors(child):
            blocks.append((name, child))
    return blocks


def find_blocks(module: nn.Module, names: Optional[Sequence[str]] = None) -> List[Block]:
    """Blocks as (qualified name, module) in expected execution order.
    `names`: an explicit list (a plan's or metadata's BlockInfo names). Known group
    names first; failing those, the repeated units by shape (`_repeated`). Either way the
    streamer learns the order that really runs on the first forward."""
    if names is not None:
        return _named_blocks(module, names)
    found = _known_groups(module)
    return found if found else _repeated(module)


# a deeper module's known groups win over the shallowest's when they hold this many
# times its bytes: SAM 3.1's shallowest list is its tracker's 3-layer pointer MLP
# (`tracker.obj_ptr_proj.layers`, 0.04% of the weights) beside its ViT trunk's blocks
# (86%); elsewhere the shallowest modules' groups are the model's blocks
DEEPER_WINS = 4


def _known_groups(module: nn.Module) -> List[Block]:
    """Known block groups: the shallowest module holding two or more such blocks, unless
    a deeper one's hold DEEPER_WINS times its bytes (then the heaviest)."""
    candidates = []
    todo = deque([("", module)])
    while todo:
        prefix, mod = todo.popleft()
        found = _groups_of(mod)
        if len(found) >= 2:
            candidates.append([(prefix + n, b) for n, b in found])
            continue                      # blocks' own inner groups are not candidates
        for name, child in mod.named_children():
            todo.append((f"{prefix}{name}.", child))
    if not candidates:
        return []
    weight = [sum(_bytes(b) for _, b in c) for c in candidates]
    best = max(range(len(candidates)), key=weight.__getitem__)
    return candidates[best] if weight[best] > DEEPER_WINS * weight[0] else candidates[0]


def _bytes(m: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in
               list(m.parameters()) + list(m.buffers()))


# a module's block lists, by shape: at least this share of its weights in ModuleLists of
# two or more modules that hold tensors
REPEATED_SHARE = 0.5


def _repeated(module: nn.Module) -> List[Block]:
    """Block lists of any name: the shallowest module whose ModuleLists of two or more
    tensor-holding modules hold at least half of its weights (AuraFlow's double_layers /
    single_layers, Kandinsky5's text/visual blocks, whatever a new family calls them),
    in registration order."""
    todo = deque([("", module)])
    while todo:
        prefix, mod = todo.popleft()
        total = _bytes(mod)
        lists = [(n, c) for n, c in mod.named_children() if isinstance(c, nn.ModuleList)
                 and sum(1 for b in c if _has_tensors(b)) >= 2]
        listed = sum(_bytes(c) for _, c in lists)
        if total and lists and listed >= REPEATED_SHARE * total:
            return [(prefix + bn, b) for n, c in lists for bn, b in _members(n, c)]
        for name, child in mod.named_children():
            todo.append((f"{prefix}{name}.", child))
    return []


def _named_blocks(module: nn.Module, names: Sequence[str]) -> List[Block]:
    blocks = []
    for name in names:
        try:
            blocks.append((name, module.get_submodule(name)))
        except AttributeError:
            raise PlacementError(f"block {name!r} is not a submodule of "
                                 f"{type(module).__name__}; pass names such as "
                                 f"'transformer_blocks.0'") from None
    seen = {}
    for name, block in blocks:
        for sub in block.modules():
            if id(sub) in seen:
                raise PlacementError(f"blocks {seen[id(sub)]!r} and {name!r} overlap; "
                                     f"blocks must be disjoint submodules")
            seen[id(sub)] = name
    return blocks


def block_tensors(block: nn.Module) -> List[torch.Tensor]:
    """Parameters and buffers of a block, each once (tied tensors appear once)."""
    out, seen = [], set()
    for t in list(block.parameters()) + list(block.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def block_tensor_ids(block: nn.Module) -> List[int]:
    """ids of a block's parameters and buffers (placement.layout.group_blocks groups them)."""
    return [id(t) for t in list(block.parameters()) + list(block.buffers())]

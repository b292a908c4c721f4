"""Runtime LoRA: low-rank patches added to the device copy of a weight after it
arrives, never to the resting copy. Streamed blocks are patched on each arrival (so a
new strength or set costs no reload); resident weights are refilled from their resting
copy and patched once when the set changes.

A patch is (down, up, alpha, strength): W' = W + strength * alpha / rank * up @ down,
with conv weights flattened (up: out x r [x 1 x 1], down: r x in [x kh x kw]).
"""
from typing import Dict, List, Sequence, Tuple

import torch

from ...placement.errors import PlacementError

Patch = Tuple[torch.Tensor, torch.Tensor, float, float]


def delta(weight: torch.Tensor, patches: Sequence[Patch]) -> torch.Tensor:
    """The summed update for `weight`, in float32 (the caller casts once)."""
    total = None
    for down, up, alpha, strength in patches:
        rank = down.shape[0]
        d = up.reshape(up.shape[0], -1).float() @ down.reshape(rank, -1).float()
        d = d.mul_(strength * (alpha if alpha is not None else rank) / rank)
        if d.numel() != weight.numel():
            raise PlacementError(f"LoRA patch of shape {list(d.shape)} does not fit a "
                                 f"weight of shape {list(weight.shape)}")
        total = d if total is None else total.add_(d)
    return total.view(weight.shape)


def apply_in_place(weight: torch.Tensor, patches: Sequence[Patch]) -> None:
    """weight += delta, computed in float32 and rounded once (as a fused merge does)."""
    weight.copy_((weight.float() + delta(weight, patches)).to(weight.dtype))


class GroupPatches:
    """The patches of one group, resolved to tensor positions; patch tensors already on
    the compute device."""

    def __init__(self, tensors: List[torch.Tensor], patches: List[List[Patch]]):
        self.tensors = tensors
        self.patches = patches

    def apply(self) -> None:
        for t, p in zip(self.tensors, self.patches):
            apply_in_place(t.data, p)


def resolve(named: Dict[str, Sequence[Patch]], by_name: Dict[str, torch.Tensor],
            device: torch.device) -> Dict[int, List[Tuple[torch.Tensor, List[Patch]]]]:
    """{tensor id: (tensor, patches on device)}; unknown names raise with the reason."""
    out = {}
    for name, patches in named.items():
        t = by_name.get(name)
        if t is None:
            raise PlacementError(f"LoRA names {name!r}, which is not a weight of the module; "
                                 f"use the module's parameter names, e.g. "
                                 f"'transformer_blocks.0.attn.to_q.weight'")
        if not t.is_floating_point():
            raise PlacementError(f"LoRA names {name!r}, whose weight is {t.dtype} (quantized "
                                 f"GGUF bytes); runtime LoRA patches float weights only")
        moved = [(d.to(device), u.to(device), a, s) for d, u, a, s in patches]
        out[id(t)] = (t, moved)
    return out

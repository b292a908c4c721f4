"""Row split: large Linear weights inside blocks sharded by output rows over the devices.

Eligible: 2-D nn.Linear weights of at least 256x256 inside blocks (stable-diffusion.cpp's
rule). Each is cut into contiguous row ranges, one per device, in proportion to the
devices' room (budget minus headroom; the main device also holds everything else). A
call sends the input to each device (once per input tensor: q/k/v projections of the
same input share the copy), computes the partial output there and gathers the parts
on the main device in row order (torch.cat on the last dimension). Everything else,
and all non-Linear compute, runs on the main device.

Runtime LoRA (`lora={linear name: [(up, down, scale), ...]}`): the delta up @ down is
never materialised; each shard adds scale * (x @ down.T) @ up[rows].T, so a shard uses
exactly its rows of the patch, and changing a strength never touches the weights.
The Linear's `forward` is overridden on the instance for the placement only.
"""
from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ...placement.errors import PlacementError
from ...placement.layout import ROW_MIN, row_counts, row_shardable
from ..blocks.find import find_blocks
from ..blocks.module_tensors import make_group, seen_bytes, to_device
from ..engine.core import Engine
from ..engine.forward_override import ForwardOverride
from ..gguf.linear import GGUFLinear, quantized_rows
from ..host.residency import Group
from .split_engine import SplitEngine

MIN_ROWS = MIN_COLS = ROW_MIN         # placement/layout.py: the planner's rule too


def eligible_linears(module: nn.Module, block_names=None) -> List[Tuple[str, nn.Linear]]:
    out = []
    for bname, block in find_blocks(module, block_names):
        for name, m in block.named_modules():
            if not isinstance(m, nn.Linear) or m.weight.dim() != 2:
                continue
            # a GGUFLinear's weight is (rows, quantized row bytes): its size is the Linear's
            rows, cols = (m.out_features, m.in_features) if isinstance(m, GGUFLinear) \
                else m.weight.shape
            if row_shardable(rows, cols):
                out.append((f"{bname}.{name}", m))
    return out


def row_shards(linears) -> List[Tuple[int, int, int]]:
    """(rows, bytes per row, 1) per sharded Linear, a row being its weight's row and its
    bias element: what placement/layout.row_split_bytes counts (`row_counts` cuts each
    Linear's rows, here and there)."""
    out = []
    for _, lin in linears:
        w, b = lin.weight, lin.bias
        nbytes = w.numel() * w.element_size() + (0 if b is None else b.numel() * b.element_size())
        out.append((w.shape[0], nbytes // w.shape[0], 1))
    return out


class _Shard:
    __slots__ = ("device", "weight", "bias", "loras")

    def __init__(self, device: int, weight, bias, loras):
        self.device = device
        self.weight = weight
        self.bias = bias
        self.loras = loras           # [(down, up_rows, scale)]


class RowSplit(SplitEngine, Engine):
    mode = "row"

    @classmethod
    def applies(cls, module: nn.Module, block_names=None) -> bool:
        return bool(eligible_linears(module, block_names))

    def _prepare(self, by_id) -> None:
        if self.cplan.params == "disk":
            raise PlacementError(f"{self.component}: row split reads its shards from memory; "
                                 f"params=disk is supported by layer split, use params=cpu")
        self._check_not_meta()
        linears = eligible_linears(self.module, self.block_names)
        lora = dict(self.lora or {})
        named = dict(self.module.named_modules())
        unknown = [k for k in lora if not isinstance(named.get(k), nn.Linear)]
        if unknown:
            raise PlacementError(f"{self.component}: lora names {unknown[0]!r}, which is not a "
                                 f"Linear of the module; keys are Linear module names such as "
                                 f"'transformer_blocks.0.attn.to_q'")
        for name, lin in linears:
            if getattr(lin, "weight_function", None) or getattr(lin, "bias_function", None):
                raise PlacementError(f"{self.component}: {name} carries weight patch functions "
                                     f"(ComfyUI LoRA); row split applies LoRA only as lora="
                                     f"{{name: [(up, down, scale)]}}, pass it that way")
        eligible_names = {n for n, _ in linears}
        # LoRA on a Linear that is not sharded: one full-row "shard" on the main device
        patched_only = [(n, named[n]) for n in lora if n not in eligible_names]

        sharded_ids = set()
        for _, lin in linears:
            sharded_ids.add(id(lin.weight))
            if lin.bias is not None:
                sharded_ids.add(id(lin.bias))
        rest = [i for i in by_id if i not in sharded_ids]
        main = make_group("main", by_id, rest) if rest else None
        weights = self.room_weights(main.nbytes if main else 0)

        # the shard tensors: row slices of the resting weights, packed per device
        self._pieces: List[List[torch.Tensor]] = [[] for _ in self.targets]
        self._layout = []            # (linear, [(device, w_idx, b_idx, [(d_idx, u_idx, s)])])
        for name, lin in linears:
            counts = row_counts(lin.weight.shape[0], weights)
            plan, r0 = [], 0
            for d, c in enumerate(counts):
                if c == 0:
                    continue
                rows = slice(r0, r0 + c)
                r0 += c
                w_i = self._piece(d, lin.weight.data[rows])
                b_i = None if lin.bias is None else self._piece(d, lin.bias.data[rows])
                loras = [(self._piece(d, down), self._piece(d, up[rows]), float(s))
                         for up, down, s in self._check_lora(name, lin, lora.get(name, ()))]
                plan.append((d, w_i, b_i, loras))
            self._layout.append((lin, plan))
        for name, lin in patched_only:
            loras = [(self._piece(0, down), self._piece(0, up), float(s))
                     for up, down, s in self._check_lora(name, lin, lora[name])]
            self._layout.append((lin, [(0, None, None, loras)]))

        self.resident = [[] for _ in self.targets]
        if main:
            self.resident[0].append(main)
        for d, pieces in enumerate(self._pieces):
            if pieces:
                self.resident[d].append(Group(f"row shards on {self.targets[d].name}", pieces,
                                              [[f"piece{i}"] for i in range(len(pieces))]))
        self.store.retain(())               # row shards are views: no host copies
        self.shard_counts = {t.name: sum(1 for _, p in self._layout for s in p if s[0] == d)
                             for d, t in enumerate(self.targets)}
        self.sharded = len(linears)

    def _packable(self, g) -> bool:
        # shards are row slices of the module's own weights, which keep their storage:
        # a packed copy of them would be a second host copy
        return not g.name.startswith("row shards")

    def _piece(self, d: int, t: torch.Tensor) -> int:
        # a fresh tensor object: Group.bind rebinds it, never the module's own tensors;
        # registered with the originals so unloading points it back at its resting rows
        piece = t.detach()
        self.originals[id(piece)] = (piece, None)
        self.rest[id(piece)] = piece.data
        self._pieces[d].append(piece)
        return len(self._pieces[d]) - 1

    def _check_lora(self, name, lin, entries):
        out_f, in_f = lin.weight.shape
        checked = []
        for e in entries:
            try:
                up, down, scale = e
            except (TypeError, ValueError):
                raise PlacementError(f"{self.component}: lora entry for {name!r} must be "
                                     f"(up, down, scale)") from None
            if up.dim() != 2 or down.dim() != 2 or up.shape[0] != out_f or \
                    down.shape[1] != in_f or up.shape[1] != down.shape[0]:
                raise PlacementError(f"{self.component}: lora for {name!r} has up "
                                     f"{tuple(up.shape)} and down {tuple(down.shape)}; "
                                     f"expected up ({out_f}, r) and down (r, {in_f})")
            dtype = lin.weight.dtype if lin.weight.is_floating_point() else torch.float32
            checked.append((up.to(dtype), down.to(dtype), scale))
        return checked

    # -- hooks --------------------------------------------------------------------------
    def _attach(self) -> None:
        m = self.module
        self._guard_forward()
        self._handles.append(m.register_forward_pre_hook(self._root_pre, with_kwargs=True))
        self._handles.append(m.register_forward_hook(self._root_post))
        self._overrides = []
        self._sent = [None, None]
        for lin, plan in self._layout:
            shards = []
            for d, w_i, b_i, loras in plan:
                p = self._pieces[d]
                w = lin.weight if w_i is None else p[w_i]
                b = lin.bias if w_i is None else (None if b_i is None else p[b_i])
                shards.append(_Shard(d, w, b, [(p[a], p[u], s) for a, u, s in loras]))
            self._overrides.append(
                ForwardOverride(lin, self._forward_fn(shards, quantized_rows(lin))))

    def _detach(self) -> None:
        super()._detach()
        for override in getattr(self, "_overrides", []):
            override.restore()
        self._overrides = []

    def _forward_fn(self, shards: List[_Shard], dequantize=None):
        # dequantize: GGUF weights stay quantized bytes in the shards (runtime/gguf/linear)
        mover = self.mover
        ledgers = [t.ledger for t in self.targets]
        # (input, {device: copy}), one for all the sharded Linears: q/k/v, called one
        # after another on the same input, share one send, and a Linear called on another
        # input frees the copies (per-Linear caches kept every Linear's input copy alive
        # until the forward ended: the simulated device's meter showed 9x the working memory)
        last = self._sent

        meter = self.check.meter if self.check is not None else None

        def forward(x: torch.Tensor) -> torch.Tensor:
            if last[0] is not x:
                last[0], last[1] = x, {}
            sent = last[1]
            outs = []
            for s in shards:
                d = s.device
                if meter is not None:
                    meter.set_device(d)             # its input copy and output land there
                if d == 0:
                    xd = x
                else:
                    xd = sent.get(d)
                    if xd is None:
                        xd = sent[d] = mover.copy_to(x, d, 0)
                        self.hops += 1
                if dequantize is None:
                    y = F.linear(xd, s.weight, s.bias)
                else:
                    b = None if s.bias is None else s.bias.to(xd.dtype)
                    y = F.linear(xd, dequantize(s.weight, xd.dtype), b)
                for down, up, scale in s.loras:
                    if dequantize is not None:
                        down, up = down.to(xd.dtype), up.to(xd.dtype)
                    y = y + scale * F.linear(F.linear(xd, down), up)
                if d != 0:
                    ledgers[d].set_activations(xd.numel() * xd.element_size()
                                               + y.numel() * y.element_size(), "row shard")
                    if meter is not None:
                        meter.set_device(0)
                    y = mover.copy_to(y, 0, d)
                    self.hops += 1
                outs.append(y)
            if meter is not None:
                meter.set_device(0)
            return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        return forward

    def _root_pre(self, module, args, kwargs):
        if not self.loaded:
            # a reload after release() may happen under the caller's inference mode
            # (ComfyUI samples in it); device buffers must be normal tensors that the
            # copy worker can write
            with torch.inference_mode(False):
                self._load()
        self._sent[0] = self._sent[1] = None
        self.targets[0].ledger.set_inputs(seen_bytes(args, kwargs))
        if not self.mover.simulated:
            main = self.targets[0].device
            return to_device(args, main), to_device(kwargs, main)
        return None

    def _root_post(self, module, args, output):
        self._sent[0] = self._sent[1] = None
        for t in self.targets:
            t.ledger.set_activations(0)
        self.mover.end_forward()
        self.forwards += 1
        return None

    def _more_stats(self) -> dict:
        return {**self._split_stats(), "sharded_linears": getattr(self, "sharded", 0),
                "shards_per_device": dict(getattr(self, "shard_counts", {}))}


def fall_back_to_layer(placement, module: nn.Module) -> None:
    """The row split asked for runs as `placement` (a layer split): said once, recorded
    in its stats (runtime/engine/fallbacks.py)."""
    placement.fallbacks.add(
        "row_to_layer", "row", "layer",
        f"split_mode=row found no Linear weight of at least {MIN_ROWS}x{MIN_COLS} inside "
        f"the blocks of {type(module).__name__}; using layer split instead", stacklevel=4)

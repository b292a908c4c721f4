"""A range run in one round trip. The model's own loop calls the blocks one by one; on a
first forward each remote block is called separately and the main process learns how each
block's tensors come from the previous block's outputs or the first block's inputs (by
identity). The worker then replays that chain: it runs the whole range on the first
block's inputs and sends back only the last block's outputs; the blocks before the last
return placeholders locally.

Placeholders are only safe if the model merely passes them on. Learned on the first
forward and checked on every later one: each input is the expected object, unchanged in
place, and no intermediate output outlives its use (weak references: a model that keeps
one, e.g. a UNet's skip connections or a DiT's long skips, never gets a chain). The last
intermediate outputs are checked at a checkpoint: the next block's call, or the end of
the module's forward.
"""
import weakref
from typing import Any, Callable, List, Optional

import torch

from ...placement.errors import PlacementError
from .wire import flatten, unflatten


def learn_link(inputs: List, prev_outputs: List, first_inputs: List) -> Optional[List]:
    """Where each input tensor of call k comes from: ["out", i] (call k-1's output i) or
    ["first", i] (call 0's input i); None when one is computed by the model in between."""
    sources = []
    for t in inputs:
        src = next((["out", i] for i, o in enumerate(prev_outputs) if o is t), None) or \
            next((["first", i] for i, f in enumerate(first_inputs) if f is t), None)
        if src is None:
            return None
        sources.append(src)
    return sources


def run_chain(blocks, chain: List[dict], args, kwargs) -> Any:
    """Worker side: chain[k-1] = {"skeleton", "sources"} for block k >= 1."""
    _, first = flatten((args, kwargs))
    out = blocks[0](*args, **kwargs)
    for block, link in zip(blocks[1:], chain):
        _, prev = flatten(out)
        tensors = [prev[i] if kind == "out" else first[i] for kind, i in link["sources"]]
        a, kw = unflatten(link["skeleton"], tensors)
        out = block(*a, **kw)
    return out


def _alive(refs: List[List[weakref.ref]]) -> bool:
    return any(r() is not None for call in refs for r in call)


def _signature(tensors) -> list:
    return [(t.dtype, tuple(t.shape)) for t in tensors]


class RangeCalls:
    """The calls of one range's blocks in a forward. remote(message, payload, device)
    runs on the worker; mode "block" runs one block, "chain" the whole range."""

    def __init__(self, names: List[str], use_chain: bool, remote: Callable):
        self.names, self.n, self.remote = names, len(names), remote
        self.use_chain = use_chain and self.n > 1
        self.learned: Optional[dict] = None    # chain, per-call output skeletons and shapes
        self.pending: Optional[dict] = None    # the forward in progress
        self.watch: Optional[tuple] = None     # (refs to check at the checkpoint, chained?)

    @property
    def chained(self) -> bool:
        return bool(self.learned and self.learned.get("confirmed"))

    def call(self, k: int, args, kwargs, skeleton, tensors, out_device):
        if k == 0:
            self._check_watch()
            learned = self.learned
            if self.use_chain and self.chained and learned["skeletons"][0] == skeleton and \
                    learned["inputs"] == _signature(tensors):
                self.pending = {"chained": True, "first": (args, kwargs), "first_t": tensors,
                                "versions": [t._version for t in tensors], "prev": [],
                                "refs": []}
            else:
                self.pending = {"chained": False, "skeletons": [skeleton],
                                "inputs": _signature(tensors), "first_t": tensors,
                                "chain": [] if self.use_chain else None, "outs": [],
                                "prev": [], "refs": []}
        p = self.pending
        if p is None:
            raise PlacementError(f"remote block {self.names[k]} called before "
                                 f"{self.names[0]}, the first of its range")
        if p["chained"]:
            return self._chained(p, k, skeleton, tensors, out_device)
        return self._learning(p, k, args, kwargs, skeleton, tensors, out_device)

    def _learning(self, p, k, args, kwargs, skeleton, tensors, out_device):
        """Block by block, one round trip each, learning how the blocks chain."""
        if k > 0:
            p["skeletons"].append(skeleton)
            if p["chain"] is not None:
                link = learn_link(tensors, p["prev"], p["first_t"])
                kept = _alive(p["refs"][:-1])          # an output kept past its use
                p["chain"] = None if link is None or kept else p["chain"] + [
                    {"skeleton": skeleton, "sources": link}]
        out = self.remote({"mode": "block", "index": k}, (args, kwargs), out_device)
        out_skeleton, outs = flatten(out)
        p["outs"].append((out_skeleton, _signature(outs)))
        p["prev"] = outs
        p["refs"].append([weakref.ref(t) for t in outs])
        if k == self.n - 1:
            self.learned = {"skeletons": p["skeletons"], "inputs": p["inputs"],
                            "chain": p["chain"], "outs": p["outs"], "confirmed": False}
            self.watch = (p["refs"][:-1], False) if p["chain"] is not None else None
            self.pending = None
        return out

    def _chained(self, p, k, skeleton, tensors, out_device):
        learned = self.learned
        if k > 0:
            link = learned["chain"][k - 1]
            ok = skeleton == link["skeleton"] and len(tensors) == len(link["sources"]) and \
                all(t is (p["prev"][i] if kind == "out" else p["first_t"][i])
                    for t, (kind, i) in zip(tensors, link["sources"])) and \
                all(t._version == 0 for t in p["prev"]) and not _alive(p["refs"][:-1])
            if not ok:
                self._refuse("changed or kept activations between")
        if k < self.n - 1:                  # a placeholder: no memory, never read if valid
            out_skeleton, shapes = learned["outs"][k]
            prev = [torch.empty((), dtype=d, device=out_device).expand(s) for d, s in shapes]
            p["prev"] = prev
            p["refs"].append([weakref.ref(t) for t in prev])
            return unflatten(out_skeleton, prev)
        if any(t._version != v for t, v in zip(p["first_t"], p["versions"])):
            self._refuse("changed in place the inputs of")
        self.pending = None
        out = self.remote({"mode": "chain", "chain": learned["chain"]}, p["first"], out_device)
        self.watch = (p["refs"], True)        # a failed step's frames may still hold them
        return out

    def _refuse(self, what: str):
        self.pending = None
        self.learned = None                 # learn again on the next forward
        raise PlacementError(f"the model {what} remote blocks {self.names[0]}.."
                             f"{self.names[-1]} on this forward (not on the first); run "
                             f"again, or use chain=False")

    def checkpoint(self) -> None:
        """Called when the range is done: the next block starts, or the module returns."""
        self._check_watch()

    def _check_watch(self) -> None:
        if self.watch is None:
            return
        refs, chained = self.watch
        self.watch = None
        if not _alive(refs):
            if self.learned is not None:
                self.learned["confirmed"] = True
            return
        if chained:
            self._refuse("kept intermediate outputs of")
        if self.learned is not None:
            self.learned["chain"] = None         # the model keeps them: block by block

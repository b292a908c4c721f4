"""Where an activation is, and bringing a block's arguments to the block's device.

Each source tensor crosses to a given device at most once per forward: the copy is
cached (keyed by the source's identity, the source kept alive so the key stays
unique) until the forward ends. So timestep embeddings, rotary tables, masks and
encoder states move once per range boundary, not once per block.

On real devices a tensor's place is `tensor.device`. On simulated devices every
tensor is host memory, so copies and block outputs carry a tag (an attribute naming
the device index); an untagged tensor is where the working-memory meter saw it
computed (`locate`, when the device check meters: a tensor made inside a block between
two of its hooked layers is on the block's device, as on a GPU), else on the main
device, where the module's own (non-block) code runs.
"""
import threading
from typing import List, Sequence

import torch

from .hops import DEFAULT_HOP_LINK, make_hop, tensor_bytes


class Mover:
    def __init__(self, targets: Sequence, hop_link=DEFAULT_HOP_LINK):
        n = len(targets)
        self.n = n
        self.link = hop_link
        self.simulated = any(t.simulated for t in targets)
        self.hop = [[None if i == j else make_hop(targets[i], targets[j], hop_link)
                     for j in range(n)] for i in range(n)]
        self.tag = f"_placement_split_{id(self):x}"
        if self.simulated:
            self.keys: List[object] = list(range(n))
        else:
            self.keys = [t.device for t in targets]
            self._index = {}
            for i, t in enumerate(targets):
                self._index.setdefault(t.device, i)
        # the per-forward state is per thread: a pipelined split (pipeline.py) runs its
        # shares' forwards on threads at once, each with its own copies
        self._local = threading.local()
        self._count = threading.Lock()
        self.copies = 0
        self.bytes = 0
        self.seconds = 0.0        # modelled link time (simulated devices)
        self.locate = None        # simulated: tensor -> device index computed on, or None

    def _state(self):
        s = self._local
        if not hasattr(s, "cache"):
            s.cache = [{} for _ in range(self.n)]
            s.cache_bytes = [0] * self.n
            s.served = 0          # bytes handed out as copies by the current bring()
        return s

    @property
    def cache(self):
        return self._state().cache

    @property
    def cache_bytes(self):
        return self._state().cache_bytes

    @property
    def served(self) -> int:
        return self._state().served

    @served.setter
    def served(self, v: int) -> None:
        self._state().served = v

    # -- location ---------------------------------------------------------------------
    def where(self, t: torch.Tensor):
        if self.simulated:
            tag = getattr(t, self.tag, None)
            if tag is None and self.locate is not None:
                tag = self.locate(t)
            return 0 if tag is None else tag
        return t.device

    def _source_index(self, key) -> int:
        return key if self.simulated else self._index.get(key, -1)

    def index_of(self, t: torch.Tensor) -> int:
        """Index of the device `t` is on (-1: none of this split's devices)."""
        return self._source_index(self.where(t))

    def tag_outputs(self, x, d: int):
        """Simulated devices: what a block on device d returned lives on d."""
        if isinstance(x, torch.Tensor):
            setattr(x, self.tag, d)
        elif isinstance(x, (tuple, list)):
            for v in x:
                self.tag_outputs(v, d)
        elif isinstance(x, dict):
            for v in x.values():
                self.tag_outputs(v, d)

    # -- moving -----------------------------------------------------------------------
    def copy_to(self, t: torch.Tensor, d: int, src: int = -1) -> torch.Tensor:
        """One hop of `t` to device d, uncached (row split's per-call traffic). `src`:
        the device index `t` is on, when the caller knows it."""
        if src < 0:
            src = self.index_of(t)
        hop = self.hop[src][d] if src >= 0 else None
        out = hop(t) if hop is not None else t.to(self.keys[d])
        n = tensor_bytes(t)
        with self._count:
            self.copies += 1
            self.bytes += n
            if self.simulated:
                self.seconds += self.link.seconds(n)
        if self.simulated:
            if d:                         # untagged means main: outputs stay clean
                setattr(out, self.tag, d)
        return out

    def bring(self, x, d: int):
        """`x` (a tensor, or tuples/lists/dicts of them) with every tensor on device d."""
        if isinstance(x, torch.Tensor):
            if self.where(x) == self.keys[d]:
                return x
            s = self._state()
            hit = s.cache[d].get(id(x))
            if hit is None:
                hit = (x, self.copy_to(x, d))
                s.cache[d][id(x)] = hit
                s.cache_bytes[d] += tensor_bytes(x)
            s.served += tensor_bytes(x)
            return hit[1]
        if isinstance(x, (tuple, list)):
            new = [self.bring(v, d) for v in x]
            if all(a is b for a, b in zip(new, x)):
                return x
            return type(x)(new) if type(x) in (tuple, list) else type(x)(*new)
        if isinstance(x, dict):
            new = {k: self.bring(v, d) for k, v in x.items()}
            if all(new[k] is v for k, v in x.items()):
                return x
            return type(x)(new) if type(x) is dict else new
        return x

    def end_forward(self) -> None:
        s = self._state()
        for c in s.cache:
            c.clear()
        s.cache_bytes = [0] * self.n

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
device, where the module's own (non-block) code runs. The device check (simcheck.py)
locates every operand the same way and refuses an operation whose operands are on two
devices, so a tensor this mover did not bring fails as it would on a GPU.
"""
import copy
import dataclasses
import threading
from typing import Callable, Dict, List, Sequence

import torch

from .hops import DEFAULT_HOP_LINK, make_hop, tensor_bytes


def map_tensors(fn: Callable, x):
    """`x` with `fn` applied to every tensor in it, through tuples, namedtuples, lists,
    dicts, dataclass instances (ComfyUI's Flux hands its blocks ModulationOut objects) and
    objects with __slots__ (LTX-2's CompressedTimestep);
    a container whose tensors all come back as they were is returned itself, and none
    is changed in place (the caller may keep using its own)."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (tuple, list)):
        new = [map_tensors(fn, v) for v in x]
        if all(a is b for a, b in zip(new, x)):
            return x
        if type(x) in (tuple, list):
            return type(x)(new)
        return type(x)(*new) if hasattr(x, "_fields") else type(x)(new)   # namedtuple
    if isinstance(x, dict):
        new = {k: map_tensors(fn, v) for k, v in x.items()}
        if all(new[k] is v for k, v in x.items()):
            return x
        if type(x) is dict:
            return new
        out = copy.copy(x)          # a dict subclass keeps its type (OrderedDict...)
        out.update(new)
        return out
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        changed = {}
        for f in dataclasses.fields(x):
            v = getattr(x, f.name, None)
            w = map_tensors(fn, v)
            if w is not v:
                changed[f.name] = w
        if not changed:
            return x
        out = copy.copy(x)          # not replace(): fields with init=False, frozen ones
        for name, w in changed.items():
            object.__setattr__(out, name, w)
        return out
    traverse = CONTAINERS.get(type(x))
    if traverse is not None:        # a type a model family registered (memo caches)
        return traverse(lambda v: map_tensors(fn, v), x)
    slots = _slots(type(x))
    if slots:                       # a value object (LTX-2's CompressedTimestep)
        changed = {}
        for name in slots:
            v = getattr(x, name, None)
            w = map_tensors(fn, v)
            if w is not v:
                changed[name] = w
        if not changed:
            return x
        out = copy.copy(x)
        for name, w in changed.items():
            object.__setattr__(out, name, w)
        return out
    return x


# type -> traverse(map_one, obj): obj with map_one applied to what it holds (the same
# object where nothing changed). For objects a family hands its blocks that hold
# tensors in plain attributes (SeedVR2's memo Cache): register_container.
CONTAINERS: Dict[type, Callable] = {}


def register_container(cls: type, traverse: Callable) -> None:
    """Let map_tensors (the split's moves, the rehearsal's hops) reach into `cls`."""
    CONTAINERS[cls] = traverse


def is_block_state(v) -> bool:
    """A plain dict of tensors and scalars handed to a block: the block's own state,
    which it writes into (Causal-Wan's per-layer KV caches: `kv_cache["k"][:, a:b] = k`,
    `kv_cache["end"] = b`). Not copied when brought: its tensors move in it, so the state
    lives on its block's device and its writes stay where the caller reads them."""
    if type(v) is not dict or not v:
        return False
    values = v.values()
    return any(isinstance(t, torch.Tensor) for t in values) and \
        all(isinstance(t, (torch.Tensor, int, float, bool, type(None))) for t in values)


def _slots(cls) -> tuple:
    """The attribute names a class declares in __slots__ (its bases' too); () for a
    class without them (only value objects declare slots; modules and options do not)."""
    names = []
    for c in cls.__mro__:
        s = c.__dict__.get("__slots__", ())
        names += [s] if isinstance(s, str) else [n for n in s if n not in ("__dict__",
                                                                           "__weakref__")]
    return tuple(names)


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
        self.relocate = None      # simulated: (copy, device index): the copy's storage is there

    def _state(self):
        s = self._local
        if not hasattr(s, "cache"):
            s.cache = [{} for _ in range(self.n)]
            s.cache_bytes = [0] * self.n
            s.served = 0          # bytes handed out as copies by the current bring()
            s.copied = 0          # copies this thread made, and their bytes (all forwards)
            s.copied_bytes = 0
        return s

    def moved_here(self):
        """(copies, bytes) this thread has made so far: what one bring() moved is the
        difference, exact also while a pipelined split's other shares copy at once."""
        s = self._state()
        return s.copied, s.copied_bytes

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
        def tag(t):
            setattr(t, self.tag, d)
            return t
        map_tensors(tag, x)

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
        s = self._state()
        s.copied += 1
        s.copied_bytes += n
        if self.simulated:
            if d:                         # untagged means main: outputs stay clean
                setattr(out, self.tag, d)
            if self.relocate is not None:  # the copy was allocated like its source
                self.relocate(out, d)
        return out

    def bring(self, x, d: int):
        """`x` (a tensor, or containers of them: map_tensors) with every tensor on
        device d."""
        return map_tensors(lambda t: self._bring_one(t, d), x)

    def bring_block_args(self, args, kwargs, d: int):
        """A block's arguments on device d; block state (`is_block_state`) is moved in
        the caller's own dict, everything else as `bring` does."""
        for v in list(args) + list(kwargs.values()):
            if is_block_state(v):
                for k, t in v.items():
                    if isinstance(t, torch.Tensor):
                        v[k] = self._bring_one(t, d)
        return self.bring(args, d), self.bring(kwargs, d)

    def bring_within(self, x, d: int):
        """`x` with the tensors that are on another of the split's devices brought to
        device d (a non-block module's arguments, crossings.py); a tensor on none of them
        (a host tensor in a CUDA split) is left where it is."""
        def one(t):
            i = self.index_of(t)
            return t if i < 0 or i == d else self._bring_one(t, d)
        return map_tensors(one, x)

    def _bring_one(self, x: torch.Tensor, d: int) -> torch.Tensor:
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

    def end_forward(self) -> None:
        s = self._state()
        for c in s.cache:
            c.clear()
        s.cache_bytes = [0] * self.n

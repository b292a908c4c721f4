"""What every kind of placement prices with: the components' geometry, work and rules,
the GPUs' budgets and speeds, and one memo for the fit (every Option is immutable, so
one built for a key is the one returned for it again)."""
from typing import Dict, Iterator, List, Optional, Sequence

from ..components import PHASES
from ..remote_devices import is_remote
from .geometry import Geometry
from .option import PHASE_ORDER

_PHASE_INDEX = {p: i for i, p in enumerate(PHASE_ORDER)}


class FitContext:
    """One fit's facts. Kinds (kinds/*.py) read it and build Options through `memo`."""

    def __init__(self, geos: Dict[str, Geometry], works, rules, gpus: List[str],
                 budgets: Dict[str, int], host_budget: int, model, depth,
                 tiles: Optional[Dict[str, list]] = None, workspace: Optional[int] = None):
        self.geos, self.work, self.rules = geos, works, rules
        # the kernel workspace the accelerators allocate beside the tensors (the part of
        # an estimate's working memory that does not scale with the batch); None: the
        # planner's default (metadata/headroom.WORKSPACE)
        self.workspace = workspace
        self.gpus = gpus
        self.gidx = {name: i for i, name in enumerate(gpus)}
        self.G = len(gpus)
        self.model = model
        self.tp = [model.throughput[g] for g in gpus]
        self.bw = [model.bandwidth[g] for g in gpus]
        self.cpu_tp = model.throughput["cpu"]
        self.budget = [budgets[g] for g in gpus]
        self.host_budget = host_budget
        self.depth = depth
        self.tiles = tiles or {}          # component -> [tiles.Tile], largest first
        self.phase_of = {c: _PHASE_INDEX[PHASES[c]] for c in geos}
        self.homogeneous = len(set(self.tp)) <= 1 and len(set(self.bw)) <= 1
        # GPUs of other machines (ALIAS.DEVICE, placement/remote_devices.py): only a layer
        # split's range held there for the session runs on them (runtime/distributed)
        self.remote = {d for d, g in enumerate(gpus) if is_remote(g)}
        self._memo: Dict[tuple, object] = {}

    def memo(self, key: tuple, build):
        """The value built for `key` in this fit (build() runs once per key)."""
        got = self._memo.get(key, self)
        if got is self:
            got = self._memo[key] = build()
        return got

    def compute_s(self, c: str, flop_share: float, dev: int) -> float:
        return self.work[c].flop * flop_share / self.tp[dev]

    def depth_for(self, c: str) -> int:
        """The deepest ring tried for c (`depth`: one int, or {component: int})."""
        return self.depth[c] if isinstance(self.depth, dict) else self.depth

    def source(self, c: str) -> str:
        """Where c's weights rest when they take turns: disk when asked, else host RAM
        (the search moves them to disk when host RAM runs short)."""
        return "disk" if self.rules[c].params == "disk" else "cpu"

    def devices(self, c: str) -> List[int]:
        """The GPUs c may compute on alone: the asked runtime, else every local GPU the
        executor runs it on (the rules are fixed for the fit: asked once per component)."""
        return self.memo(("devices", c), lambda: self._devices(c))

    def _devices(self, c: str) -> List[int]:
        rt = self.rules[c].runtime
        if rt is None:
            allowed = self.rules[c].gpus
            return [d for d in range(self.G) if (allowed is None or self.gpus[d] in allowed)
                    and d not in self.remote]
        return [self.gidx[n] for n in rt if n in self.gidx]

    def distinct_devices(self, c: str, rooms: Sequence[int]) -> Iterator[int]:
        """devices(c), once per (room, speed, link): equal GPUs price the same."""
        seen = set()
        for d in self.devices(c):
            sig = (rooms[d], self.tp[d], self.bw[d])
            if sig not in seen:
                seen.add(sig)
                yield d

    def split_sets(self, c: str, rooms: Sequence[int]) -> List[List[int]]:
        """Device sets to split over: the user's list, else the k roomiest GPUs for each k
        (the roomiest is the main device; local GPUs before remote ones)."""
        geo = self.geos[c]
        rt = self.rules[c].runtime
        if rt is not None and len(rt) > 1:
            devs = [self.gidx[n] for n in rt if n in self.gidx]
            return [devs] if len(devs) >= 2 else []
        allowed = self.rules[c].gpus
        order = sorted((d for d in range(self.G) if rooms[d] > geo.headroom
                        and (allowed is None or self.gpus[d] in allowed)),
                       key=lambda d: (d in self.remote, -rooms[d], d))
        if order and order[0] in self.remote:
            return []
        return [order[:k] for k in range(2, len(order) + 1)]

    def may_split(self, c: str, offered) -> bool:
        """A split is worth pricing unless c fits one GPU whole and the GPUs are equal
        (then a split only adds hops)."""
        return not (self.homogeneous and any(o.kind.whole for o in offered))

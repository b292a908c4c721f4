"""The auto-fit search: which placement of every component gives the fastest generation.

Each kind of placement (kinds/) offers its candidates and prices them; this file only
compares and chooses. Two families of placement:
- persistent: weights rest on the GPU(s) for the session (resident, or a resident
  layer/row split). They take room in every phase.
- turn-taking: weights rest on cpu (or disk) and come to the GPU only while the
  component's phase runs (whole, streamed with a resident prefix, or split), or the
  component computes on the CPU. Text encode, sampling and decode never run at once,
  so turn-taking components of different phases share the same room.

A depth-first search picks, largest component first, a persistent placement or
"takes turns"; at each leaf every phase picks its turn-taking placements in the room
the persistent ones leave, and host RAM decides cpu vs disk. Branch and bound (each
component's best cost alone) prunes; identical devices are tried once. The bound is a
true one: a kind whose candidates are not monotone in room (in less room it may offer a
layout cheaper than any it offers in more: the splits, a worker's range, batch parallel
on unequal GPUs) lowers it to its room-free floor (Kind.bound, bounds.py). So the plan
is the cheapest leaf over the candidates the kinds offer, the one pricing every leaf
with no cut finds (tests/placement/test_fit_exact.py).

More memory never makes the predicted time worse where the candidates are monotone in
room (whole on a GPU, streamed on one, the CPU, a resident layer split or batch
parallel over equal GPUs; one turn-taking component per phase). Elsewhere it may: a
kind picks its layout from the room it is given (a worker's range is led by the
roomiest local GPU, a streaming split spans every GPU with room, a split is not priced
while the component fits one of equal GPUs whole), and more room can hand it a dearer
layout than the one less room forced.
"""
from typing import Dict, List, Optional, Sequence, Tuple

from .context import FitContext
from .floors import LeafFloors
from .kinds import KINDS
from .option import PHASE_ORDER, Option


class PersistentRoom:
    """What the other persistent choices leave a component that would rest on GPUs for
    the session: `free` per GPU (budget less their weights), `extra` per phase per GPU
    (their working memory), and `caps`: room for its weights in every phase with its
    own working memory in its phase `phase`."""
    __slots__ = ("free", "extra", "phase", "caps")

    def __init__(self, ctx, c: str, persist: Sequence[int], extra: List[List[int]]):
        self.free = [ctx.budget[d] - persist[d] for d in range(ctx.G)]
        self.extra, self.phase = extra, ctx.phase_of[c]
        hr = ctx.geos[c].headroom
        self.caps = [min(self.weights_room(d), self.phase_room(d) - hr) for d in range(ctx.G)]

    def weights_room(self, d: int) -> int:
        """Bytes for weights on GPU d in every phase."""
        return min(self.free[d] - e[d] for e in self.extra)

    def phase_room(self, d: int) -> int:
        """Bytes on GPU d in the component's phase (weights and working memory)."""
        return self.free[d] - self.extra[self.phase][d]


class Search(LeafFloors, FitContext):
    """One fit: compares the kinds' candidates and keeps the fastest plan that fits
    (leaves that lose by their floor are not priced: floors.py)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.alternatives: Dict[str, Dict[str, Option]] = {}
        self.comps = sorted(self.geos, key=lambda c: (-self.geos[c].total, c))
        self._phase_cache: Dict[tuple, Optional[Tuple[float, list]]] = {}
        self.leaves = 0

    def _kinds(self, c: str):
        only = self.rules[c].only
        return KINDS if only is None else [k for k in KINDS if k.name == only]

    def persistent_options(self, c: str, persist: List[int],
                           extra: List[List[int]]) -> List[Option]:
        """Placements of `c` whose weights stay on GPUs for the session, given what the
        other persistent components already hold (`persist` in every phase, `extra` per
        phase: their working memory); cheapest first. Asked again for the same room
        (the DFS's first choices, in the room lower_bounds priced) from the memo."""
        return self.memo(("persistent", c, tuple(persist), tuple(map(tuple, extra))),
                         lambda: self._persistent(c, persist, extra))

    def _persistent(self, c: str, persist: List[int], extra: List[List[int]]) -> List[Option]:
        room = PersistentRoom(self, c, persist, extra)
        out: List[Option] = []
        for kind in self._kinds(c):
            out += kind.persistent(self, c, room, out)
        if len(out) > 1:
            out.sort(key=lambda o: (o.cost, o.hops, -min(room.caps[d] for d in o.persist)))
        return out

    def floating_options(self, c: str, rooms: Sequence[int]) -> List[Option]:
        """Turn-taking placements of `c` that fit `rooms` (bytes free per GPU in c's phase)."""
        return self.memo(("floating", c, tuple(rooms)), lambda: self._floating(c, rooms))

    def _floating(self, c: str, rooms: Sequence[int]) -> List[Option]:
        out: List[Option] = []
        for kind in self._kinds(c):
            out += kind.floating(self, c, rooms, out)
        return out

    # -- the search -------------------------------------------------------------------------
    def lower_bounds(self) -> Dict[str, float]:
        """Each component's best cost with every GPU to itself, lowered to the room-free
        floor of each kind whose cheapest in a room may be below its cheapest in more
        (Kind.bound, fit/bounds.py): a bound no plan beats. inf: nothing of it fits even
        alone (failure.py says why)."""
        zero = [0] * self.G
        empty = [[0] * self.G for _ in PHASE_ORDER]
        lbs = {}
        self.turns_floor = {}
        for c in self.comps:
            opts = self.persistent_options(c, zero, empty) + \
                self.floating_options(c, self.budget)
            lbs[c] = min((o.cost for o in opts), default=float("inf"))
            held = floating = float("inf")
            for kind in self._kinds(c):
                got = kind.bound(self, c, True)
                held = held if got is None else min(held, got)
                got = kind.bound(self, c, False)
                floating = floating if got is None else min(floating, got)
            self.turns_floor[c] = floating
            if lbs[c] != float("inf"):
                lbs[c] = min(lbs[c], held, floating)
            best: Dict[str, Option] = {}       # the report's alternatives, each alone
            for o in opts:
                fam = o.kind.parallel
                if fam not in best or (o.cost, o.hops) < (best[fam].cost, best[fam].hops):
                    best[fam] = o
            self.alternatives[c] = best
        return lbs

    def run(self):
        """The best leaf: (key, {comp: Option}, usage) or None when nothing fits."""
        self.lbs = self.lower_bounds()
        self.init_floors()
        if any(lb == float("inf") for lb in self.lbs.values()):
            return None
        persist = [0] * self.G
        for c, rule in self.rules.items():   # params asked on another GPU: held all along
            if rule.params_elsewhere:
                persist[self.gidx[rule.params]] += self.geos[c].total
        extra = [[0] * self.G for _ in PHASE_ORDER]
        if all(r.floating or r.params_elsewhere for r in self.rules.values()):
            self.turns = ([*persist], [[*e] for e in extra])
        self._dfs(0, persist, extra, {}, [], 0.0)
        self.finish()
        return self.best

    def _dfs(self, i: int, persist, extra, fixed: Dict[str, Option], floating: List[str],
             spent: float):
        """`spent`: cost of the persistent choices plus a lower bound for each component
        already set to take turns (its best in today's room, rooms only shrink deeper,
        lowered to the room-free floor of the kinds whose best may drop as they do)."""
        if self.cut(spent + sum(self.lbs[c] for c in self.comps[i:])):
            return
        if i == len(self.comps):
            self.leaf(persist, extra, fixed, floating)
            return
        c = self.comps[i]
        for o in self.persistent_options(c, persist, extra):
            for d, b in o.persist.items():
                persist[d] += b
            for d, b in o.use.items():
                extra[o.phase][d] += b
            fixed[c] = o
            self._dfs(i + 1, persist, extra, fixed, floating, spent + o.cost)
            del fixed[c]
            for d, b in o.persist.items():
                persist[d] -= b
            for d, b in o.use.items():
                extra[o.phase][d] -= b
        rule = self.rules[c]
        if rule.floating or rule.params_elsewhere:
            p = self.phase_of[c]
            rooms = [self.budget[d] - persist[d] - extra[p][d] for d in range(self.G)]
            now = min((o.cost for o in self.floating_options(c, rooms)), default=None)
            if now is None:
                return                 # nothing of c fits what is left: prune
            now = min(now, self.turns_floor[c])
            floating.append(c)
            self._dfs(i + 1, persist, extra, fixed, floating, spent + now)
            floating.pop()

    def _evaluate(self, persist, extra, fixed, floating):
        """One leaf priced: (key, {comp: Option}, usage), or None when it does not fit."""
        chosen: Dict[str, Option] = dict(fixed)
        for p in range(len(PHASE_ORDER)):
            comps = tuple(c for c in floating if self.phase_of[c] == p)
            if not comps:
                continue
            rooms = tuple(self.budget[d] - persist[d] - extra[p][d] for d in range(self.G))
            if min(rooms, default=0) < 0:
                return None
            best = self._phase(p, comps, rooms)
            if best is None:
                return None
            for o in best[1]:
                chosen[o.comp] = o
        if any(self.budget[d] - persist[d] - extra[p][d] < 0
               for p in range(len(PHASE_ORDER)) for d in range(self.G)):
            return None
        chosen = self._host(chosen)
        if chosen is None:
            return None
        key, usage = self._score(chosen)
        return key, chosen, usage

    def _phase(self, p: int, comps: Tuple[str, ...], rooms: Tuple[int, ...]):
        """The cheapest turn-taking placements of one phase's components in `rooms`."""
        cache_key = (p, comps, rooms)
        if cache_key in self._phase_cache:
            return self._phase_cache[cache_key]
        order = sorted(comps, key=lambda c: (self.geos[c].total, c))
        best = None

        def walk(j: int, rooms: List[int], picked: List[Option], cost: float):
            nonlocal best
            if j == len(order):
                key = (round(cost, 9), sum(o.hops * o.runs for o in picked),
                       sum(o.streamed_bytes * o.runs + o.loaded_bytes for o in picked))
                if best is None or key < best[0]:
                    best = (key, list(picked))
                return
            for o in self.floating_options(order[j], rooms):
                for d, b in o.use.items():
                    rooms[d] -= b
                picked.append(o)
                walk(j + 1, rooms, picked, cost + o.cost)
                picked.pop()
                for d, b in o.use.items():
                    rooms[d] += b

        walk(0, list(rooms), [], 0.0)
        result = None if best is None else (best[0][0], best[1])
        self._phase_cache[cache_key] = result
        return result

    def _host(self, chosen: Dict[str, Option]) -> Optional[Dict[str, Option]]:
        """Host RAM first, disk only for what it cannot hold. While the host budget is
        over, the move that costs least per byte of host RAM freed is made: weights to
        disk (a streamed component only as many of its streamed blocks as the overrun
        needs: the first streamed blocks stay in RAM, the rest are read from the file
        each forward), or a turn-taking component to another placement that holds less
        host RAM (a component computing on the cpu needs its weights in RAM; streamed
        on a GPU it need not). Every move frees RAM, so this ends. RAM left over then
        takes streamed blocks back."""
        chosen = dict(chosen)
        while True:
            peak = self._host_peak(chosen)
            over = peak - self.host_budget
            if over <= 0:
                break
            best = None
            for c, o in sorted(chosen.items()):
                for alt in self._host_moves(chosen, c, o, over):
                    freed = peak - self._host_peak({**chosen, c: alt})
                    if freed <= 0:
                        continue
                    score = (alt.cost - o.cost) / freed
                    if best is None or score < best[0]:
                        best = (score, c, alt)
            if best is None:
                return None
            chosen[best[1]] = best[2]
        return self._fill_host(chosen)

    def _host_moves(self, chosen: Dict[str, Option], c: str, o: Option, over: int):
        """Placements of `c` to try when host RAM is `over` budget: `o` or, when it takes
        turns, another placement that fits its phase's room, each with its weights moved
        to disk where its kind and the rules allow."""
        rule = self.rules[c]
        alts = [o]
        if not o.persistent and (rule.floating or rule.params_elsewhere):
            use = self.usage(chosen)
            rooms = tuple(self.budget[d] - use[o.phase][d] + o.use.get(d, 0)
                          for d in range(self.G))
            alts += [a for a in self.floating_options(c, rooms) if a is not o]
        for a in alts:
            if a is not o:
                yield a
            if a.source == "cpu" and rule.params != "cpu" and rule.disk \
                    and a.kind.moves_to_disk:
                yield a.kind.to_disk(self, a, over)

    def _fill_host(self, chosen: Dict[str, Option]) -> Dict[str, Option]:
        """Give host RAM left over back to what auto-fit sent to disk, the most often
        read first (sampled components run every step)."""
        for c in sorted(chosen, key=lambda c: (-chosen[c].runs, c)):
            o = chosen[c]
            if o.source == "disk":
                chosen[c] = o.kind.refill(self, o, self.host_budget - self._host_peak(chosen))
        return chosen

    @staticmethod
    def _host_peak(chosen: Dict[str, Option]) -> int:
        persist = sum(o.host_persist for o in chosen.values())
        per_phase = [0] * len(PHASE_ORDER)
        for o in chosen.values():
            per_phase[o.phase] += o.host_use
        return persist + max(per_phase)

    def usage(self, chosen: Dict[str, Option]) -> List[List[int]]:
        """Bytes per GPU per phase."""
        use = [[0] * self.G for _ in PHASE_ORDER]
        for o in chosen.values():
            for d, b in o.persist.items():
                for p in range(len(PHASE_ORDER)):
                    use[p][d] += b
            for d, b in o.use.items():
                use[o.phase][d] += b
        return use

    def _score(self, chosen: Dict[str, Option]):
        use = self.usage(chosen)
        cost = sum(o.cost for o in chosen.values())
        hops = sum(o.hops * o.runs for o in chosen.values())
        imbalance = max((max(use[p][d] for p in range(len(PHASE_ORDER))) / self.budget[d]
                         for d in range(self.G) if self.budget[d] > 0), default=0.0)
        traffic = sum(o.streamed_bytes * o.runs + o.loaded_bytes for o in chosen.values())
        return (round(cost, 9), hops, round(imbalance, 6), traffic), use

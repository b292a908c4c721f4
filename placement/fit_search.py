"""The auto-fit search: which placement of every component gives the fastest generation.

Rules (fit_rules.py) say what each component may do; pricing (fit_pricing.py) says what
each placement costs; this file only chooses.

Two kinds of placement:
- persistent: weights rest on the GPU(s) for the session (resident, or a resident
  layer/row split). They take room in every phase.
- turn-taking: weights rest on cpu (or disk) and come to the GPU only while the
  component's phase runs (whole, streamed with a resident prefix, or split), or the
  component computes on the CPU. Text encode, sampling and decode never run at once,
  so turn-taking components of different phases share the same room.

A depth-first search picks, largest component first, a persistent placement or
"takes turns"; at each leaf every phase picks its turn-taking placements in the room
the persistent ones leave, and host RAM decides cpu vs disk. Branch and bound (each
component's best cost alone) prunes; identical devices are tried once. With one
turn-taking component per phase the search is exact for the cost model, so more
memory can never make the predicted time worse.
"""
from typing import Dict, List, Optional, Sequence, Tuple

from .components import PHASES
from .fit_costs import STREAM_OVERLAP
from .remote_devices import is_remote
from .fit_pricing import PHASE_ORDER, Option, Pricing, streamed_forward
from .fit_shapes import Geometry
from .fit_rules import Rules

_PHASE_INDEX = {p: i for i, p in enumerate(PHASE_ORDER)}
_EPS = 1e-12


class Search(Pricing):
    """One fit: the devices' budgets and speeds, the components' geometry and rules."""

    def __init__(self, geos: Dict[str, Geometry], workloads, rules: Dict[str, Rules],
                 gpus: List[str], budgets: Dict[str, int], host_budget: int, model,
                 depth: int, tiles: Optional[Dict[str, list]] = None):
        super().__init__(geos, workloads, gpus, model,
                         {c: _PHASE_INDEX[PHASES[c]] for c in geos}, tiles)
        self.rules = rules
        self.budget = [budgets[g] for g in gpus]
        self.host_budget = host_budget
        self.depth = depth
        self.homogeneous = len(set(self.tp)) <= 1 and len(set(self.bw)) <= 1
        # GPUs of other machines (ALIAS.DEVICE, placement/remote_devices.py): only a layer
        # split's range held there for the session runs on them (runtime/distributed),
        # and auto-fit gives one only when its network hops price faster than the rest
        self.remote = {d for d, g in enumerate(gpus) if is_remote(g)}
        self.alternatives: Dict[str, Dict[str, Option]] = {}
        self.comps = sorted(geos, key=lambda c: (-geos[c].total, c))
        self._phase_cache: Dict[tuple, Optional[Tuple[float, list]]] = {}
        self.leaves = 0

    def depth_for(self, c: str) -> int:
        """The deepest ring tried for c (`depth`: one int, or {component: int})."""
        return self.depth[c] if isinstance(self.depth, dict) else self.depth

    # -- choices for one component --------------------------------------------------------
    def _best_k(self, c: str, d: int, room: int, depth: int, source: str) -> Optional[int]:
        """The resident prefix to stream with, priced as stream() prices it (the ring's
        stall included, which is not monotone in the prefix). Every block kept resident
        saves its copy on each forward but is loaded (not overlapped) once per phase:
        with enough forwards (runs x (1 - overlap) >= 1, a sampled model) the cost
        without the stall only grows as the prefix shrinks, so the walk down from the
        largest prefix that fits stops once that floor passes the best found; a
        component run once prices every prefix that fits."""
        geo = self.geos[c]
        if self.rules[c].prefix_zero:
            return 0 if geo.stream_weights(0, depth) <= room else None
        kmax = geo.best_prefix(room, depth)
        if kmax is None:
            return None
        sampled = self.work[c].runs * (1 - STREAM_OVERLAP) >= 1
        best = None
        for k in range(kmax, -1, -1):
            if geo.stream_weights(k, depth) > room:
                continue
            o = self.stream(c, d, k, depth, source)
            if sampled and best is not None and o.runs * streamed_forward(
                    o.compute_s, o.transfer_s, depth, geo.n - k) + o.load_s >= best[0]:
                break
            if best is None or o.cost < best[0]:
                best = (o.cost, k)
        return best[1]

    def _tile_within(self, c: str, room: int):
        """The largest tile whose working memory fits `room` (None: none does)."""
        for tile in self.tiles.get(c, ()):
            if tile.headroom <= room:
                return tile
        return None

    def _devices(self, c: str) -> List[int]:
        rt = self.rules[c].runtime
        if rt is None:
            allowed = self.rules[c].gpus
            return [d for d in range(self.G) if (allowed is None or self.gpus[d] in allowed)
                    and d not in self.remote]
        return [self.gidx[n] for n in rt if n in self.gidx]

    def _batch_sets(self, c: str, rooms: Sequence[int]) -> List[List[int]]:
        """Device sets for batch parallel: the asked runtime list, else the k roomiest
        local GPUs for k = 2 .. the batch's items (a device needs a share)."""
        rule = self.rules[c]
        if rule.runtime is not None:
            devs = [self.gidx[n] for n in rule.runtime if n in self.gidx]
            return [devs] if len(devs) >= 2 else []
        order = sorted(self._devices(c), key=lambda d: (-rooms[d], d))
        top = min(len(order), max(2, self.work[c].items))
        return [order[:k] for k in range(2, top + 1)]

    def _batch_options(self, c: str, rooms: Sequence[int], persistent: bool) -> List[Option]:
        """Batch-parallel placements of `c` in `rooms` (persistent: bytes for its weights
        beside its working memory, else the room of its phase)."""
        rule, geo = self.rules[c], self.geos[c]
        if not rule.batch or (self.work[c].items < 2 and not rule.batch_only):
            return []
        out: List[Option] = []
        for devs in self._batch_sets(c, rooms):
            counts = self.share_items(c, devs)
            hr = self.share_headroom(c, max(counts))
            if persistent:
                if rule.persist_res and all(geo.total + hr <= rooms[d] for d in devs):
                    out.append(self.batch(c, devs, "resident", True))
                continue
            source = self._source(c)
            if source != "cpu":
                continue                  # one shared host copy: never from disk
            if rule.float_res and all(geo.total + hr <= rooms[d] for d in devs):
                out.append(self.batch(c, devs, "resident", False))
            if rule.stream and geo.n >= 2:
                for depth in range(self.depth_for(c), -1, -1):
                    if rule.prefix_zero:
                        ks = [0] if all(geo.stream_weights(0, depth) + hr <= rooms[d]
                                        for d in devs) else []
                    else:
                        fits = [geo.best_prefix(rooms[d] - hr, depth) for d in devs]
                        ks = [] if any(k is None for k in fits) else [min(fits)]
                        if ks and ks[0] > 0:
                            tight = min(devs, key=lambda d: rooms[d])
                            alone = self._best_k(c, tight, rooms[tight] - hr, depth, source)
                            if alone is not None and alone < ks[0]:
                                ks.append(alone)
                    for k in ks:
                        if k == geo.n:
                            continue              # all resident: the resident option
                        o = self.batch(c, devs, "stream", False, k, depth, source)
                        if o is not None:
                            out.append(o)
        return [o for o in out if o is not None]

    def _with_pipelines(self, c: str, opts: List[Option]) -> List[Option]:
        """Each resident layer split of `opts` also pipelined (rule.pipeline); parallel
        pipeline asked (rule.pipeline_only): only the pipelined ones, a batch of 1 too
        (the runtime runs it as the plain split)."""
        rule = self.rules[c]
        if rule.pipeline_only:
            more = [self.pipelined(o, force=True) for o in opts]
            return [p for p in more if p is not None]
        if not rule.pipeline or self.work[c].items < 2:
            return opts
        more = [self.pipelined(o) for o in opts]
        return opts + [p for p in more if p is not None]

    def _source(self, c: str) -> str:
        return "disk" if self.rules[c].params == "disk" else "cpu"

    def floating_options(self, c: str, rooms: Sequence[int]) -> List[Option]:
        """Turn-taking placements of `c` that fit `rooms` (bytes free per GPU in c's phase)."""
        key = ("f", c, tuple(rooms))
        out = self._memo.get(key)
        if out is None:
            out = self._memo[key] = self._floating_options(c, rooms)
        return out

    def _floating_options(self, c: str, rooms: Sequence[int]) -> List[Option]:
        rule, geo = self.rules[c], self.geos[c]
        source = self._source(c)
        out: List[Option] = []
        seen = set()
        batch = self._batch_options(c, rooms, False)
        if rule.batch_only:
            return batch
        for d in self._devices(c):
            room = rooms[d]
            sig = (room, self.tp[d], self.bw[d])
            if sig in seen:
                continue
            seen.add(sig)
            if rule.float_res and geo.total + geo.headroom <= room:
                out.append(self.resident(c, d, False, source))
            elif rule.float_res:
                tile = self._tile_within(c, room - geo.total)
                if tile is not None:              # tiles before the CPU
                    out.append(self.resident(c, d, False, source, tile=tile))
            if rule.stream:
                weights_room = room - geo.headroom
                for depth in range(self.depth_for(c), -1, -1):
                    k = self._best_k(c, d, weights_room, depth, source)
                    if k is not None:
                        out.append(self.stream(c, d, k, depth, source))
            if rule.params_elsewhere and geo.total + geo.headroom <= room:
                out.append(self.resident(c, d, False, params_on=self.gidx[rule.params]))
        whole = any(o.kind == "resident" for o in out)
        if rule.float_split and not (whole and self.homogeneous):
            # on equal GPUs a split only adds hops to a component that fits one whole
            sets = [devs for devs in self._split_sets(c, rooms)
                    if not self.remote.intersection(devs)]    # remote: held for the session
            fitted = False
            for devs in sets:
                caps = [rooms[d] - geo.headroom for d in devs]
                o = self.split(c, devs, rule.split_mode, caps, False, source)
                if o is not None:
                    out.append(o)
                    fitted = True
            if rule.split_stream and sets and not fitted:
                # too big for every set: stream over all of them (most room, most links;
                # a hop costs about a millisecond)
                devs = sets[-1]
                caps = [rooms[d] - geo.headroom for d in devs]
                k = len(devs)      # how many GPUs stream: all, half, or the last few
                for streaming in sorted({k, (k + 1) // 2, 3, 2, 1} & set(range(1, k + 1)),
                                        reverse=True):
                    for depth in range(self.depth_for(c), -1, -1):
                        o = self.split_stream(c, devs, caps, depth, source, streaming)
                        if o is not None:
                            out.append(o)
                            break
        if rule.split_stream and self.remote:
            out += self._remote_stream_options(c, rooms, source)
        if rule.cpu:
            out.append(self.on_cpu(c, source))
        return self._with_pipelines(c, out) + batch

    def _remote_stream_options(self, c: str, rooms: Sequence[int], source: str
                               ) -> List[Option]:
        """The roomiest local GPU streams its range while workers hold the last blocks
        (Pricing.remote_stream): for a component bigger than any one machine. Device
        sets: the asked runtime (a local main device, then workers), else the roomiest
        local GPU with the 1, 2, ... roomiest workers."""
        geo, rule = self.geos[c], self.rules[c]
        if rule.runtime is not None:
            devs = [self.gidx[n] for n in rule.runtime if n in self.gidx]
            if len(devs) < 2 or devs[0] in self.remote or \
                    any(d not in self.remote for d in devs[1:]):
                return []
            sets = [devs]
        else:
            def usable(d):
                return (rule.gpus is None or self.gpus[d] in rule.gpus) and \
                    rooms[d] > geo.headroom
            local = sorted((d for d in range(self.G) if d not in self.remote and usable(d)),
                           key=lambda d: (-rooms[d], d))
            remote = sorted((d for d in self.remote if usable(d)), key=lambda d: (-rooms[d], d))
            if not local or not remote:
                return []
            sets = [[local[0]] + remote[:k] for k in range(1, len(remote) + 1)]
        out = []
        for devs in sets:
            caps = [rooms[d] - geo.headroom for d in devs]
            for depth in range(self.depth_for(c), -1, -1):
                o = self.remote_stream(c, devs, caps, depth, source)
                if o is not None:
                    out.append(o)
                    break
        return out

    def _split_sets(self, c: str, rooms: Sequence[int]) -> List[List[int]]:
        """Device sets to split over: the user's list, else the k roomiest GPUs for each k
        (the roomiest is the main device)."""
        geo = self.geos[c]
        rt = self.rules[c].runtime
        if rt is not None and len(rt) > 1:
            devs = [self.gidx[n] for n in rt if n in self.gidx]
            return [devs] if len(devs) >= 2 else []
        allowed = self.rules[c].gpus
        # local GPUs first (the main device, where the module is, is local), then remote
        order = sorted((d for d in range(self.G) if rooms[d] > geo.headroom
                        and (allowed is None or self.gpus[d] in allowed)),
                       key=lambda d: (d in self.remote, -rooms[d], d))
        if order and order[0] in self.remote:
            return []
        return [order[:k] for k in range(2, len(order) + 1)]

    def persistent_options(self, c: str, persist: List[int],
                           extra: List[List[int]]) -> List[Option]:
        """Placements of `c` whose weights stay on GPUs for the session, given what the
        other persistent components already hold (`persist` in every phase, `extra` per
        phase: their working memory)."""
        rule, geo = self.rules[c], self.geos[c]
        p = self.phase_of[c]
        hr = geo.headroom
        # room for c's weights on each GPU: in every phase, and its headroom in phase p
        caps = []
        for d in range(self.G):
            free = self.budget[d] - persist[d]
            caps.append(min(min(free - e[d] for e in extra), free - extra[p][d] - hr))
        out: List[Option] = []
        batch = self._batch_options(c, [x + hr for x in caps], True)
        if rule.batch_only:
            return sorted(batch, key=lambda o: (o.cost, o.hops))
        if rule.persist_res:
            seen = set()
            for d in self._devices(c):
                tile = None
                if geo.total > caps[d]:
                    # full-frame working memory does not fit beside the rest: a tile may
                    free = self.budget[d] - persist[d]
                    weights_room = min(free - e[d] for e in extra)
                    if geo.total > weights_room:
                        continue
                    tile = self._tile_within(c, free - extra[p][d] - geo.total)
                    if tile is None:
                        continue
                sig = (self.budget[d], persist[d], tuple(e[d] for e in extra),
                       self.tp[d], self.bw[d])
                if sig in seen:
                    continue
                seen.add(sig)
                out.append(self.resident(c, d, True, tile=tile))
        if rule.persist_split and self.G >= 2 and not (out and self.homogeneous):
            rooms = [x + hr for x in caps]
            for devs in self._split_sets(c, rooms):
                o = self.split(c, devs, rule.split_mode, [caps[d] for d in devs], True)
                if o is not None:
                    out.append(o)
        out = self._with_pipelines(c, out) + batch
        if len(out) > 1:
            out.sort(key=lambda o: (o.cost, o.hops, -min(caps[d] for d in o.persist)))
        return out

    # -- the search -------------------------------------------------------------------------
    def lower_bounds(self) -> Dict[str, float]:
        """Each component's best cost with every GPU to itself: a bound no plan beats."""
        zero = [0] * self.G
        empty = [[0] * self.G for _ in PHASE_ORDER]
        lbs = {}
        for c in self.comps:
            opts = self.persistent_options(c, zero, empty) + \
                self.floating_options(c, self.budget)
            lbs[c] = min((o.cost for o in opts), default=float("inf"))
            best: Dict[str, Option] = {}       # the report's alternatives, each alone
            for o in opts:
                fam = o.parallel
                if fam not in best or (o.cost, o.hops) < (best[fam].cost, best[fam].hops):
                    best[fam] = o
            self.alternatives[c] = best
        return lbs

    def run(self):
        """The best leaf: (key, {comp: Option}, usage) or None when nothing fits."""
        self.lbs = self.lower_bounds()
        self.best = None
        if any(lb == float("inf") for lb in self.lbs.values()):
            return None
        persist = [0] * self.G
        for c, rule in self.rules.items():   # params asked on another GPU: held all along
            if rule.params_elsewhere:
                persist[self.gidx[rule.params]] += self.geos[c].total
        extra = [[0] * self.G for _ in PHASE_ORDER]
        self._dfs(0, persist, extra, {}, [], 0.0)
        return self.best

    def _dfs(self, i: int, persist, extra, fixed: Dict[str, Option], floating: List[str],
             spent: float):
        """`spent`: cost of the persistent choices plus a lower bound for each component
        already set to take turns (its best in today's room: rooms only shrink deeper)."""
        rest = spent + sum(self.lbs[c] for c in self.comps[i:])
        if self.best is not None and rest > self.best[0][0] * (1 + 1e-9) + _EPS:
            return
        if i == len(self.comps):
            self._leaf(persist, extra, fixed, floating)
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
            floating.append(c)
            self._dfs(i + 1, persist, extra, fixed, floating, spent + now)
            floating.pop()

    def _leaf(self, persist, extra, fixed, floating):
        self.leaves += 1
        chosen: Dict[str, Option] = dict(fixed)
        for p in range(len(PHASE_ORDER)):
            comps = tuple(c for c in floating if self.phase_of[c] == p)
            if not comps:
                continue
            rooms = tuple(self.budget[d] - persist[d] - extra[p][d] for d in range(self.G))
            if min(rooms, default=0) < 0:
                return
            best = self._phase(p, comps, rooms)
            if best is None:
                return
            for o in best[1]:
                chosen[o.comp] = o
        if any(self.budget[d] - persist[d] - extra[p][d] < 0
               for p in range(len(PHASE_ORDER)) for d in range(self.G)):
            return
        chosen = self._host(chosen)
        if chosen is None:
            return
        key, usage = self._score(chosen)
        if self.best is None or key < self.best[0]:
            self.best = (key, chosen, usage)

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
        to disk where that is allowed."""
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
            # splits read their weights from host memory (runtime/split: no disk yet)
            if a.source != "cpu" or rule.params == "cpu" or a.kind in ("split", "batch") \
                    or not rule.disk:
                continue
            moved = self.rebuild(a, "disk")
            if a.kind == "stream":
                keep = a.host_persist - over        # host bytes it may go on holding
                moved = self.with_host_blocks(moved, self.host_blocks_within(moved, keep))
            yield moved

    def _fill_host(self, chosen: Dict[str, Option]) -> Dict[str, Option]:
        """Give host RAM left over to streamed blocks auto-fit sent to disk, the most
        often read first (sampled components run every step)."""
        movable = [c for c, o in chosen.items() if o.kind == "stream" and o.source == "disk"
                   and self.rules[c].params != "disk"]
        for c in sorted(movable, key=lambda c: (-chosen[c].runs, c)):
            o = chosen[c]
            room = o.host_persist + self.host_budget - self._host_peak(chosen)
            # On disk the resident prefix is read from the file at each load, so a
            # shorter prefix with more streamed blocks held in RAM may be cheaper now
            # (a shorter prefix needs less GPU memory, so it still fits).
            alts = [o]
            for k in range(o.resident_blocks, -1, -1):
                alt = self.stream(c, self.gidx[o.runtime[0]], k, o.depth, "disk")
                alts.append(self.with_host_blocks(alt, self.host_blocks_within(alt, room)))
            chosen[c] = min(alts, key=lambda a: (a.cost, -a.host_blocks))
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

"""The auto-fit search: which placement of every component gives the fastest generation.

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
from .errors import PlacementError
from .fit_costs import STREAM_BLOCK_OVERHEAD_S, STREAM_OVERLAP
from .fit_shapes import Geometry, layer_ranges, row_shares, stream_spans

PHASE_ORDER = ("encode", "sample", "decode", "upscale")
_PHASE_INDEX = {p: i for i, p in enumerate(PHASE_ORDER)}
_EPS = 1e-12


def streamed_forward(compute: float, transfer: float, depth: int, streamed_blocks: int) -> float:
    """Seconds of one streamed forward: copies overlap compute when prefetching."""
    if depth > 0:
        t = max(compute, transfer) + (1 - STREAM_OVERLAP) * min(compute, transfer)
    else:
        t = compute + transfer
    return t + streamed_blocks * STREAM_BLOCK_OVERHEAD_S


class Option:
    """One evaluated placement of one component (immutable once built)."""
    __slots__ = ("comp", "kind", "runtime", "params", "source", "split_mode", "resident_blocks",
                 "depth", "ranges", "persist", "use", "host_persist", "host_use",
                 "resident_bytes", "streamed_bytes", "loaded_bytes", "hops", "compute_s",
                 "transfer_s", "forward_s", "load_s", "cost", "runs", "phase", "layout",
                 "per_device")

    def __init__(self, comp, kind, runtime, runs, phase):
        self.comp, self.kind, self.runtime, self.runs, self.phase = comp, kind, runtime, runs, phase
        self.split_mode = "layer"
        self.resident_blocks = self.depth = self.ranges = self.layout = self.per_device = None
        self.streamed_bytes = self.hops = self.host_use = 0
        self.transfer_s = 0.0

    @property
    def persistent(self) -> bool:
        return bool(self.persist)


class Rules:
    """What the search may decide for one component (the user's choice and the preset)."""
    __slots__ = ("runtime", "params", "split_mode", "persist_res", "persist_split", "float_res",
                 "stream", "float_split", "split_stream", "cpu", "prefix_zero",
                 "params_elsewhere", "gpus", "disk")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, False)
        self.runtime = None
        self.params = None
        self.split_mode = "layer"
        self.gpus = None          # GPU names the executor runs this component on; None: all
        self.disk = True          # params may move to disk when host RAM is short

    @property
    def floating(self) -> bool:
        return self.float_res or self.stream or self.float_split or self.cpu


def make_rules(choice, geo: Geometry, preset: str, gpus: Sequence[str],
               caps=None, real_gpus: Optional[Sequence[str]] = None) -> Rules:
    """Translate (runtime, params, split_mode) + preset into the placements allowed, then
    keep only what the executor runs for this component (`caps`: its capabilities from
    placement/capabilities.py; None: everything). `real_gpus`: the GPUs that are not
    simulated (used when the executor cannot run the component on a simulated one)."""
    if caps is not None and "simulated" not in caps and real_gpus is not None:
        gpus = [g for g in gpus if g in real_gpus]
        only = list(gpus)
    else:
        only = None
    r = _rules(choice, geo, preset, gpus)
    if caps is None:
        return r
    if only is not None:
        r.gpus = only
        if not only and r.runtime is None:
            r.cpu = True      # no GPU this component can run on: it computes on the CPU
    if "stream" not in caps:
        r.stream = False
        r.prefix_zero = False
    if f"{r.split_mode}_split" not in caps:
        r.persist_split = r.float_split = r.split_stream = False
    if "split_stream" not in caps:
        r.split_stream = False
    if "cpu_params" not in caps:
        r.float_res = r.stream = r.float_split = r.split_stream = False
    if preset == "sequential" and not (r.stream or r.float_res or r.float_split or r.cpu) \
            and (r.runtime is None or len(r.runtime) == 1):
        r.float_res = "cpu_params" in caps       # sequential, not streamable here: whole
    r.disk = "disk" in caps
    if not (r.persist_res or r.persist_split or r.floating or r.params_elsewhere):
        r.cpu = r.runtime is None or r.runtime == ["cpu"]
    return r


def _rules(choice, geo: Geometry, preset: str, gpus: Sequence[str]) -> Rules:
    r = Rules()
    runtime = list(choice.runtime) if choice.runtime else None
    params = choice.params
    r.split_mode = choice.split_mode or "layer"
    r.params = params
    splittable = geo.n >= 2
    streamable = geo.n >= 2
    offload_params = params in ("cpu", "disk")
    if runtime is not None and "cpu" in runtime:
        if len(runtime) > 1:
            raise PlacementError(f"auto-fit cannot split {geo.comp} over the cpu and GPUs "
                                 f"({'&'.join(runtime)}); name GPUs only, or cpu alone")
        r.runtime = ["cpu"]
        r.cpu = True
        return r
    if runtime is not None:
        r.runtime = runtime
    if params is not None and params not in ("cpu", "disk"):
        # weights rest on a named GPU for the session
        if runtime is None or runtime == [params] or (len(runtime) > 1 and params in runtime):
            if runtime is None:
                r.runtime = [params]
            if len(r.runtime) > 1:
                r.persist_split = True
            else:
                r.persist_res = True
        else:
            r.params_elsewhere = True
        return r
    split_only = runtime is not None and len(runtime) > 1
    single_only = runtime is not None and len(runtime) == 1
    may_split = splittable and not single_only and (split_only or len(gpus) >= 2)
    if preset == "none":
        if not offload_params:
            r.persist_res = not split_only
            r.persist_split = may_split
        else:
            r.float_res = not split_only
            r.float_split = may_split
    elif preset == "model":
        r.float_res = not split_only
        r.float_split = split_only and splittable
    elif preset == "sequential":
        r.stream = streamable and not split_only
        r.float_res = not streamable and not split_only
        r.float_split = split_only and splittable
        r.prefix_zero = True
    else:   # auto, balanced
        if not offload_params:
            r.persist_res = not split_only
            r.persist_split = may_split
        r.float_res = not split_only
        r.stream = streamable and not split_only
        r.float_split = may_split
        r.split_stream = may_split and r.split_mode == "layer"
        r.cpu = runtime is None
    if not gpus and runtime is None:
        r.cpu = True            # no accelerator: every preset computes on the CPU
    return r


class Search:
    """One fit: the devices' budgets and speeds, the components' geometry and rules."""

    def __init__(self, geos: Dict[str, Geometry], workloads, rules: Dict[str, Rules],
                 gpus: List[str], budgets: Dict[str, int], host_budget: int, model,
                 depth: int):
        self.geos, self.work, self.rules = geos, workloads, rules
        self.gpus = gpus
        self.gidx = {name: i for i, name in enumerate(gpus)}
        self.budget = [budgets[g] for g in gpus]
        self.host_budget = host_budget
        self.model = model
        self.depth = depth
        self.tp = [model.throughput[g] for g in gpus]
        self.bw = [model.bandwidth[g] for g in gpus]
        self.cpu_tp = model.throughput["cpu"]
        self.G = len(gpus)
        self.homogeneous = len(set(self.tp)) <= 1 and len(set(self.bw)) <= 1
        self.comps = sorted(geos, key=lambda c: (-geos[c].total, c))
        self.phase_of = {c: _PHASE_INDEX[PHASES[c]] for c in geos}
        self._phase_cache: Dict[tuple, Optional[Tuple[float, list]]] = {}
        self._memo: Dict[tuple, Optional[Option]] = {}   # placements are immutable: reuse
        self.leaves = 0

    # -- building one evaluated placement -------------------------------------------------
    def _compute_s(self, c: str, flop_share: float, dev: int) -> float:
        return self.work[c].flop * flop_share / self.tp[dev]

    def resident(self, c: str, d: int, persistent: bool, source: str = "cpu",
                 params_on: Optional[int] = None) -> Option:
        key = ("r", c, d, persistent, source, params_on)
        o = self._memo.get(key)
        if o is None:
            o = self._memo[key] = self._resident(c, d, persistent, source, params_on)
        return o

    def _resident(self, c, d, persistent, source, params_on) -> Option:
        geo, w = self.geos[c], self.work[c]
        compute = self._compute_s(c, 1.0, d)
        name = self.gpus[d]
        o = Option(c, "resident", [name], w.runs, self.phase_of[c])
        o.resident_bytes = geo.total
        o.compute_s = o.forward_s = compute
        if persistent:
            o.params = o.source = name
            o.persist = {d: geo.total}
            o.use = {d: geo.headroom}
            o.loaded_bytes, o.load_s, o.host_persist = 0, 0.0, 0
        elif params_on is not None:                       # rests on another GPU
            src = self.gpus[params_on]
            o.params = o.source = src
            o.persist = {params_on: geo.total}
            o.use = {d: geo.total + geo.headroom}
            o.loaded_bytes = geo.total
            o.load_s = geo.total / self.model.peer(src, name)
            o.host_persist = 0
        else:
            o.params = o.source = source
            o.persist = {}
            o.use = {d: geo.total + geo.headroom}
            o.loaded_bytes = geo.total
            o.load_s = geo.total / self.model.source_bandwidth(name, source)
            o.host_persist = geo.total if source == "cpu" else 0
        o.cost = o.runs * o.forward_s + o.load_s
        return o

    def stream(self, c: str, d: int, k: int, depth: int, source: str = "cpu") -> Option:
        key = ("s", c, d, k, depth, source)
        o = self._memo.get(key)
        if o is None:
            o = self._memo[key] = self._stream(c, d, k, depth, source)
        return o

    def _stream(self, c, d, k, depth, source) -> Option:
        geo, w = self.geos[c], self.work[c]
        name = self.gpus[d]
        bw = self.model.source_bandwidth(name, source)
        compute = self._compute_s(c, 1.0, d)
        streamed = geo.streamed_bytes(k)
        transfer = streamed / bw
        resident = geo.non_block + geo.prefix[k]
        o = Option(c, "stream", [name], w.runs, self.phase_of[c])
        o.params = o.source = source
        o.resident_blocks, o.depth = k, depth
        o.persist = {}
        o.use = {d: geo.stream_weights(k, depth) + geo.headroom}
        o.host_persist = geo.total if source == "cpu" else 0
        o.resident_bytes, o.streamed_bytes, o.loaded_bytes = resident, streamed, resident
        o.compute_s, o.transfer_s = compute, transfer
        o.forward_s = streamed_forward(compute, transfer, depth, geo.n - k)
        o.load_s = resident / bw
        o.cost = o.runs * o.forward_s + o.load_s
        return o

    def split(self, c: str, devs: List[int], mode: str, caps: List[int], persistent: bool,
              source: str = "cpu") -> Optional[Option]:
        geo = self.geos[c]
        lkey = ("l", c, mode, tuple(caps))
        if lkey in self._memo:
            layout = self._memo[lkey]
        else:
            layout = row_shares(geo, caps) if mode == "row" else layer_ranges(geo, caps)
            self._memo[lkey] = layout
        if layout is None:
            return None
        return self.split_layout(c, devs, mode, layout, persistent, source)

    def split_layout(self, c, devs, mode, layout, persistent, source) -> Optional[Option]:
        key = ("x", c, tuple(devs), mode, tuple(layout), persistent, source)
        if key not in self._memo:
            self._memo[key] = self._split(c, list(devs), mode, layout, persistent, source)
        return self._memo[key]

    def _split(self, c, devs, mode, layout, persistent, source) -> Optional[Option]:
        geo, w = self.geos[c], self.work[c]
        all_devs = tuple(devs)
        if mode == "row":
            held = [s + (geo.non_block if i == 0 else 0) for i, s in enumerate(layout)]
            ranges = None
            compute = max(self._compute_s(c, h / (geo.total or 1), devs[i])
                          for i, h in enumerate(held))
            k = len(devs)
            per_block = 2 * self.model.hop_s(w.activation_bytes * (k - 1) // k,
                                              self.gpus[devs[0]], self.gpus[devs[-1]])
            hops = 2 * geo.n
            comm = geo.n * per_block
        else:
            keep = [(i, s, e) for i, (s, e) in enumerate(layout) if e > s or i == 0]
            if len(keep) < 2:
                return None           # everything landed on one device: not a split
            devs = [devs[i] for i, _, _ in keep]
            held = [geo.prefix[e] - geo.prefix[s] + (geo.non_block if j == 0 else 0)
                    for j, (_, s, e) in enumerate(keep)]
            ranges = [(s, e - 1) for _, s, e in keep]
            compute = sum(self._compute_s(c, h / (geo.total or 1), devs[j])
                          for j, h in enumerate(held))
            hops = len(devs)          # main -> ... -> last -> main (final layers)
            comm = sum(self.model.hop_s(w.activation_bytes, self.gpus[devs[j]],
                                        self.gpus[devs[(j + 1) % len(devs)]])
                       for j in range(len(devs)))
        names = [self.gpus[i] for i in devs]
        o = Option(c, "split", names, w.runs, self.phase_of[c])
        o.split_mode, o.ranges, o.hops = mode, ranges, hops
        o.layout = (all_devs, tuple(layout))
        o.resident_bytes = geo.total
        o.compute_s, o.transfer_s, o.forward_s = compute, comm, compute + comm
        if persistent:
            o.params = o.source = names[0]
            o.persist = {devs[j]: h for j, h in enumerate(held)}
            o.use = {devs[j]: geo.headroom for j in range(len(devs))}
            o.loaded_bytes, o.load_s, o.host_persist = 0, 0.0, 0
        else:
            o.params = o.source = source
            o.persist = {}
            o.use = {devs[j]: h + geo.headroom for j, h in enumerate(held)}
            o.loaded_bytes = geo.total
            # counted serially: the host side (one pinned staging path) is the bottleneck,
            # so a split never loads faster than one whole copy on the slowest link
            o.load_s = geo.total / min(self.model.source_bandwidth(n, source) for n in names)
            o.host_persist = geo.total if source == "cpu" else 0
        o.cost = o.runs * o.forward_s + o.load_s
        return o

    def split_stream(self, c: str, devs: List[int], caps: List[int], depth: int,
                     source: str, streaming: int) -> Optional[Option]:
        """A layer split too big for its devices: a streaming device keeps a prefix of
        its range resident and streams the rest through its own ring
        (runtime/split/layer.py) over its own link. Layouts: the first devices filled and
        fully resident, the last `streaming` ones sharing the rest in proportion to room
        (fewest prefetch slots when the big blocks come first, as in Flux) - from all
        streaming (most overlap) to only the last (most resident bytes, accelerate's
        layout with a prefetch ring). The cost model picks."""
        key = ("xs", c, tuple(devs), tuple(caps), depth, source, streaming)
        if key not in self._memo:
            self._memo[key] = self._split_stream(c, devs, caps, depth, source, streaming)
        return self._memo[key]

    def _split_stream(self, c, devs, caps, depth, source, streaming) -> Optional[Option]:
        geo, w = self.geos[c], self.work[c]
        spans = stream_spans(geo, caps, streaming)
        if spans is None:
            return None
        names = [self.gpus[d] for d in devs]
        per_device, use, fwd, compute_all, transfer_all = {}, {}, 0.0, 0.0, 0.0
        resident_total = streamed_total = 0
        for j, (d, (a, b)) in enumerate(zip(devs, spans)):
            nb = geo.non_block if j == 0 else 0
            k = geo.range_prefix(a, b, caps[j] - nb, depth)
            if k is None:
                return None
            slots = geo.range_window(a + k, b, depth)
            resident = geo.prefix[a + k] - geo.prefix[a]
            streamed = geo.prefix[b] - geo.prefix[a + k]
            use[d] = nb + resident + slots + geo.headroom
            per_device[names[j]] = (k, b - a)
            held = nb + geo.prefix[b] - geo.prefix[a]
            compute = self._compute_s(c, held / (geo.total or 1), d)
            transfer = streamed / self.model.source_bandwidth(names[j], source)
            fwd += streamed_forward(compute, transfer, depth, b - a - k) if streamed else compute
            compute_all += compute
            transfer_all += transfer
            resident_total += nb + resident
            streamed_total += streamed
        comm = sum(self.model.hop_s(w.activation_bytes, names[j], names[(j + 1) % len(names)])
                   for j in range(len(names)))
        o = Option(c, "split", names, w.runs, self.phase_of[c])
        o.ranges = [(a, b - 1) for a, b in spans]
        o.resident_blocks = sum(k for k, _ in per_device.values())
        o.depth, o.per_device = depth, per_device
        o.layout = streaming
        o.params = o.source = source
        o.persist, o.use = {}, use
        o.hops = len(names)
        o.resident_bytes, o.streamed_bytes, o.loaded_bytes = (resident_total, streamed_total,
                                                              resident_total)
        o.compute_s, o.transfer_s = compute_all, transfer_all + comm
        o.forward_s = fwd + comm
        o.load_s = resident_total / min(self.model.source_bandwidth(n, source) for n in names)
        o.host_persist = geo.total if source == "cpu" else 0
        o.cost = o.runs * o.forward_s + o.load_s
        return o

    def on_cpu(self, c: str, source: str = "cpu") -> Option:
        key = ("c", c, source)
        o = self._memo.get(key)
        if o is None:
            o = self._memo[key] = self._on_cpu(c, source)
        return o

    def _on_cpu(self, c, source) -> Option:
        geo, w = self.geos[c], self.work[c]
        disk = source == "disk"
        o = Option(c, "cpu", ["cpu"], w.runs, self.phase_of[c])
        o.params = o.source = source
        o.persist, o.use = {}, {}
        o.host_persist = 0 if disk else geo.total
        o.host_use = geo.headroom + (geo.total if disk else 0)
        o.resident_bytes = geo.total
        o.loaded_bytes = geo.total if disk else 0
        o.compute_s = o.forward_s = w.flop / self.cpu_tp
        o.load_s = geo.total / self.model.disk_bandwidth if disk else 0.0
        o.cost = o.runs * o.forward_s + o.load_s
        return o

    def rebuild(self, o: Option, source: str) -> Option:
        """The same placement with its weights resting in `source` instead."""
        if o.kind == "cpu":
            return self.on_cpu(o.comp, source)
        if o.kind == "stream":
            return self.stream(o.comp, self.gidx[o.runtime[0]], o.resident_blocks, o.depth, source)
        if o.kind == "resident":
            return self.resident(o.comp, self.gidx[o.runtime[0]], False, source)
        if o.per_device is not None:
            devs = [self.gidx[n] for n in o.runtime]
            caps = [o.use[d] - self.geos[o.comp].headroom for d in devs]
            again = self._split_stream(o.comp, devs, caps, o.depth, source, o.layout)
            return again if again is not None else o
        devs, layout = o.layout
        return self.split_layout(o.comp, devs, o.split_mode, layout, False, source)

    # -- choices for one component --------------------------------------------------------
    def _best_k(self, c: str, d: int, room: int, depth: int, source: str) -> Optional[int]:
        """The resident prefix to stream with. Every block kept resident saves its copy on
        each forward but is loaded (not overlapped) once per phase: with enough forwards
        (runs x (1 - overlap) >= 1, a sampled model) the largest prefix that fits is best;
        a component run once is best streamed just enough to hide under its compute, so
        every prefix that fits is priced."""
        geo = self.geos[c]
        if self.rules[c].prefix_zero:
            return 0 if geo.stream_weights(0, depth) <= room else None
        kmax = geo.best_prefix(room, depth)
        if kmax is None or self.work[c].runs * (1 - STREAM_OVERLAP) >= 1:
            return kmax
        bw = self.model.source_bandwidth(self.gpus[d], source)
        compute = self.work[c].flop / self.tp[d]
        runs, total_blocks = self.work[c].runs, geo.prefix[geo.n]
        best = None
        for k in range(kmax, -1, -1):
            if geo.stream_weights(k, depth) > room:
                continue
            fwd = streamed_forward(compute, (total_blocks - geo.prefix[k]) / bw, depth, geo.n - k)
            cost = runs * fwd + (geo.non_block + geo.prefix[k]) / bw
            if best is None or cost < best[0]:
                best = (cost, k)
        return best[1]

    def _devices(self, c: str) -> List[int]:
        rt = self.rules[c].runtime
        if rt is None:
            allowed = self.rules[c].gpus
            return [d for d in range(self.G) if allowed is None or self.gpus[d] in allowed]
        return [self.gidx[n] for n in rt if n in self.gidx]

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
        for d in self._devices(c):
            room = rooms[d]
            sig = (room, self.tp[d], self.bw[d])
            if sig in seen:
                continue
            seen.add(sig)
            if rule.float_res and geo.total + geo.headroom <= room:
                out.append(self.resident(c, d, False, source))
            if rule.stream:
                weights_room = room - geo.headroom
                for depth in range(self.depth, -1, -1):
                    k = self._best_k(c, d, weights_room, depth, source)
                    if k is not None:
                        out.append(self.stream(c, d, k, depth, source))
            if rule.params_elsewhere and geo.total + geo.headroom <= room:
                out.append(self.resident(c, d, False, params_on=self.gidx[rule.params]))
        whole = any(o.kind == "resident" for o in out)
        if rule.float_split and not (whole and self.homogeneous):
            # on equal GPUs a split only adds hops to a component that fits one whole
            sets = self._split_sets(c, rooms)
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
                    for depth in range(self.depth, -1, -1):
                        o = self.split_stream(c, devs, caps, depth, source, streaming)
                        if o is not None:
                            out.append(o)
                            break
        if rule.cpu:
            out.append(self.on_cpu(c, source))
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
        order = sorted((d for d in range(self.G) if rooms[d] > geo.headroom
                        and (allowed is None or self.gpus[d] in allowed)),
                       key=lambda d: (-rooms[d], d))
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
        if rule.persist_res:
            seen = set()
            for d in self._devices(c):
                if geo.total > caps[d]:
                    continue
                sig = (self.budget[d], persist[d], tuple(e[d] for e in extra),
                       self.tp[d], self.bw[d])
                if sig in seen:
                    continue
                seen.add(sig)
                out.append(self.resident(c, d, True))
        if rule.persist_split and self.G >= 2 and not (out and self.homogeneous):
            rooms = [x + hr for x in caps]
            for devs in self._split_sets(c, rooms):
                o = self.split(c, devs, rule.split_mode, [caps[d] for d in devs], True)
                if o is not None:
                    out.append(o)
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
        """Params rest on disk only when host RAM cannot hold them: move the ones whose
        move costs least per byte freed until the host budget holds."""
        chosen = dict(chosen)
        tried = set()
        while self._host_peak(chosen) > self.host_budget:
            best = None
            for c, o in sorted(chosen.items()):
                # splits read their weights from host memory (runtime/split: no disk yet)
                if o.source != "cpu" or self.rules[c].params == "cpu" or c in tried \
                        or o.kind == "split" or not self.rules[c].disk:
                    continue
                alt = self.rebuild(o, "disk")
                freed = self._host_peak(chosen) - self._host_peak({**chosen, c: alt})
                if freed <= 0:
                    continue
                score = (alt.cost - o.cost) / freed
                if best is None or score < best[0]:
                    best = (score, c, alt)
            if best is None:
                return None
            tried.add(best[1])
            chosen[best[1]] = best[2]
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

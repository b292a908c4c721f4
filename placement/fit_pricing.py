"""Auto-fit pricing: the time and the memory of one placement of one component.

An `Option` is one evaluated placement: where the weights rest (`persist` per GPU for
the session, `host_persist` in host RAM), what it needs while its phase runs (`use` per
GPU, `host_use`), and what it costs (`cost` = runs x forward + load, in seconds). The
seconds come from fit_costs.CostModel's figures (throughput, link, disk and peer
bandwidth); the bytes from fit_shapes (ring, prefix, split layouts). Nothing here
chooses: the search (fit_search.py) compares the options priced here.
"""
from typing import Dict, List, Optional

from .fit_costs import (BATCH_PARALLEL_EFFICIENCY, PIPELINE_EFFICIENCY,
                        STREAM_BLOCK_OVERHEAD_S, STREAM_OVERLAP)
from .fit_shapes import (Geometry, layer_ranges, remote_tail_spans, row_shares,
                         stream_spans)
from .layout import compute_shares, ring_schedule
from .remote_devices import is_remote

PHASE_ORDER = ("encode", "sample", "decode", "upscale")


def streamed_forward(compute: float, transfer: float, depth: int, streamed_blocks: int,
                     stall: float = 0.0) -> float:
    """Seconds of one streamed forward: copies overlap compute when prefetching.
    `stall`: what the ring's schedule loses beyond max(compute, transfer) at this depth
    (ring_stall: transfer-heavy blocks in a row outrunning a shallow ring)."""
    if depth > 0:
        t = max(compute, transfer) + (1 - STREAM_OVERLAP) * min(compute, transfer) + stall
    else:
        t = compute + transfer
    return t + streamed_blocks * STREAM_BLOCK_OVERHEAD_S


def block_seconds(geo: Geometry, compute: float, k: int, bandwidth: float, lo: int = 0,
                  hi: Optional[int] = None):
    """Per streamed block (k..hi) its compute and transfer seconds and its size, and the
    lead: the resident blocks' (lo..k) compute, which runs before the first streamed
    block of each forward while the copies issued ahead keep going. `compute` is the
    whole component's on this device; the blocks' compute is their byte share of it
    (non-block weights are mostly embeddings and norms: no block's time), split by
    layout.compute_shares."""
    hi = geo.n if hi is None else hi
    sizes = geo.sizes[k:hi]
    blocks = compute * geo.prefix[geo.n] / max(1, geo.total)
    shares = compute_shares(geo.info)
    comp = [blocks * w for w in shares[k:hi]]
    lead = blocks * sum(shares[lo:k])
    return comp, [n / bandwidth for n in sizes], sizes, lead


def ring_stall(geo: Geometry, compute: float, k: int, bandwidth: float, depth: int,
               lo: int = 0, hi: Optional[int] = None) -> float:
    """Seconds per forward the ring at `depth` loses beyond max(compute, transfer) when
    blocks k..hi stream (lo..k resident before them)."""
    hi = geo.n if hi is None else hi
    if depth <= 0 or hi - k < 2 or bandwidth <= 0:
        return 0.0
    comp, trans, sizes, lead = block_seconds(geo, compute, k, bandwidth, lo, hi)
    return ring_schedule(comp, trans, sizes, depth, lead)[1]


class Option:
    """One evaluated placement of one component (immutable once built). Its fields, by
    the question they answer:

    what and when  comp, kind (resident | stream | split | cpu | batch), phase, runs
                   (forwards per generation); parallel (none | batch | pipeline)
    where          runtime (devices computing), params/source (where weights rest: a
                   GPU, cpu or disk), split_mode, ranges (layer split: block ranges),
                   layout (split: device set and shares, or how many GPUs stream),
                   per_device (split that streams: {device: (resident, of blocks)}),
                   resident_blocks, depth, host_blocks (disk: streamed blocks in RAM),
                   tile (a VAE decoded in tiles); batch parallel: each_device
                   (resident | stream: what every device does), shares (items per device)
    memory         persist {gpu: bytes for the session}, use {gpu: bytes while its phase
                   runs}, host_persist / host_use (host RAM, same two meanings),
                   resident_bytes, streamed_bytes, loaded_bytes
    time           compute_s, transfer_s, forward_s (one forward), load_s (once per
                   generation), hops, cost = runs x forward_s + load_s; serial_s (batch
                   parallel, pipeline: the same placement's forward without parallelism)
    """
    __slots__ = ("comp", "kind", "phase", "runs",
                 "runtime", "params", "source", "split_mode", "ranges", "layout",
                 "per_device", "resident_blocks", "depth", "host_blocks", "tile",
                 "persist", "use", "host_persist", "host_use", "resident_bytes",
                 "streamed_bytes", "loaded_bytes",
                 "compute_s", "transfer_s", "forward_s", "load_s", "hops", "cost",
                 "parallel", "each_device", "shares", "serial_s")

    def __init__(self, comp, kind, runtime, runs, phase):
        self.comp, self.kind, self.runtime, self.runs, self.phase = comp, kind, runtime, runs, phase
        self.split_mode = "layer"
        self.resident_blocks = self.depth = self.ranges = self.layout = self.per_device = None
        self.streamed_bytes = self.hops = self.host_use = self.host_blocks = 0
        self.tile = None          # fit_tiles.Tile: a VAE decoded in tiles; None: full frame
        self.transfer_s = 0.0
        self.parallel = "none"
        self.each_device = self.shares = None
        self.serial_s = 0.0

    @property
    def persistent(self) -> bool:
        return bool(self.persist)


class Pricing:
    """Prices placements on one set of devices; every Option is memoised (immutable)."""

    def __init__(self, geos: Dict[str, Geometry], workloads, gpus: List[str], model,
                 phase_of: Dict[str, int], tiles: Optional[Dict[str, list]] = None):
        self.geos, self.work = geos, workloads
        self.gpus = gpus
        self.gidx = {name: i for i, name in enumerate(gpus)}
        self.model = model
        self.tp = [model.throughput[g] for g in gpus]
        self.bw = [model.bandwidth[g] for g in gpus]
        self.cpu_tp = model.throughput["cpu"]
        self.G = len(gpus)
        self.phase_of = phase_of
        self.tiles = tiles or {}          # component -> [fit_tiles.Tile], largest first
        self._memo: Dict[tuple, object] = {}

    # -- building one evaluated placement -------------------------------------------------
    def _compute_s(self, c: str, flop_share: float, dev: int) -> float:
        return self.work[c].flop * flop_share / self.tp[dev]

    def resident(self, c: str, d: int, persistent: bool, source: str = "cpu",
                 params_on: Optional[int] = None, tile=None) -> Option:
        """Whole on GPU d; `tile` (fit_tiles.Tile): a VAE decoding in tiles, with the
        tile's working memory and the passes' extra compute."""
        key = ("r", c, d, persistent, source, params_on, tile)
        o = self._memo.get(key)
        if o is None:
            o = self._memo[key] = self._resident(c, d, persistent, source, params_on, tile)
        return o

    def headroom(self, c: str, tile=None) -> int:
        return self.geos[c].headroom if tile is None else tile.headroom

    def _resident(self, c, d, persistent, source, params_on, tile) -> Option:
        geo, w = self.geos[c], self.work[c]
        compute = self._compute_s(c, 1.0, d) * (tile.work if tile is not None else 1.0)
        hr = self.headroom(c, tile)
        name = self.gpus[d]
        o = Option(c, "resident", [name], w.runs, self.phase_of[c])
        o.tile = tile
        o.resident_bytes = geo.total
        o.compute_s = o.forward_s = compute
        if persistent:
            o.params = o.source = name
            o.persist = {d: geo.total}
            o.use = {d: hr}
            o.loaded_bytes, o.load_s, o.host_persist = 0, 0.0, 0
        elif params_on is not None:                       # rests on another GPU
            src = self.gpus[params_on]
            o.params = o.source = src
            o.persist = {params_on: geo.total}
            o.use = {d: geo.total + hr}
            o.loaded_bytes = geo.total
            o.load_s = geo.total / self.model.peer(src, name)
            o.host_persist = 0
        else:
            o.params = o.source = source
            o.persist = {}
            o.use = {d: geo.total + hr}
            o.loaded_bytes = geo.total
            o.load_s = geo.total / self.model.source_bandwidth(name, source)
            o.host_persist = geo.total if source == "cpu" else 0
        o.cost = o.runs * o.forward_s + o.load_s
        return o

    def stream(self, c: str, d: int, k: int, depth: int, source: str = "cpu",
               host_blocks: int = 0) -> Option:
        """Streamed on GPU d with a resident prefix of k blocks. With source disk, the
        first `host_blocks` streamed blocks rest in host RAM (read over the link each
        forward) and the rest are read from the file: RAM first, disk for what it
        cannot hold (plan.StreamPlan.host_blocks)."""
        key = ("s", c, d, k, depth, source, host_blocks)
        o = self._memo.get(key)
        if o is None:
            o = self._memo[key] = self._stream(c, d, k, depth, source, host_blocks)
        return o

    def _stream(self, c, d, k, depth, source, host_blocks) -> Option:
        geo, w = self.geos[c], self.work[c]
        name = self.gpus[d]
        bw = self.model.source_bandwidth(name, source)
        compute = self._compute_s(c, 1.0, d)
        streamed = geo.streamed_bytes(k)
        in_ram = 0
        if source == "disk":
            host_blocks = max(0, min(host_blocks, geo.n - k))
            in_ram = geo.prefix[k + host_blocks] - geo.prefix[k]
        transfer = in_ram / self.model.source_bandwidth(name, "cpu") + (streamed - in_ram) / bw
        resident = geo.non_block + geo.prefix[k]
        o = Option(c, "stream", [name], w.runs, self.phase_of[c])
        o.params = o.source = source
        o.resident_blocks, o.depth = k, depth
        o.host_blocks = host_blocks if source == "disk" else 0
        o.persist = {}
        o.use = {d: geo.stream_weights(k, depth) + geo.headroom}
        o.host_persist = geo.total if source == "cpu" else in_ram
        o.resident_bytes, o.streamed_bytes, o.loaded_bytes = resident, streamed, resident
        o.compute_s, o.transfer_s = compute, transfer
        # disk sources: the schedule at the mean link of RAM and disk reads
        stall = ring_stall(geo, compute, k, streamed / transfer if transfer > 0 else bw, depth)
        o.forward_s = streamed_forward(compute, transfer, depth, geo.n - k, stall)
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
        spans = stream_spans(self.geos[c], caps, streaming)
        if spans is None:
            return None
        return self._price_spans(c, devs, caps, spans, depth, source, streaming)

    def remote_stream(self, c: str, devs: List[int], caps: List[int], depth: int,
                      source: str) -> Optional[Option]:
        """A model bigger than any one machine: the local main device `devs[0]` streams
        its range through its ring while worker devices (`devs[1:]`, ALIAS.DEVICE) hold
        the last blocks for the session (fit_shapes.remote_tail_spans); activations cross
        the network twice per forward."""
        key = ("xr", c, tuple(devs), tuple(caps), depth, source)
        if key not in self._memo:
            spans = remote_tail_spans(self.geos[c], caps[1:])
            self._memo[key] = None if spans is None else self._price_spans(
                c, devs, caps, spans, depth, source, "remote", hold=set(range(1, len(devs))))
        return self._memo[key]

    def _price_spans(self, c, devs, caps, spans, depth, source, layout,
                     hold=frozenset()) -> Optional[Option]:
        """A layer split over `spans` in which each device keeps a prefix of its range
        resident and streams the rest; devices in `hold` (positions) must keep all."""
        geo, w = self.geos[c], self.work[c]
        names = [self.gpus[d] for d in devs]
        per_device, use, fwd, compute_all, transfer_all = {}, {}, 0.0, 0.0, 0.0
        resident_total = streamed_total = 0
        for j, (d, (a, b)) in enumerate(zip(devs, spans)):
            nb = geo.non_block if j == 0 else 0
            k = geo.range_prefix(a, b, caps[j] - nb, depth)
            if k is None or (j in hold and k < b - a):
                return None
            slots = geo.range_window(a + k, b, depth)
            resident = geo.prefix[a + k] - geo.prefix[a]
            streamed = geo.prefix[b] - geo.prefix[a + k]
            use[d] = nb + resident + slots + geo.headroom
            per_device[names[j]] = (k, b - a)
            held = nb + geo.prefix[b] - geo.prefix[a]
            compute = self._compute_s(c, held / (geo.total or 1), d)
            transfer = streamed / self.model.source_bandwidth(names[j], source)
            bw = self.model.source_bandwidth(names[j], source)
            stall = ring_stall(geo, self._compute_s(c, 1.0, d), a + k, bw, depth, a, b)
            fwd += streamed_forward(compute, transfer, depth, b - a - k, stall) if streamed \
                else compute
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
        o.layout = layout
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

    # -- parallel placements (issue 13) ---------------------------------------------------
    def share_items(self, c: str, devs: List[int]) -> List[int]:
        """Items of one forward's batch per device, as runtime/parallel cuts them: in
        proportion to speed, each item to the device that would finish it first."""
        items = self.work[c].items
        counts = [0] * len(devs)
        for _ in range(items):
            j = min(range(len(devs)), key=lambda j: ((counts[j] + 1) / self.tp[devs[j]], j))
            counts[j] += 1
        return counts

    def share_headroom(self, c: str, items: int) -> int:
        """Working memory of a forward over `items` of the batch: the metadata's estimate
        is a workspace plus activations in proportion to the batch; a fixed reserve or a
        given headroom is kept whole (nothing says what part of it scales)."""
        geo, w = self.geos[c], self.work[c]
        hr = geo.headroom
        est = getattr(geo.info, "headroom_bytes", None)
        if est is None or int(est) != hr or w.items <= 1 or items >= w.items:
            return hr
        from .metadata.headroom import WORKSPACE
        if hr <= WORKSPACE:
            return hr
        return WORKSPACE + -(-(hr - WORKSPACE) * items // w.items)

    def batch(self, c: str, devs: List[int], each: str, persistent: bool, k: int = 0,
              depth: int = 0, source: str = "cpu") -> Optional[Option]:
        """Batch parallel over `devs` (runtime/parallel/batch.py): the whole component on
        every device (`each`: resident, or streamed with the same prefix k and depth on
        each from one shared packed host copy), shares of every forward's batch at once,
        outputs gathered on the first device."""
        key = ("b", c, tuple(devs), each, persistent, k, depth, source)
        if key not in self._memo:
            self._memo[key] = self._batch(c, list(devs), each, persistent, k, depth, source)
        return self._memo[key]

    def _batch(self, c, devs, each, persistent, k, depth, source) -> Optional[Option]:
        geo, w = self.geos[c], self.work[c]
        counts = self.share_items(c, devs)
        if len(devs) < 2:
            return None
        names = [self.gpus[d] for d in devs]
        hr = self.share_headroom(c, max(counts))
        streamed = geo.streamed_bytes(k) if each == "stream" else 0
        resident = geo.non_block + geo.prefix[k] if each == "stream" else geo.total

        def forward(d: int, share: float) -> float:
            compute = self._compute_s(c, share, d)
            if each != "stream":
                return compute
            bw = self.model.source_bandwidth(self.gpus[d], source)
            stall = ring_stall(geo, compute, k, bw, depth)
            return streamed_forward(compute, streamed / bw, depth, geo.n - k, stall)

        # a device without a share (a batch smaller than the devices) holds its copy idle
        times = [forward(d, n / w.items) for d, n in zip(devs, counts) if n]
        gather = max((self.model.hop_s(w.activation_bytes * n // w.items, names[j], names[0])
                      for j, n in enumerate(counts) if j and n), default=0.0)
        ideal = max(times) + gather
        serial = forward(devs[0], 1.0)
        o = Option(c, "batch", names, w.runs, self.phase_of[c])
        o.parallel, o.each_device, o.shares = "batch", each, dict(zip(names, counts))
        o.serial_s = serial
        o.forward_s = ideal + (1 - BATCH_PARALLEL_EFFICIENCY) * max(0.0, serial - ideal)
        o.compute_s = max(self._compute_s(c, n / w.items, d) for d, n in zip(devs, counts))
        o.hops = sum(1 for n in counts[1:] if n)
        o.transfer_s = (streamed / min(self.model.source_bandwidth(n, source) for n in names)
                        if streamed else 0.0) + gather
        o.resident_bytes, o.streamed_bytes = resident, streamed
        if each == "stream":
            o.resident_blocks, o.depth = k, depth
        if persistent:
            o.params = o.source = names[0]
            o.persist = {d: geo.total for d in devs}
            o.use = {d: hr for d in devs}
            o.loaded_bytes, o.load_s, o.host_persist = 0, 0.0, 0
        else:
            o.params = o.source = source
            o.persist = {}
            held = geo.stream_weights(k, depth) if each == "stream" else geo.total
            o.use = {d: held + hr for d in devs}
            o.loaded_bytes = resident * len(devs)
            # each device loads over its own link, all from the one host copy
            o.load_s = resident / min(self.model.source_bandwidth(n, source) for n in names)
            o.host_persist = geo.total if source == "cpu" else 0   # one shared copy
        o.cost = o.runs * o.forward_s + o.load_s
        return o

    def pipelined(self, o: Option, force: bool = False) -> Optional[Option]:
        """The same layer split with the batch's shares pipelined through its stages
        (runtime/split/pipeline.py: one share per item, stage k computes share s while
        stage k+1 computes share s-1). Per share a stage takes u_j = its compute / b +
        the hop it sends; the shares take sum(u) + (b - 1) x max(u) (fill, steady
        state, drain), of whose saving over the plain split PIPELINE_EFFICIENCY is
        realised. None: not a resident layer split, or a batch of 1 unless `force`
        (parallel pipeline asked: one share, priced as the plain split)."""
        if o is None or o.kind != "split" or o.split_mode != "layer" or o.ranges is None \
                or o.per_device is not None or o.parallel != "none" \
                or any(map(is_remote, o.runtime)):     # remote ranges run one by one
            return None
        key = ("p", id(o), force)
        if key in self._memo:
            return self._memo[key][1]
        c = o.comp
        geo, w = self.geos[c], self.work[c]
        b = w.items
        got = None
        if b >= 2 or (force and b >= 1):
            devs = [self.gidx[n] for n in o.runtime]
            stage = []
            for j, (first, last) in enumerate(o.ranges):
                held = geo.prefix[last + 1] - geo.prefix[first] + (geo.non_block if j == 0
                                                                    else 0)
                nxt = o.runtime[(j + 1) % len(o.runtime)]
                stage.append(self._compute_s(c, held / (geo.total or 1), devs[j]) / b
                             + self.model.hop_s(w.activation_bytes // b, o.runtime[j], nxt))
            ideal = sum(stage) + (b - 1) * max(stage)
            got = Option(c, "split", list(o.runtime), o.runs, o.phase)
            for name in Option.__slots__:
                if name not in ("parallel", "forward_s", "cost", "hops", "serial_s",
                                "transfer_s"):
                    setattr(got, name, getattr(o, name))
            got.parallel = "pipeline"
            got.serial_s = o.forward_s
            got.forward_s = o.forward_s - PIPELINE_EFFICIENCY * max(0.0, o.forward_s - ideal)
            got.hops = o.hops * b
            got.transfer_s = o.transfer_s + (b - 1) * len(o.runtime) * (
                self.model.hop_s(0, o.runtime[0], o.runtime[-1]))
            got.cost = got.runs * got.forward_s + got.load_s
        self._memo[key] = (o, got)          # o kept alive: its id stays unique
        return got

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

    def with_host_blocks(self, o: Option, host_blocks: int) -> Option:
        """A streamed placement resting on disk with its first `host_blocks` streamed
        blocks in host RAM."""
        return self.stream(o.comp, self.gidx[o.runtime[0]], o.resident_blocks, o.depth,
                           "disk", host_blocks)

    def host_blocks_within(self, o: Option, host_bytes: int) -> int:
        """The most streamed blocks of `o` (in execution order) that `host_bytes` hold."""
        geo, k = self.geos[o.comp], o.resident_blocks
        h = 0
        while k + h < geo.n and geo.prefix[k + h + 1] - geo.prefix[k] <= host_bytes:
            h += 1
        return h

    def rebuild(self, o: Option, source: str) -> Option:
        """The same placement with its weights resting in `source` instead."""
        if o.kind == "batch":
            devs = [self.gidx[n] for n in o.runtime]
            again = self.batch(o.comp, devs, o.each_device, False, o.resident_blocks or 0,
                               o.depth or 0, source)
            return again if again is not None else o
        if o.parallel == "pipeline":
            devs, layout = o.layout
            plain = self.split_layout(o.comp, devs, o.split_mode, layout, False, source)
            return self.pipelined(plain, force=self.work[o.comp].items < 2) or o
        if o.kind == "cpu":
            return self.on_cpu(o.comp, source)
        if o.kind == "stream":
            return self.stream(o.comp, self.gidx[o.runtime[0]], o.resident_blocks, o.depth, source)
        if o.kind == "resident":
            return self.resident(o.comp, self.gidx[o.runtime[0]], False, source, tile=o.tile)
        if o.per_device is not None:
            devs = [self.gidx[n] for n in o.runtime]
            caps = [o.use[d] - self.geos[o.comp].headroom for d in devs]
            again = self.remote_stream(o.comp, devs, caps, o.depth, source) \
                if o.layout == "remote" else \
                self._split_stream(o.comp, devs, caps, o.depth, source, o.layout)
            return again if again is not None else o
        devs, layout = o.layout
        return self.split_layout(o.comp, devs, o.split_mode, layout, False, source)

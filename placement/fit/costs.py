"""The auto-fit cost model: how long a component takes where it is placed.

Deliberately simple (docs/autofit.md has the formulas and where the numbers come from):

    compute   = FLOP per forward / device throughput
    FLOP      = 2 x params x effective tokens   (params = bytes / bytes per param)
    transfer  = bytes / link bandwidth          (host -> device, pinned; disk is slower)
    streamed  = max(compute, transfer) + 10% of the smaller with a prefetch depth >= 1
                (overlap is never perfect), compute + transfer at depth 0
    hop       = activation bytes / peer bandwidth + latency
    load      = bytes / bandwidth, once per generation, for weights that rest off the device

A generation is one encode, `steps` sampling forwards and one decode; the planner
minimises its predicted time (the same as the amortised time per step). Every number
is overridable through FitOptions, by device name or by device kind; measured figures
(docs/calibration.md) replace the defaults on the machine they were measured on.
"""
import math
import re
from typing import Dict, Mapping, Optional, Tuple

from ..remote_devices import is_remote
from ..units import GiB, MiB

# Achieved (not peak) dense bf16 FLOP/s: a current discrete GPU, an integrated one, a CPU.
DEFAULT_THROUGHPUT = {"gpu": 80e12, "igpu": 8e12, "cpu": 0.5e12}
# Host -> device bytes/s from pinned memory: PCIe 4.0 x16 as seen in practice (ANCHORS);
# an integrated GPU shares host memory. The CPU computes on its weights in place.
DEFAULT_BANDWIDTH = {"gpu": 25e9, "igpu": 50e9, "cpu": math.inf}
DEFAULT_DISK_BANDWIDTH = 2e9          # NVMe sequential read, conservative
STREAM_BLOCK_OVERHEAD_S = 30e-6       # event wait + launch per streamed block
# Overlap is never perfect (copies contend for memory bandwidth): a streamed forward costs
# max(compute, transfer) + (1 - OVERLAP) x min(compute, transfer), plus the stall the
# ring's schedule predicts for its depth and block mix (layout.ring_schedule).
STREAM_OVERLAP = 0.9
HOP_LATENCY_S = 20e-6
# A network link between machines (a remote range on a worker, docs/distributed.md): 10 GbE
# as seen in practice unless given (--network-bandwidth) or measured, and a round trip
# per crossing (the chained remote range: about 0.5 ms on a LAN, more on a busy host).
DEFAULT_NETWORK_BANDWIDTH = 1.1e9
NETWORK_LATENCY_S = 0.5e-3
# Parallel shares never overlap perfectly (threads, smaller kernels per share, the
# gather): of the ideal saving over one device a batch-parallel forward realises this
# share, a pipelined layer split this share of the ideal saving over the plain split.
# Fitted to benchmarks/multi_gpu.py (docs/multi_gpu.md "Measured"): batch parallel
# 1.81-1.82x where 2x is ideal (0.90); pipelined split 1.20x at batch 2 (ideal 1.33)
# and 1.39x at batch 4 (ideal 1.60): 0.67 and 0.75 (0.70).
BATCH_PARALLEL_EFFICIENCY = 0.90
PIPELINE_EFFICIENCY = 0.70
LINK_KINDS = ("peer", "host-staged", "network")

# Compute working memory when the metadata gives none: seed 003's reserves.
FIXED_RESERVES = {"diffusion": 2 * GiB, "te": 2 * GiB, "vae": 1 * GiB, "controlnet": 1 * GiB,
                  "upscaler": 1 * GiB, "clip_vision": 512 * MiB, "photomaker": 512 * MiB,
                  "detector": 512 * MiB}

# Effective tokens per forward at 1 megapixel (1024x1024), batch 1, one frame: FLOP per
# forward = 2 x params x tokens. Diffusion is calibrated on ANCHORS (Flux.1-dev at 1024^2
# does about 2,500 FLOP per bf16 weight byte); the VAE decoder on SDXL's (about 1.2
# TFLOP for 49 M decoder params); text encoders see a 512-token prompt.
TOKENS_PER_MEGAPIXEL = {"diffusion": 2500.0, "controlnet": 2500.0, "vae": 12500.0,
                        "upscaler": 50000.0}
# A YOLOv8 detector letterboxes to 640x640 whatever the image: about 3,000 FLOP per
# parameter (YOLOv8m: 79 GFLOP, 25.9 M params), i.e. 1,500 tokens.
FIXED_TOKENS = {"te": 512.0, "clip_vision": 257.0, "photomaker": 257.0, "detector": 1500.0}
SAMPLED = ("diffusion", "controlnet")          # run once per sampling step

_BYTES_PER_PARAM = (
    (re.compile(r"f(loat)?64"), 8.0), (re.compile(r"f(p|loat)?32"), 4.0),
    (re.compile(r"bf16|f(p|loat)?16|half"), 2.0), (re.compile(r"f(p|loat)?8|e4m3|e5m2"), 1.0),
    (re.compile(r"q8|int8|i8"), 1.0625), (re.compile(r"q6"), 0.8203),
    (re.compile(r"q5"), 0.6875), (re.compile(r"q4|nf4|int4|fp4"), 0.5625),
    (re.compile(r"q3"), 0.4297), (re.compile(r"q2|iq2|iq1"), 0.33))


def bytes_per_param(dtype: str, quant: Optional[str]) -> float:
    text = (quant or dtype or "").lower()
    for pattern, size in _BYTES_PER_PARAM:
        if pattern.search(text):
            return size
    return 2.0


def _pick(given: Mapping, device, simulated: Optional[float], measured: Mapping[str, float],
          defaults: Mapping[str, float]) -> Tuple[float, str]:
    """A figure and where it came from, most explicit first: given for this device (a
    flag or FitOptions), given in the simulated inventory's entry, given for its kind,
    measured on this machine (calibration), the kind's default."""
    if device.name in given:
        return float(given[device.name]), "given"
    if simulated is not None:
        return float(simulated), "given"
    if device.kind in given:
        return float(given[device.kind]), "given"
    if device.name in measured:
        return float(measured[device.name]), "measured"
    return defaults[device.kind], "default"


def _first_of(given: Optional[float], measured: Optional[float], default):
    if given is not None:
        return float(given), "given"
    if measured is not None:
        return float(measured), "measured"
    return default, "default"


class ComponentWork:
    """What one component computes per forward, from its size and the latent shape."""
    __slots__ = ("flop", "runs", "activation_bytes", "items")

    def __init__(self, info, resolution: Tuple[int, int], frames: int, batch: int,
                 steps: int, activation_override: Optional[int] = None, cond_batch: int = 1):
        comp = info.component
        if comp in SAMPLED:
            batch = batch * max(1, int(cond_batch))   # CFG: cond and uncond in one batch
        # items of one forward's batch that shares may divide (batch parallel, the
        # pipelined split): the sampled components' batch (CFG's cond and uncond count)
        self.items = batch if comp in SAMPLED else 1
        width, height = resolution
        megapixels = width * height / float(1 << 20)
        if not takes_frames(info):
            frames = 1                       # an image model: frames do not change it
        latent_frames = 1 + (frames - 1) // 4 if frames > 1 else 1   # 4x temporal VAEs
        if comp in TOKENS_PER_MEGAPIXEL:
            scale = latent_frames if comp != "vae" else frames
            tokens = TOKENS_PER_MEGAPIXEL[comp] * megapixels * scale * batch
        else:
            tokens = FIXED_TOKENS.get(comp, 512.0) * batch
        params = info.total_bytes / bytes_per_param(info.dtype, info.quant)
        self.flop = 2.0 * params * tokens
        self.runs = steps if comp in SAMPLED else 1
        if activation_override is not None:
            self.activation_bytes = int(activation_override)
        else:
            self.activation_bytes = _activation_bytes(info, comp, width, height,
                                                      latent_frames, frames, batch)


VIDEO_VAES = {"wan_vae", "ltxv_vae", "hunyuan_vae"}


def takes_frames(info) -> bool:
    """Whether `--frames` changes this component's work: video DiTs and video VAEs (the
    metadata knows the architecture); image models, text encoders and unknown non-video
    parts compute the same for 81 frames as for one."""
    from ..metadata.headroom import DIT
    comp = info.component
    archs = set((getattr(info, "arch", "") or "").split("+"))
    if comp in ("diffusion", "controlnet"):
        known = [DIT[a] for a in archs if a in DIT and a != "dit"]
        return not known or any(p.temporal for p in known)
    if comp == "vae":
        return bool(archs & VIDEO_VAES) or not (archs - {""}) or "unknown" in archs
    return False


def _activation_bytes(info, comp, width, height, latent_frames, frames, batch) -> int:
    """Bytes crossing a device boundary between two blocks: the hidden state.

    Transformers: tokens x hidden x 2 bytes, hidden estimated from the median block
    (about 12 hidden^2 params per block). Convolutional decoders: 128 channels at
    full resolution, the VAE decoder's widest late stage."""
    if comp in ("vae", "upscaler"):
        return int(width * height * 128 * 2 * frames * batch)
    sizes = sorted(b.nbytes for b in info.blocks) or [info.total_bytes]
    params = sizes[len(sizes) // 2] / bytes_per_param(info.dtype, info.quant)
    hidden = math.sqrt(max(params, 1.0) / 12.0)
    if comp in ("diffusion", "controlnet"):
        tokens = (width // 16) * (height // 16) * latent_frames * batch
    else:
        tokens = FIXED_TOKENS.get(comp, 512.0) * batch
    return int(tokens * hidden * 2)


class CostModel:
    """Device speeds, resolved once per fit: throughput, link, disk and peer bandwidth.

    Each figure is given (flags, FitOptions, a --simulate entry) > measured (the machine's
    calibration, placement/machine_figures; only for the detected inventory) > default;
    `sources` says which. A step correction observed in earlier runs divides a throughput
    that was not given (docs/calibration.md)."""

    def __init__(self, devices, throughput: Mapping[str, float], bandwidth: Mapping[str, float],
                 disk_bandwidth: Optional[float] = None, peer_bandwidth: Optional[float] = None,
                 measured=None, network_bandwidth=None):
        from ..machine_figures import NO_FIGURES
        measured = measured or NO_FIGURES
        self.throughput: Dict[str, float] = {}
        self.bandwidth: Dict[str, float] = {}
        self.sources: Dict[str, object] = {"throughput": {}, "bandwidth": {}}
        self.corrections: Dict[str, dict] = {}
        self.notes = []
        for d in devices:
            value, src = _pick(throughput, d, getattr(d, "throughput", None),
                               measured.throughput, DEFAULT_THROUGHPUT)
            factor, runs = measured.corrections.get(d.name, (1.0, 0))
            if runs and src != "given" and factor != 1.0:
                self.corrections[d.name] = {"factor": factor, "runs": runs}
                self.notes.append((d.name, f"{d.name} throughput {value / 1e12:.1f} -> "
                                   f"{value / factor / 1e12:.1f} TFLOP/s: {runs} observed "
                                   f"run(s) took {factor:.2f}x the predicted step time "
                                   f"(bounded to 0.25-4x)"))
                value /= factor
            self.throughput[d.name] = value
            self.sources["throughput"][d.name] = src
            value, src = _pick(bandwidth, d, getattr(d, "bandwidth", None),
                               measured.bandwidth, DEFAULT_BANDWIDTH)
            self.bandwidth[d.name] = value
            self.sources["bandwidth"][d.name] = src
        self.disk_bandwidth, self.sources["disk_bandwidth"] = _first_of(
            disk_bandwidth, measured.disk_bandwidth, DEFAULT_DISK_BANDWIDTH)
        # default None: the slower of the two host links (a copy through host memory)
        self.peer_bandwidth, self.sources["peer_bandwidth"] = _first_of(
            peer_bandwidth, measured.peer_bandwidth, None)
        self.origin = measured.origin
        # per pair of local GPUs, measured by calibrate: (bytes/s, "peer" | "host-staged")
        self.measured_links = dict(getattr(measured, "links", {}) or {})
        self._hops: Dict[Tuple[str, str], Tuple[float, float]] = {}
        self.network = _network_figures(network_bandwidth,
                                        getattr(measured, "network_bandwidth", None) or {})
        for name, value in (list(self.throughput.items()) + list(self.bandwidth.items())
                            + [("disk", self.disk_bandwidth)]):
            if not value > 0:
                from ..errors import PlacementError
                raise PlacementError(f"throughput and bandwidth must be positive; got "
                                     f"{value!r} for {name}")

    def source_bandwidth(self, device: str, source: str) -> float:
        """Bytes/s into `device` from weights resting in `source` (cpu, disk, a device)."""
        link = self.bandwidth[device]
        if source == "disk":
            return min(link, self.disk_bandwidth)
        if source == "cpu":
            return link
        return self.peer(source, device)

    def peer(self, a: str, b: str) -> float:
        return self.link(a, b)[1]

    def link(self, a: str, b: str) -> Tuple[str, float, float, str]:
        """(kind, bytes/s, latency s, source) of activations crossing from device a to b.

        - network: a and b on different machines (a remote device is ALIAS.DEVICE,
          placement/remote_devices.py): the given --network-bandwidth (for the alias or
          for all), else measured, else DEFAULT_NETWORK_BANDWIDTH (10 GbE);
        - peer: GPU to GPU directly: the given --peer-bandwidth, or calibrate measured
          the pair as peer;
        - host-staged: through host memory (consumer GPUs without peer access): the
          pair's measured figure, else the slower of the two host links."""
        ma, mb = _machine(a), _machine(b)
        if ma != mb:
            alias = mb if mb else ma
            value, src = self.network.get(alias) or self.network.get("*") or \
                (DEFAULT_NETWORK_BANDWIDTH, "default")
            return "network", float(value), NETWORK_LATENCY_S, src
        source = self.sources["peer_bandwidth"]
        if source == "given":
            return "peer", float(self.peer_bandwidth), HOP_LATENCY_S, source
        got = self.measured_links.get((a, b)) or self.measured_links.get((b, a))
        if got is not None:
            return got[1], float(got[0]), HOP_LATENCY_S, "measured"
        if self.peer_bandwidth is not None:
            return "peer", float(self.peer_bandwidth), HOP_LATENCY_S, source
        return "host-staged", min(self.bandwidth[a], self.bandwidth[b]), HOP_LATENCY_S, \
            "default"

    def hop_s(self, activation_bytes: int, a: str, b: str) -> float:
        got = self._hops.get((a, b))
        if got is None:                       # the figures are fixed once resolved
            got = self._hops[(a, b)] = self.link(a, b)[1:3]
        return activation_bytes / got[0] + got[1]

    def links(self, names) -> Dict[str, dict]:
        """Every ordered pair of `names`: its link (for the plan's cost model)."""
        out = {}
        for a in names:
            for b in names:
                if a != b:
                    kind, bw, latency, src = self.link(a, b)
                    out[f"{a}->{b}"] = {"kind": kind, "bytes_per_s": bw,
                                        "latency_s": latency, "source": src}
        return out

    def describe(self) -> dict:
        return {"throughput_flops": dict(self.throughput),
                "bandwidth_bytes_per_s": {k: (None if math.isinf(v) else v)
                                          for k, v in self.bandwidth.items()},
                "disk_bandwidth_bytes_per_s": self.disk_bandwidth,
                "peer_bandwidth_bytes_per_s": self.peer_bandwidth,
                "stream_block_overhead_s": STREAM_BLOCK_OVERHEAD_S,
                "stream_overlap": STREAM_OVERLAP,
                "hop_latency_s": HOP_LATENCY_S,
                "network_bandwidth_bytes_per_s": {k: v[0] for k, v in self.network.items()},
                "batch_parallel_efficiency": BATCH_PARALLEL_EFFICIENCY,
                "pipeline_efficiency": PIPELINE_EFFICIENCY,
                "sources": {k: (dict(v) if isinstance(v, dict) else v)
                            for k, v in self.sources.items()},
                "corrections": {k: dict(v) for k, v in self.corrections.items()},
                "measured_in": self.origin or None}


def _machine(name: str) -> str:
    """'' for a device of this machine, the worker alias for ALIAS.DEVICE."""
    return str(name).partition(".")[0] if is_remote(name) else ""


def _network_figures(given, measured: Mapping[str, float]) -> Dict[str, Tuple[float, str]]:
    """{alias or '*': (bytes/s, source)}: given (one figure for every worker, or per
    alias) over measured."""
    out: Dict[str, Tuple[float, str]] = {}
    for alias, value in (measured or {}).items():
        out[str(alias)] = (float(value), "measured")
    if given is None:
        return out
    if isinstance(given, Mapping):
        items = list(given.items())
    else:
        items = [("*", given)]
    from ..errors import PlacementError
    for alias, value in items:
        try:
            value = float(value)
        except (TypeError, ValueError):
            value = float("nan")
        if not value > 0:
            raise PlacementError(f"invalid network bandwidth {value!r} for {alias}; expected "
                                 f"bytes/s > 0 (e.g. 1.25GB/s for 10 GbE)")
        out[str(alias)] = (value, "given")
    return out

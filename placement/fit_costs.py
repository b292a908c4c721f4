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

from .units import GiB, MiB

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

# Compute working memory when the metadata gives none: seed 003's reserves.
FIXED_RESERVES = {"diffusion": 2 * GiB, "te": 2 * GiB, "vae": 1 * GiB, "controlnet": 1 * GiB,
                  "upscaler": 1 * GiB, "clip_vision": 512 * MiB, "photomaker": 512 * MiB}

# Effective tokens per forward at 1 megapixel (1024x1024), batch 1, one frame: FLOP per
# forward = 2 x params x tokens. Diffusion is calibrated on ANCHORS (Flux.1-dev at 1024^2
# does about 2,500 FLOP per bf16 weight byte); the VAE decoder on SDXL's (about 1.2
# TFLOP for 49 M decoder params); text encoders see a 512-token prompt.
TOKENS_PER_MEGAPIXEL = {"diffusion": 2500.0, "controlnet": 2500.0, "vae": 12500.0,
                        "upscaler": 50000.0}
FIXED_TOKENS = {"te": 512.0, "clip_vision": 257.0, "photomaker": 257.0}
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


class Workload:
    """What one component computes per forward, from its size and the latent shape."""
    __slots__ = ("flop", "runs", "activation_bytes")

    def __init__(self, info, resolution: Tuple[int, int], frames: int, batch: int,
                 steps: int, activation_override: Optional[int] = None, cond_batch: int = 1):
        comp = info.component
        if comp in SAMPLED:
            batch = batch * max(1, int(cond_batch))   # CFG: cond and uncond in one batch
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
    from .metadata.headroom import DIT
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
                 measured=None):
        from .machine_figures import NO_FIGURES
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
        for name, value in (list(self.throughput.items()) + list(self.bandwidth.items())
                            + [("disk", self.disk_bandwidth)]):
            if not value > 0:
                from .errors import PlacementError
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
        if self.peer_bandwidth is not None:
            return float(self.peer_bandwidth)
        return min(self.bandwidth[a], self.bandwidth[b])

    def hop_s(self, activation_bytes: int, a: str, b: str) -> float:
        return activation_bytes / self.peer(a, b) + HOP_LATENCY_S

    def describe(self) -> dict:
        return {"throughput_flops": dict(self.throughput),
                "bandwidth_bytes_per_s": {k: (None if math.isinf(v) else v)
                                          for k, v in self.bandwidth.items()},
                "disk_bandwidth_bytes_per_s": self.disk_bandwidth,
                "peer_bandwidth_bytes_per_s": self.peer_bandwidth,
                "stream_block_overhead_s": STREAM_BLOCK_OVERHEAD_S,
                "stream_overlap": STREAM_OVERLAP,
                "hop_latency_s": HOP_LATENCY_S,
                "sources": {k: (dict(v) if isinstance(v, dict) else v)
                            for k, v in self.sources.items()},
                "corrections": {k: dict(v) for k, v in self.corrections.items()},
                "measured_in": self.origin or None}

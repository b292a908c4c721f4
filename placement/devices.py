"""The devices a plan can use: detected through torch, or simulated from a string.

A simulated inventory is indistinguishable to the planner: it is how people plan for
hardware they do not have, and how the runtime is tested without a GPU.
"""
import re
from dataclasses import dataclass, replace
from typing import List, Optional

from . import detect as _detect
from .detect import host_memory
from .errors import PlacementError
from .units import format_bytes, parse_bandwidth, parse_bytes, parse_throughput

KINDS = ("gpu", "igpu", "cpu")
_NAME = re.compile(r"^[a-z][a-z0-9.]*$")
_TORCH_SPELLING = re.compile(r"^([a-z]+):(\d+)$")
DEFAULT_TOKENS = ("", "auto", "default")


@dataclass(frozen=True)
class Device:
    name: str                     # cpu, cuda0, cuda1, xpu0, mps, vulkan0 ...
    kind: str                     # gpu | igpu | cpu
    total_bytes: int
    free_bytes: int
    description: str = ""
    torch_device: Optional[str] = None   # 'cuda:0'; None for a simulated accelerator
    simulated: bool = False
    throughput: Optional[float] = None   # FLOP/s given in a --simulate entry (what-if)
    bandwidth: Optional[float] = None    # host->device B/s given in a --simulate entry
    # kernel workspaces and allocator slack beside a computation's tensors; None: the
    # planner's default for a GPU (metadata/headroom.WORKSPACE). A --simulate entry may
    # set it ('@workspace=0': the simulated device of the runtime allocates none)
    workspace_bytes: Optional[int] = None
    # slack kept free inside the device's room (placement/room.py); None: the default,
    # 512 MiB but at most a sixteenth of the memory it is kept in ('@margin=SIZE' sets it)
    margin_bytes: Optional[int] = None
    # a worker's device (remote_devices.py): the worker's machine id (its network link is
    # keyed by it), the speeds calibrated on that machine (they price it like this
    # machine's own calibration), when they were saved there, and when the worker
    # measured free_bytes; None / "" where the worker did not say
    machine: Optional[str] = None
    measured_throughput: Optional[float] = None
    measured_bandwidth: Optional[float] = None
    measured_at: str = ""
    free_measured: str = ""

    @property
    def is_accelerator(self) -> bool:
        return self.kind != "cpu"


def _kind_from_name(name: str) -> str:
    name = name.rpartition(".")[2]          # a worker's device, w1.cpu, is its device's kind
    if name == "cpu":
        return "cpu"
    if name.startswith("igpu"):
        return "igpu"
    return "gpu"


def _speeds(name: str, speeds, accepted: str):
    """'@165T' is a throughput, '@25GB/s' a host link bandwidth, '@workspace=256MiB' the
    kernel workspace, '@margin=512MiB' the slack kept free (placement/room.py); each at
    most once."""
    throughput = bandwidth = None
    settings = {}
    for text in speeds:
        key, eq, value = text.partition("=")
        if eq:
            key = key.strip().lower()
            if key not in ("workspace", "margin") or key in settings:
                raise PlacementError(f"simulated device {name}: {text!r} is not a setting "
                                     f"(at most one workspace=SIZE and one margin=SIZE); "
                                     f"{accepted}")
            settings[key] = parse_bytes(value, f"{key} of simulated device {name}")
            if settings[key] < 0:
                raise PlacementError(f"simulated device {name}: {key} cannot be "
                                     f"negative; {accepted}")
        elif text.strip().lower().endswith("/s") and not text.strip().lower().endswith("flop/s"):
            if bandwidth is not None:
                raise PlacementError(f"simulated device {name} gives two bandwidths; {accepted}")
            bandwidth = parse_bandwidth(text, f"bandwidth of simulated device {name}")
        else:
            if throughput is not None:
                raise PlacementError(f"simulated device {name} gives two throughputs; {accepted}")
            throughput = parse_throughput(text, f"throughput of simulated device {name}")
    return throughput, bandwidth, settings.get("workspace"), settings.get("margin")


def canonical_device_name(text: str) -> str:
    """Torch spellings to inventory names: 'CUDA:1' -> 'cuda1', 'mps:0' -> 'mps'."""
    name = text.strip().lower()
    m = _TORCH_SPELLING.match(name)
    if m:
        return "mps" if m.group(1) == "mps" else f"{m.group(1)}{m.group(2)}"
    return name


class Inventory:
    """An ordered list of devices. Order matters: 'auto' takes the first GPU."""

    def __init__(self, devices: List[Device], source: str = "detected"):
        names = [d.name for d in devices]
        if len(set(names)) != len(names):
            raise PlacementError(f"inventory names a device twice: {', '.join(names)}")
        if "cpu" not in names:
            total, avail = host_memory()
            devices = list(devices) + [Device("cpu", "cpu", total, avail, "host memory",
                                              torch_device="cpu")]
        self.devices: List[Device] = list(devices)
        self.source = source

    # -- construction -------------------------------------------------------------
    @classmethod
    def simulated(cls, text: str) -> "Inventory":
        """'cuda0=24GiB,cuda1=12GiB[/10GiB],cpu=64GiB': names with TOTAL or TOTAL/FREE.
        Bare numbers are GiB. The cpu entry is optional (default: this machine's RAM).
        What-if speeds follow '@': cuda0=24GiB@165T@25GB/s (FLOP/s, host link bytes/s)."""
        accepted = ("expected NAME=TOTAL[/FREE][@FLOPS][@BYTES/s][@workspace=SIZE]"
                    "[@margin=SIZE] entries "
                    "separated by commas, e.g. cuda0=24GiB@165T@25GB/s,cuda1=12GiB/10GiB,"
                    "cpu=64GiB")
        if not isinstance(text, str) or not text.strip():
            raise PlacementError(f"empty simulated inventory; {accepted}")
        devices = []
        for item in text.split(","):
            item = item.strip()
            if not item:
                raise PlacementError(f"empty entry in simulated inventory {text!r}; {accepted}")
            name, eq, size = item.partition("=")
            name = canonical_device_name(name)
            if not eq or not _NAME.match(name) or name in DEFAULT_TOKENS + ("gpu", "disk"):
                raise PlacementError(f"invalid simulated device {item!r}; {accepted}")
            size, *speeds = size.split("@")
            throughput, bandwidth, workspace, margin = _speeds(name, speeds, accepted)
            total_txt, slash, free_txt = size.partition("/")
            total = parse_bytes(total_txt, f"size of simulated device {name}")
            free = parse_bytes(free_txt, f"free memory of simulated device {name}") \
                if slash else total
            if total <= 0 or free < 0 or free > total:
                raise PlacementError(f"invalid simulated device {item!r}: total must be "
                                     f"positive and 0 <= free <= total; {accepted}")
            kind = _kind_from_name(name)
            devices.append(Device(name, kind, total, free,
                                  f"simulated {kind}",
                                  torch_device="cpu" if name == "cpu" else None,
                                  simulated=name != "cpu", throughput=throughput,
                                  bandwidth=bandwidth, workspace_bytes=workspace,
                                  margin_bytes=margin))
        return cls(devices, source=f"simulated: {text.strip()}")

    @classmethod
    def detect(cls) -> "Inventory":
        """This machine, through torch (imported here, not at module import)."""
        return cls([Device(**facts) for facts in _detect.torch_devices()], source="detected")

    def refreshed(self) -> "Inventory":
        """Free memory measured again (real devices); simulated ones are unchanged."""
        if self.source != "detected":
            return self
        free = _detect.free_bytes_by_name()
        return Inventory([replace(d, free_bytes=free.get(d.name, d.free_bytes))
                          for d in self.devices], source=self.source)

    # -- queries --------------------------------------------------------------------
    @property
    def names(self) -> List[str]:
        return [d.name for d in self.devices]

    def gpus(self) -> List[Device]:
        return [d for d in self.devices if d.kind == "gpu"]

    def accelerators(self) -> List[Device]:
        return [d for d in self.devices if d.kind in ("gpu", "igpu")]

    def workspace_bytes(self) -> Optional[int]:
        """The kernel workspace a computation on this inventory's accelerators needs
        beside its tensors (the largest of theirs; None: no accelerator)."""
        from .metadata.headroom import WORKSPACE
        sizes = [WORKSPACE if d.workspace_bytes is None else d.workspace_bytes
                 for d in self.accelerators()]
        return max(sizes) if sizes else None

    def default_device(self) -> Device:
        for kind in ("gpu", "igpu", "cpu"):
            for d in self.devices:
                if d.kind == kind:
                    return d
        raise PlacementError("inventory has no devices")

    def resolve(self, name: str) -> Device:
        """A user's device name to a device: auto/default/'' -> GPU, iGPU, CPU; gpu ->
        first GPU then iGPU; exact name (torch spellings accepted); else a unique prefix."""
        key = canonical_device_name(name)
        if key in DEFAULT_TOKENS:
            return self.default_device()
        if key == "gpu":
            for kind in ("gpu", "igpu"):
                for d in self.devices:
                    if d.kind == kind:
                        return d
            raise PlacementError(f"'gpu' asked for, but no GPU is present; devices: "
                                 f"{', '.join(self.names)}")
        for d in self.devices:
            if d.name == key:
                return d
        matches = [d for d in self.devices if d.name.startswith(key)]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise PlacementError(f"device {name.strip()!r} is ambiguous; it matches: "
                                 f"{', '.join(d.name for d in matches)}")
        raise PlacementError(f"device {name.strip()!r} not found; devices present: "
                             f"{', '.join(self.names)}")

    def get(self, name: str) -> Device:
        for d in self.devices:
            if d.name == name:
                return d
        raise PlacementError(f"no device named {name!r}; devices: {', '.join(self.names)}")

    def lines(self) -> List[str]:
        """`name<TAB>description`, one per device (sd-cli --list-devices)."""
        return [f"{d.name}\t{d.description or d.kind} ({d.kind}, "
                f"{format_bytes(d.total_bytes)} total, {format_bytes(d.free_bytes)} free)"
                for d in self.devices]

    def to_dict(self) -> dict:
        return {"source": self.source, "devices": [
            {"name": d.name, "kind": d.kind, "total_bytes": d.total_bytes,
             "free_bytes": d.free_bytes, "description": d.description,
             "torch_device": d.torch_device, "simulated": d.simulated,
             **({"throughput_flops": d.throughput} if d.throughput else {}),
             **({"bandwidth_bytes_per_s": d.bandwidth} if d.bandwidth else {}),
             **({"workspace_bytes": d.workspace_bytes}
                if d.workspace_bytes is not None else {}),
             **({"margin_bytes": d.margin_bytes} if d.margin_bytes is not None else {})}
            for d in self.devices]}

    def __repr__(self) -> str:
        return f"Inventory({', '.join(self.names)}; {self.source})"

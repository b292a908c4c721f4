"""A Plan: where every component runs and rests. Pure data, JSON schema v1.

Keys may be added to the JSON, never renamed (DESIGN.md). Nothing here decides or
executes: placement.resolve / placement.fit make plans, runtime/ runs them.
"""
import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .components import COMPONENTS
from .errors import PlacementError
from .units import format_bytes

SCHEMA_VERSION = 1
PARALLEL_MODES = ("none", "batch", "pipeline")


@dataclass
class DevicePlan:
    name: str
    kind: str                       # gpu | igpu | cpu
    total_bytes: int
    free_bytes: int
    budget_bytes: Optional[int]     # None: no budget (the device's free memory bounds it)
    planned_bytes: int = 0          # what the plan puts there at its busiest phase
    description: str = ""
    throughput: Optional[float] = None  # FLOP/s the planner priced it at (batch parallel
                                        # shares follow it); None: not planned by auto-fit
    margin_bytes: int = 0           # kept free inside the room (placement/room.py)

    @property
    def room_bytes(self) -> int:
        """What the plan may fill here: weights, ring and working memory."""
        from .room import device_room
        return device_room(self.budget_bytes, self.free_bytes, self.margin_bytes,
                           host=self.kind == "cpu")


@dataclass
class StreamPlan:
    resident_blocks: int            # chunk-K: the first K streamed blocks stay on the device
    prefetch_depth: int             # blocks in flight while one computes
    host_blocks: int = 0            # params=disk: the first N streamed blocks rest in host
                                    # RAM (read once), the rest are read from the file per step
    per_device: Dict[str, List[int]] = field(default_factory=dict)
                                    # a layer split that streams: device -> [resident
                                    # blocks, blocks of its range]; {} otherwise


@dataclass
class ComponentPlan:
    component: str
    runtime: List[str]              # device names; more than one means a split
    params: str                     # a device name, 'cpu' or 'disk'
    split_mode: str = "layer"       # layer | row (meaningful when len(runtime) > 1)
    stream: Optional[StreamPlan] = None   # None: not streamed
    blocks: Dict[str, List[int]] = field(default_factory=dict)  # device -> [first, last]
    resident_bytes: int = 0
    streamed_bytes: int = 0         # bytes copied to the device per forward
    reasons: List[str] = field(default_factory=list)
    present: bool = False           # whether the caller described this component
    total_bytes: int = 0
    lora: str = "fuse"              # how LoRA patches apply: fuse | runtime (see placement.lora)
    parallel: str = "none"          # none | batch: shares of a batch on the runtime devices at
                                    # once | pipeline: a layer split's stages run the batch's
                                    # shares one behind the other (runtime/split/pipeline.py)
    tile: Optional[int] = None      # VAE: tile edge in pixels for a tiled decode; None: full frame
    tile_frames: Optional[int] = None   # video VAE: frames per temporal tile; None: all
    quant: Optional[str] = None     # GGUF quant type(s) of the weights, e.g. "Q4_K"; None: float
    headroom_bytes: Optional[int] = None  # working memory planned on each runtime device;
                                          # None: not planned (the engine estimates it)
    held_bytes: Dict[str, int] = field(default_factory=dict)
                                    # bytes the plan holds per device while the component
                                    # runs (weights, ring, working memory); {}: not planned
    headroom_per_device: Dict[str, int] = field(default_factory=dict)
                                    # a split's working memory per device where they
                                    # differ (rehearsed); {}: headroom_bytes on each

    def headroom_on(self, device: str) -> int:
        """Working memory planned on `device` (0: none planned)."""
        return int(self.headroom_per_device.get(device, self.headroom_bytes or 0))

    @property
    def main_device(self) -> str:
        return self.runtime[0]

    @property
    def is_split(self) -> bool:
        return len(self.runtime) > 1


@dataclass
class Plan:
    devices: List[DevicePlan]
    components: Dict[str, ComponentPlan]
    warnings: List[str] = field(default_factory=list)
    version: int = SCHEMA_VERSION
    extra: Dict[str, object] = field(default_factory=dict)   # keys added by later issues

    def device(self, name: str) -> DevicePlan:
        for dev in self.devices:
            if dev.name == name:
                return dev
        raise PlacementError(f"plan has no device {name!r}; it has: "
                             f"{', '.join(d.name for d in self.devices)}")

    # -- JSON -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        out = {
            "version": self.version,
            "devices": [{
                "name": d.name, "kind": d.kind, "total_bytes": d.total_bytes,
                "free_bytes": d.free_bytes, "budget_bytes": d.budget_bytes,
                "planned_bytes": d.planned_bytes, "description": d.description,
                "throughput_flops": d.throughput, "margin_bytes": d.margin_bytes,
                "room_bytes": d.room_bytes,
            } for d in self.devices],
            "components": {name: _component_dict(c) for name, c in self.components.items()},
            "warnings": list(self.warnings),
        }
        out.update(self.extra)
        return out

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict) -> "Plan":
        try:
            if data.get("version") != SCHEMA_VERSION:
                raise PlacementError(f"unsupported plan version {data.get('version')!r}; "
                                     f"expected {SCHEMA_VERSION}")
            devices = [DevicePlan(d["name"], d["kind"], int(d["total_bytes"]),
                                  int(d["free_bytes"]), d.get("budget_bytes"),
                                  int(d.get("planned_bytes", 0)), d.get("description", ""),
                                  _positive_or_none(d.get("throughput_flops")),
                                  int(d.get("margin_bytes") or 0))
                       for d in data["devices"]]
            comps = {}
            for name, c in data["components"].items():
                if name not in COMPONENTS:
                    raise PlacementError(f"plan names unknown component {name!r}; "
                                         f"components are: {', '.join(COMPONENTS)}")
                s = c.get("stream")
                comps[name] = ComponentPlan(
                    component=name, runtime=list(c["runtime"]), params=c["params"],
                    split_mode=c.get("split_mode", "layer"),
                    stream=StreamPlan(int(s["resident_blocks"]), int(s["prefetch_depth"]),
                                      int(s.get("host_blocks", 0)),
                                      {k: [int(v[0]), int(v[1])]
                                       for k, v in (s.get("per_device") or {}).items()})
                    if s else None,
                    blocks={k: [int(v[0]), int(v[1])] for k, v in c.get("blocks", {}).items()},
                    resident_bytes=int(c.get("resident_bytes", 0)),
                    streamed_bytes=int(c.get("streamed_bytes", 0)),
                    reasons=list(c.get("reasons", [])), present=bool(c.get("present", False)),
                    total_bytes=int(c.get("total_bytes", 0)), lora=c.get("lora", "fuse"),
                    parallel=c.get("parallel", "none"),
                    tile=None if c.get("tile") is None else int(c["tile"]),
                    tile_frames=None if c.get("tile_frames") is None
                    else int(c["tile_frames"]),
                    quant=c.get("quant"),
                    headroom_bytes=None if c.get("headroom_bytes") is None
                    else int(c["headroom_bytes"]),
                    held_bytes={k: int(v) for k, v in (c.get("held_bytes") or {}).items()},
                    headroom_per_device={k: int(v) for k, v in
                                         (c.get("headroom_per_device") or {}).items()})
                if comps[name].parallel not in PARALLEL_MODES:
                    raise PlacementError(f"invalid parallel {comps[name].parallel!r} for "
                                         f"{name}; expected none, batch or pipeline")
                if comps[name].stream is not None and comps[name].stream.host_blocks < 0:
                    raise PlacementError(f"invalid stream.host_blocks for {name}; expected "
                                         f"a count >= 0")
                if comps[name].lora not in ("fuse", "runtime"):
                    raise PlacementError(f"invalid lora {comps[name].lora!r} for {name}; "
                                         f"expected fuse or runtime")
            known = {"version", "devices", "components", "warnings"}
            return cls(devices, comps, list(data.get("warnings", [])),
                       extra={k: v for k, v in data.items() if k not in known})
        except PlacementError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise PlacementError(f"not a plan (schema v{SCHEMA_VERSION}): {exc!r}") from None

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlacementError(f"plan is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise PlacementError("plan JSON must be an object")
        return cls.from_dict(data)

    # -- for people -----------------------------------------------------------------
    def report(self) -> str:
        from .report import render_plan   # the table lives with its formatting helpers
        return render_plan(self)

    def __str__(self) -> str:
        return self.report()


def _component_dict(c: ComponentPlan) -> dict:
    return {
        "runtime": list(c.runtime), "params": c.params, "split_mode": c.split_mode,
        "stream": None if c.stream is None else {
            "resident_blocks": c.stream.resident_blocks,
            "prefetch_depth": c.stream.prefetch_depth,
            "host_blocks": c.stream.host_blocks,
            "per_device": {k: list(v) for k, v in c.stream.per_device.items()}},
        "blocks": {k: list(v) for k, v in c.blocks.items()},
        "resident_bytes": c.resident_bytes, "streamed_bytes": c.streamed_bytes,
        "reasons": list(c.reasons), "present": c.present, "total_bytes": c.total_bytes,
        "lora": c.lora, "parallel": c.parallel, "tile": c.tile,
        "tile_frames": c.tile_frames, "quant": c.quant,
        "headroom_bytes": c.headroom_bytes, "held_bytes": dict(c.held_bytes),
        "headroom_per_device": dict(c.headroom_per_device),
    }


def _positive_or_none(value) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


__all__ = ["Plan", "ComponentPlan", "DevicePlan", "StreamPlan", "SCHEMA_VERSION",
           "format_bytes"]

"""What place() returns, declared: every engine (one device, layer split, pipelined split,
row split, batch parallel, worker ranges) is a `PlacedEngine`, and the ComfyUI adapter uses
nothing of one beyond this (tests/runtime/test_placed_protocol.py holds each to it)."""
from typing import Optional, Protocol, runtime_checkable


@runtime_checkable
class PlacedEngine(Protocol):
    component: str

    def __enter__(self) -> "PlacedEngine":
        """Weights to where the plan puts them; the module runs under the plan."""

    def __exit__(self, *exc) -> Optional[bool]:
        """The module given back exactly (parameters, devices, hooks, forward)."""

    def release(self) -> None:
        """Device memory given back between runs; the next forward loads again."""

    def stats(self) -> dict:
        """What ran: {"devices": {name: {"peak_bytes", "h2d_bytes", ...}}, "hops",
        "hop_bytes", ...}; after exit, the final figures."""

    def held_bytes(self, device: str) -> int:
        """Resident weights and ring slots this placement holds on `device` now (what
        ComfyUI's memory manager is told)."""

    @property
    def crosses_devices(self) -> bool:
        """Whether activations hop between devices inside one forward (a layer split):
        then a caller's own tensors that cross blocks are brought along by follow()."""

    def follow(self, x, like, kind: str = "follow"):
        """`x` brought to the device `like` is on (a caller's skip connection), counted as
        a hop; `x` itself where nothing crosses devices."""

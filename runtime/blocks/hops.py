"""Hops: activations crossing from one device to another during a forward.

A hop is on the critical path (the next block needs the tensor now), so it is issued
and waited for at once; there is nothing to overlap it with.
- simulated devices: the destination gets its own copy after the modelled time of the
  device-to-device link (latency + bytes / bandwidth);
- CUDA pairs with peer access: one device-to-device copy (torch orders it after the
  current streams of both devices);
- CUDA pairs without peer access: through pinned host memory, the host-to-device leg
  waiting on an event recorded after the device-to-host leg;
- anything else (a split that includes the CPU): a plain `.to()`.
"""
import time
from typing import Callable

import torch

from ...placement.errors import PlacementError
from ..device.simdevice import Link

# Peer link of the simulated devices: PCIe 4 x16 device to device, as seen in practice.
DEFAULT_HOP_LINK = Link(bandwidth=25e9, latency=10e-6)

HopFn = Callable[[torch.Tensor], torch.Tensor]


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _wait_until(deadline: float) -> None:
    """sleep() overshoots by tens of microseconds; spin the last stretch."""
    left = deadline - time.perf_counter()
    if left > 2e-3:
        time.sleep(left - 1e-3)
    while time.perf_counter() < deadline:
        pass


def sim_hop(link: Link) -> HopFn:
    def hop(t: torch.Tensor) -> torch.Tensor:
        _wait_until(time.perf_counter() + link.seconds(tensor_bytes(t)))
        out = torch.empty_like(t)          # keeps the strides: ops see the same layout
        out.copy_(t)
        return out
    return hop


def cuda_peer_hop(dst: torch.device) -> HopFn:
    def hop(t: torch.Tensor) -> torch.Tensor:
        return t.to(dst, non_blocking=True)
    return hop


def cuda_host_hop(src: torch.device, dst: torch.device) -> HopFn:
    """No peer access: device -> pinned host -> device, ordered by an event."""
    def hop(t: torch.Tensor) -> torch.Tensor:
        host = torch.empty_like(t, device="cpu", pin_memory=True)
        host.copy_(t, non_blocking=True)                 # on src's current stream
        landed = torch.cuda.Event()
        landed.record(torch.cuda.current_stream(src))
        torch.cuda.current_stream(dst).wait_event(landed)
        with torch.cuda.device(dst):
            out = torch.empty_like(host, device=dst)
            out.copy_(host, non_blocking=True)           # the caching host allocator keeps
        return out                                       # `host` until this copy is done
    return hop


def plain_hop(dst: torch.device) -> HopFn:
    def hop(t: torch.Tensor) -> torch.Tensor:
        return t.to(dst)
    return hop


def make_hop(src_target, dst_target, link: Link = DEFAULT_HOP_LINK) -> HopFn:
    """The hop from one runtime Target to another."""
    if src_target.simulated or dst_target.simulated:
        if not (src_target.simulated or src_target.device.type == "cpu") or \
                not (dst_target.simulated or dst_target.device.type == "cpu"):
            raise PlacementError(f"cannot split over {src_target.name} and {dst_target.name}: "
                                 f"one is simulated and the other a real accelerator; use a "
                                 f"fully simulated or a fully real inventory")
        return sim_hop(link)
    src, dst = src_target.device, dst_target.device
    if src.type == "cuda" and dst.type == "cuda":
        if src == dst:
            return lambda t: t
        if torch.cuda.can_device_access_peer(src.index, dst.index):
            return cuda_peer_hop(dst)
        return cuda_host_hop(src, dst)
    return plain_hop(dst)

"""Contiguous block ranges in proportion to per-device weights (budgets)."""
from typing import Dict, List, Optional, Sequence


def proportional_ranges(block_bytes: Sequence[int], devices: Sequence[str],
                        weights: Sequence[float]) -> Dict[str, List[int]]:
    """Split blocks (in execution order) into contiguous ranges, one per device, so that
    each device's share of the bytes follows its weight. A device with weight 0 gets
    nothing; a device whose share rounds to no block is left out. Ranges are
    inclusive [first, last] block indices. Each cut is placed at the block boundary
    nearest the ideal cumulative share, so every share is within one block of ideal."""
    n = len(block_bytes)
    total_w = float(sum(max(0.0, w) for w in weights))
    if n == 0 or total_w <= 0:
        return {}
    cumulative = [0]
    for b in block_bytes:
        cumulative.append(cumulative[-1] + max(0, int(b)))
    total = cumulative[-1] or n
    if cumulative[-1] == 0:               # no sizes known: balance by count
        cumulative = list(range(n + 1))
    ranges: Dict[str, List[int]] = {}
    start, acc = 0, 0.0
    for i, (dev, w) in enumerate(zip(devices, weights)):
        acc += max(0.0, w)
        if i == len(devices) - 1 or acc >= total_w:
            end = n
        else:
            target = total * acc / total_w
            # the boundary (index into cumulative) nearest the target, not before start
            end = min(range(start, n + 1), key=lambda j: (abs(cumulative[j] - target), j))
        if end > start and w > 0:
            ranges[dev] = [start, end - 1]
            start = end
        if start >= n:
            break
    return ranges


def fitting_ranges(block_bytes: Sequence[int], devices: Sequence[str],
                   rooms: Sequence[int]) -> Optional[Dict[str, List[int]]]:
    """Contiguous ranges, one per device in order, each within that device's room (bytes
    it has for blocks), cut as near the rooms' proportion as that allows. None when no
    such cover exists (the blocks need streaming, or more room).

    Proportion alone rounds a cut to the nearest block, which can put a device past its
    room by most of a block; here each cut lies between the least the devices before it
    must take (so what is left fits the rooms after it) and the most this one can hold."""
    n = len(block_bytes)
    sizes = [max(0, int(b)) for b in block_bytes]
    rooms = [max(0, int(r)) for r in rooms]
    if n == 0 or not devices:
        return {} if n == 0 else None
    cumulative = [0]
    for b in sizes:
        cumulative.append(cumulative[-1] + b)
    total_room = sum(rooms)
    if cumulative[-1] > total_room:
        return None
    ranges: Dict[str, List[int]] = {}
    start, acc = 0, 0
    for i, dev in enumerate(devices):
        acc += rooms[i]
        later = sum(rooms[i + 1:])
        if i == len(devices) - 1:
            end = n
        else:
            # the most this device holds: its range within its room
            most = start
            while most < n and cumulative[most + 1] - cumulative[start] <= rooms[i]:
                most += 1
            # the least it must take: what is left fits the later devices' rooms (a
            # necessary bound; the walk below checks each later device in turn)
            least = start
            while least <= n and cumulative[n] - cumulative[least] > later:
                least += 1
            if least > most:
                return None
            target = cumulative[n] * acc / total_room if total_room else 0
            end = min(range(least, most + 1),
                      key=lambda j: (abs(cumulative[j] - target), j))
        if cumulative[end] - cumulative[start] > rooms[i]:
            return None
        if end > start:
            ranges[dev] = [start, end - 1]
        start = end
    return ranges if start == n else None

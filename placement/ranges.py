"""Contiguous block ranges in proportion to per-device weights (budgets)."""
from typing import Dict, List, Sequence


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

"""How fast is the link to a worker? `calibrate --workers w1=HOST:PORT`
(runtime/machine/calibrate.py) sends payloads the way a remote range sends activations
(a control message, then the bytes over the process group) and the worker sends them
straight back (its `run` request with mode "echo": nothing computed, nothing loaded). The
best round trip of a small payload is the link's latency per crossing; a large one gives
the bandwidth each way: bytes / ((round trip - 2 x latency) / 2). Auto-fit prices remote
ranges with these figures (placement/machine_figures.py reads a record's "network"
entry)."""
import time
from typing import Dict, Optional, Sequence

import torch

from ...placement.errors import PlacementError

SMALL = 4096
SIZES = (1 << 20, 16 << 20, 64 << 20)
QUICK_SIZES = (1 << 20, 8 << 20)


def echo(link, payload: torch.Tensor, timeout_s: float) -> float:
    """One round trip of `payload`; seconds. The bytes must come back unchanged."""
    start = time.perf_counter()
    out, sent, back = link.run({"mode": "echo"}, payload, torch.device("cpu"), timeout_s)
    seconds = time.perf_counter() - start
    if sent != back or not torch.equal(out, payload):
        raise PlacementError(f"{link.where}: the echo came back changed ({sent} bytes sent, "
                             f"{back} received); the link is not reliable")
    return seconds


def measure_link(link, timeout_s: float, quick: bool = False, rounds: int = 5,
                 sizes: Optional[Sequence[int]] = None) -> Dict[str, object]:
    """{"bytes_per_s", "latency_s", "how"} of the link to one worker (best of `rounds`)."""
    gen = torch.Generator().manual_seed(0)

    def best(nbytes: int) -> float:
        payload = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
        echo(link, payload, timeout_s)                 # warm: buffers, connections
        return min(echo(link, payload, timeout_s) for _ in range(rounds))

    latency = best(SMALL) / 2
    rates = {}
    for nbytes in sizes or (QUICK_SIZES if quick else SIZES):
        one_way = max(1e-9, (best(nbytes) - 2 * latency) / 2)
        rates[nbytes] = nbytes / one_way
    largest = max(rates)
    return {"bytes_per_s": rates[largest], "latency_s": latency,
            "by_size": {str(n): r for n, r in sorted(rates.items())},
            "how": f"echo round trips, best of {rounds}, {largest >> 20} MiB each way"}

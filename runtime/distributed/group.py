"""The torch.distributed group that carries activations: the main process is rank 0 and
hosts the store; each worker is told its rank over its authenticated socket. Gloo between
CPUs (and for tests), NCCL between GPUs. No default group: each main process's workers
form their own."""
import datetime

import torch
import torch.distributed as dist

from ...placement.errors import PlacementError

BACKENDS = ("gloo", "nccl")


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise PlacementError(f"invalid distributed backend {backend!r}; expected gloo or nccl")
    if not dist.is_available():
        raise PlacementError("this torch build has no torch.distributed")
    if backend == "gloo" and not dist.is_gloo_available():
        raise PlacementError("this torch build has no gloo backend; use nccl between GPUs")
    if backend == "nccl" and not dist.is_nccl_available():
        raise PlacementError("this torch build has no NCCL; use backend='gloo'")
    return backend


def host_store(timeout_s: float):
    """The rank-0 store on a free port (all interfaces)."""
    return dist.TCPStore("0.0.0.0", 0, None, True,
                         timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)


def join_group(backend: str, store_host: str, store_port: int, prefix: str, rank: int,
               world: int, timeout_s: float, local_host: str, store=None):
    """Blocks until every rank joined, at most timeout_s."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(store_host, store_port, None, False, timeout=timeout)
    store = dist.PrefixStore(prefix, store)
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=local_host)]
        opts._timeout = timeout
        return dist.ProcessGroupGloo(store, rank, world, opts)
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, world, opts)


def comm_device(backend: str, device: torch.device) -> torch.device:
    """Where the packed activation buffer lives: host for gloo, the GPU for NCCL."""
    return device if backend == "nccl" else torch.device("cpu")


def close_group(group) -> None:
    for name in ("abort", "shutdown"):
        fn = getattr(group, name, None)
        if fn is not None:
            try:
                fn()
                return
            except Exception:   # already broken: nothing left to release cleanly
                pass

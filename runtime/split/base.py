"""What layer and row split share: the plan checks, one Target (ledger + copy queue) per
runtime device, tensor grouping, loading groups onto devices, exact restore, stats.

The module's tensors keep their identity: only `.data` is rebound while placed, and
the very tensors it held before are put back on exit (also when a forward raised).
"""
from typing import Dict, List, Optional, Sequence, Union

import torch
from torch import nn

from ...placement.errors import PlacementError
from ..residency import Group
from ..simdevice import Link
from ..faults import teardown_after
from ..restore import put_back
from ..target import open_target
from .hops import DEFAULT_HOP_LINK
from ..tensors import key_mapper, module_tensors
from .moves import Mover


def headroom_for(option: Union[None, int, Dict[str, int]], device: str) -> int:
    if option is None:
        return 0
    if isinstance(option, dict):
        return int(option.get(device, 0))
    return int(option)


class SplitBase:
    mode = "split"

    def __init__(self, module: nn.Module, plan, component: str, inventory, *,
                 blocks: Optional[Sequence] = None, link: Optional[Link] = None,
                 hop_link: Optional[Link] = None,
                 headroom_bytes: Union[None, int, Dict[str, int]] = None,
                 max_pinned_bytes: Optional[int] = None, weights_file: Optional[str] = None,
                 key_map=None, lora=None, host_store=None, repoint=None):
        self.module = module
        self.component = component
        self.cplan = plan.components[component]
        # what auto-fit decided beyond the v1 keys (headroom, per-device stream prefixes)
        fit = (getattr(plan, "extra", None) or {}).get("fit") or {}
        self.fit_info = (fit.get("components") or {}).get(component) or {}
        self.runtime = list(self.cplan.runtime)
        self.devices = [inventory.get(n) for n in self.runtime]
        self.budgets = [self._budget(plan, n) for n in self.runtime]
        self.block_names = None if blocks is None else [getattr(b, "name", b) for b in blocks]
        self.link = link
        self.hop_link = hop_link or DEFAULT_HOP_LINK
        self.headroom_option = headroom_bytes
        self.max_pinned_bytes = max_pinned_bytes
        self.lora = lora
        self.host_store = host_store      # hoststore.HostStore: packed copies kept (place.py)
        self.repoint = repoint
        self.host_pack_bytes = 0
        self.weights_file = weights_file
        self.key_map = key_mapper(key_map)
        self.file = None
        self.targets: List = []
        self.originals: Dict[int, tuple] = {}
        self.resident: List[List[Group]] = []     # per device: groups held for the placement
        self.resident_bufs: List[tuple] = []
        self.loaded = False
        self.forwards = 0
        self.hops = 0
        self._handles: List = []
        self._final_stats = None
        self._check_params()

    @staticmethod
    def _budget(plan, name: str) -> Optional[int]:
        for d in plan.devices:
            if d.name == name:
                return d.budget_bytes
        return None

    def _check_params(self) -> None:
        c = self.cplan
        if c.params == "disk" and not self.weights_file:
            raise PlacementError(f"{self.component}: params=disk needs the model file; pass "
                                 f"weights_file=PATH (.safetensors or .gguf)")
        if c.params not in ("cpu", "disk") and c.params not in self.runtime:
            raise PlacementError(f"{self.component}: params on {c.params} with a split over "
                                 f"{'&'.join(self.runtime)} is not supported; params must be "
                                 f"cpu, disk or one of the runtime devices")

    # -- devices ----------------------------------------------------------------------------
    def _open_targets(self) -> None:
        for dev, budget in zip(self.devices, self.budgets):
            self.targets.append(open_target(dev, budget, self.link))
        option = self.headroom_option
        if option is None and self.fit_info.get("headroom_bytes") is not None:
            option = int(self.fit_info["headroom_bytes"])     # the planner's estimate
        self.headroom = [headroom_for(option, t.name) for t in self.targets]
        self.mover = Mover(self.targets, self.hop_link)

    def _capture(self) -> Dict[int, list]:
        by_id = module_tensors(self.module)
        self.originals = {i: (t, t.data) for i, (t, _) in by_id.items()}
        if self.cplan.params != "disk" and any(d.is_meta for _, d in self.originals.values()):
            raise PlacementError(f"{self.component}: the module's weights are on the meta "
                                 f"device; use params=disk with the model file")
        return by_id

    def share_weights(self, held_on_main: int) -> List[float]:
        """Each device's room for its share: budget minus headroom, minus what the main
        device holds besides (non-block weights)."""
        out = []
        for i, t in enumerate(self.targets):
            room = t.ledger.capacity - self.headroom[i] - (held_on_main if i == 0 else 0)
            out.append(float(max(0, room)))
        if not any(out):
            raise PlacementError(f"{self.component}: no room left on "
                                 f"{'&'.join(self.runtime)} after headroom and the main "
                                 f"device's non-block weights; raise the budgets")
        return out

    # -- memory -----------------------------------------------------------------------------
    def _load(self) -> None:
        if self.loaded:
            return
        allocated = []
        try:
            for d, groups in enumerate(self.resident):
                for g in groups:
                    buf = self.targets[d].alloc(g.nbytes, "resident", f"resident {g.name}")
                    allocated.append((d, g, buf))
            self._allocate_more()
        except BaseException:
            for d, g, _ in allocated:
                self.targets[d].free(g.nbytes, "resident")
            self._free_more()
            raise
        self.resident_bufs = allocated
        for d, g, buf in allocated:
            self.targets[d].ledger.count_h2d(g.nbytes)
            self._fill(g, buf)
            g.bind(buf)
        for t in self.targets:
            if t.is_cuda:
                torch.cuda.synchronize(t.device)
        self.loaded = True

    def _fill(self, g: Group, buf: torch.Tensor) -> None:
        g.pack(buf, [self._resting(t) for t in g.tensors])

    def _resting(self, t: torch.Tensor) -> torch.Tensor:
        hit = self.originals.get(id(t))
        return hit[1] if hit is not None else t.data

    def _unload(self) -> None:
        if not self.loaded:
            return
        self._free_more()
        for d, g, _ in self.resident_bufs:
            self.targets[d].free(g.nbytes, "resident")
        self.resident_bufs = []
        put_back((t, data, None) for t, data in self.originals.values())
        for t in self.targets:
            if t.is_cuda:
                torch.cuda.synchronize(t.device)
        self.loaded = False

    def _allocate_more(self) -> None:
        """Subclasses: device memory beyond the resident groups (stream slots)."""

    def _free_more(self) -> None:
        pass

    def release(self) -> None:
        """Give every device's memory back; the next forward loads again."""
        self._unload()

    # -- context ----------------------------------------------------------------------------
    def __enter__(self):
        try:
            self._open_targets()
            self._prepare()
            self._load()
            self._attach()
        except BaseException as exc:
            teardown_after(self._teardown, exc)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        teardown_after(self._teardown, exc)
        return False

    def _prepare(self) -> None:
        raise NotImplementedError

    def _attach(self) -> None:
        raise NotImplementedError

    def _detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _teardown(self) -> None:
        self._detach()
        if getattr(self, "mover", None) is not None:
            self.mover.end_forward()          # drop copies a forward stopped midway left
        try:
            try:
                self._unload()
            finally:
                if self.targets:
                    self._final_stats = self._stats_now()
                for t in self.targets:
                    t.close()
        finally:
            originals, self.originals = self.originals, {}
            put_back((t, data, None) for t, data in originals.values())
            self.targets = []
            if self.file is not None:
                self.file.close()
                self.file = None

    # -- stats ------------------------------------------------------------------------------
    def _stats_now(self) -> dict:
        mover = getattr(self, "mover", None)
        out = {"devices": {t.name: t.ledger.stats() for t in self.targets},
               "hops": self.hops, "hop_bytes": mover.bytes if mover else 0,
               "hop_copies": mover.copies if mover else 0,
               "hop_seconds_modelled": mover.seconds if mover else 0.0,
               "forwards": self.forwards, "split_mode": self.mode,
               "host_pack_bytes": self.host_pack_bytes}
        out.update(self._more_stats())
        return out

    def _more_stats(self) -> dict:
        return {}

    def stats(self) -> dict:
        if not self.targets:
            if self._final_stats is None:
                raise PlacementError("stats() before the placement was entered")
            return self._final_stats
        return self._stats_now()

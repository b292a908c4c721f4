"""A plan's remote ranges: for a layer-split plan whose runtime names worker devices
(cuda0&w1.cuda0), every block range the plan gives a worker device runs there through
remote_range; the plan's local range runs where the module already is.

What this does not do yet: the local part under place() (streaming it, or a local split
over several GPUs beside the remote ranges). That needs the layer-split engine to treat a
remote range as one more stage; until then a plan with more than one local device, or a
local device other than the module's, is refused with a one-line error.
"""
from contextlib import ExitStack
from typing import Dict, List

from ...placement.errors import PlacementError
from ...placement.remote_devices import is_remote
from .remote import remote_range
from .session import Cluster


class PlannedRemote:
    def __init__(self, module, plan, component: str, cluster: Cluster, file: str,
                 inventory=None, **options):
        comp = plan.components.get(component)
        if comp is None:
            raise PlacementError(f"plan has no component {component!r}; it has: "
                                 f"{', '.join(plan.components) or 'none'}")
        remote = [d for d in comp.runtime if is_remote(d)]
        local = [d for d in comp.runtime if not is_remote(d)]
        if not remote:
            raise PlacementError(f"{component}: runtime {'&'.join(comp.runtime)} names no "
                                 f"worker device (such as w1.cuda0); use place()")
        if comp.split_mode != "layer" or comp.stream is not None:
            raise PlacementError(f"{component}: remote ranges run a plain layer split; this "
                                 f"plan asks for split_mode={comp.split_mode}"
                                 f"{' with streaming' if comp.stream else ''}")
        if len(local) > 1:
            raise PlacementError(f"{component}: a local split ({'&'.join(local)}) beside "
                                 f"remote ranges is not supported yet; keep one local device")
        if local and inventory is not None:
            want = inventory.resolve(local[0]).torch_device
            have = next(module.parameters()).device
            if want is None or str(have).replace(":", "") != want.replace(":", ""):
                raise PlacementError(f"{component}: the plan runs its local range on "
                                     f"{local[0]} but the module is on {have}; moving it "
                                     f"under place() beside remote ranges is not supported "
                                     f"yet: load the module there first")
        self.ranges: Dict[str, tuple] = {d: tuple(comp.blocks[d]) for d in remote
                                         if d in comp.blocks}
        self.module, self.cluster, self.file, self.options = module, cluster, file, options
        self._stack = None
        self.opened: List = []

    def __enter__(self) -> "PlannedRemote":
        self._stack = ExitStack()
        try:
            for device, (first, last) in self.ranges.items():
                self.opened.append(self._stack.enter_context(remote_range(
                    self.module, (first, last), self.cluster[device], self.file,
                    **self.options)))
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)

    def stats(self) -> dict:
        """hops, hop_bytes and per-link figures summed over the remote ranges."""
        out = {"hops": 0, "hop_bytes": 0, "links": {}}
        for r in self.opened:
            s = r.stats()
            out["hops"] += s["hops"]
            out["hop_bytes"] += s["hop_bytes"]
            for link, v in s["links"].items():
                acc = out["links"].setdefault(link, {"hops": 0, "bytes": 0})
                acc["hops"] += v["hops"]
                acc["bytes"] += v["bytes"]
        return out


def place_remote(module, plan, component: str, cluster: Cluster, file: str, inventory=None,
                 **options) -> PlannedRemote:
    """Run `plan`'s worker ranges of `component` remotely (options as remote_range)."""
    return PlannedRemote(module, plan, component, cluster, file, inventory, **options)

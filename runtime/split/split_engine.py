"""What both splits (layer and row) add to the engine: their parameter checks, each
device's room for its part of the blocks, and the split's own stats. Kept out of the base engine
(runtime/engine/core.py), which one device runs as well."""
from typing import List

from ...placement.errors import PlacementError
from ...placement.layout import split_rooms


class SplitEngine:
    """Mixed into LayerSplit and RowSplit, ahead of their engine class."""

    def __init__(self, module, plan, component: str, inventory, **options):
        super().__init__(module, plan, component, inventory, **options)
        self._check_split_params()

    def _check_split_params(self) -> None:
        c = self.cplan
        if c.params == "disk" and not self.weights_file:
            raise PlacementError(f"{self.component}: params=disk needs the model file; pass "
                                 f"weights_file=PATH (.safetensors or .gguf)")
        if c.params not in ("cpu", "disk") and c.params not in self.runtime:
            raise PlacementError(f"{self.component}: params on {c.params} with a split over "
                                 f"{'&'.join(self.runtime)} is not supported; params must be "
                                 f"cpu, disk or one of the runtime devices")

    def room_weights(self, held_on_main: int) -> List[float]:
        """Each device's room for its part of the blocks: budget minus headroom, minus what the main
        device holds besides (non-block weights)."""
        out = split_rooms([t.ledger.capacity - h for t, h in zip(self.targets, self.headroom)],
                          held_on_main)
        if not any(out):
            raise PlacementError(f"{self.component}: no room left on "
                                 f"{'&'.join(self.runtime)} after headroom and the main "
                                 f"device's non-block weights; raise the budgets")
        return out

    def _split_stats(self) -> dict:
        mover = self.mover
        return {"hop_copies": mover.copies if mover else 0,
                "hop_seconds_modelled": mover.seconds if mover else 0.0,
                "forwards": self.forwards, "split_mode": self.mode}

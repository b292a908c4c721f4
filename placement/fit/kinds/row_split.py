"""Row split: every block's large matrices sliced across two or more GPUs in proportion
to their room (runtime/split/row.py), the main device also keeping the non-block
weights; the GPUs exchange activations twice per block. A row split cannot stream (its
shards are whole matrices): a component too big for it is planned as a streaming layer
split (split_stream.py)."""
from typing import List, Optional, Sequence

from ...layout import row_split_held
from ...units import format_bytes as fmt
from ..geometry import Geometry
from ..option import Option
from .base import Kind, action, ms, per
from ..bounds import fastest_link, least_hop
from .layer_split import SplitDetail, split_candidates, split_option, split_pool_for


def row_shares(geo: Geometry, caps: Sequence[int]) -> Optional[List[int]]:
    """Row split: per device the block bytes runtime/split/row.py allocates there
    (layout.row_split_held: the large matrices sharded in proportion to room, the rest
    on the main device), the non-block weights left out of the main device's share (the
    caller adds them). None when a device's share does not fit its cap."""
    held = row_split_held(geo.info, caps)
    if held is None or any(h > c for h, c in zip(held, caps)):
        return None
    held[0] -= geo.non_block
    return held


class RowSplitKind(Kind):
    name = "row_split"
    decision = "split"

    def persistent(self, ctx, c, room, offered) -> List[Option]:
        hr = ctx.geos[c].headroom
        return split_candidates(ctx, self, c, "row", [x + hr for x in room.caps], True,
                                offered)

    def floating(self, ctx, c, rooms, offered) -> List[Option]:
        return split_candidates(ctx, self, c, "row", rooms, False, offered)

    def bound(self, ctx, c, persistent) -> Optional[float]:
        """The shares follow the room: on equal GPUs of unequal budgets, less room on
        the larger one evens the shares and shortens the slowest shard. Room-free: the
        forward at the speed of every GPU allowed together, two exchanges per block of
        at least half the activations at the cheapest link, and (taking turns) every
        byte loaded at the fastest link."""
        devs = split_pool_for(ctx, c, persistent, "row")
        if not devs:
            return None
        geo, w = ctx.geos[c], ctx.work[c]
        compute = w.flop / sum(ctx.tp[d] for d in devs)
        exchange = 2 * least_hop(ctx, w.activation_bytes // 2, devs, devs)
        return w.runs * (compute + geo.n * exchange) + (
            0.0 if persistent else geo.total / fastest_link(ctx, c, devs))

    def split(self, ctx, c, devs, caps, persistent, source) -> Optional[Option]:
        shares = ctx.memo(("row_shares", c, tuple(caps)),
                          lambda: row_shares(ctx.geos[c], caps))
        if shares is None:
            return None
        return ctx.memo(("row_split", c, tuple(devs), tuple(shares), persistent, source),
                        lambda: self._price(ctx, c, list(devs), shares, persistent, source))

    def _price(self, ctx, c, devs, shares, persistent, source) -> Option:
        geo, w = ctx.geos[c], ctx.work[c]
        held = [s + (geo.non_block if i == 0 else 0) for i, s in enumerate(shares)]
        compute = max(ctx.compute_s(c, h / (geo.total or 1), devs[i])
                      for i, h in enumerate(held))
        k = len(devs)
        per_block = 2 * ctx.model.hop_s(w.activation_bytes * (k - 1) // k, ctx.gpus[devs[0]],
                                         ctx.gpus[devs[-1]])
        detail = SplitDetail("row", None, (tuple(devs), tuple(shares)))
        return split_option(ctx, self, c, devs, held, compute, geo.n * per_block, 2 * geo.n,
                            persistent, source, detail)

    def to_plan(self, ctx, o, cp) -> None:
        cp.split_mode = "row"

    def reasons(self, ctx, o, use) -> List[str]:
        geo = ctx.geos[o.comp]
        held = {n: o.persist.get(ctx.gidx[n]) or o.use.get(ctx.gidx[n], 0) - geo.headroom
                for n in o.runtime}
        shares = ", ".join(f"{n} {fmt(b)}" for n, b in held.items())
        where = "persistent" if o.persistent else f"while {action(o)} runs, params on {o.source}"
        return [f"row split over {'&'.join(o.runtime)} (split_mode row): every block's "
                f"matrices sliced in proportion to room ({shares}), {where}; "
                f"{ms(o.transfer_s)} exchanges {per(o)}"]


ROW_SPLIT = RowSplitKind()

"""What a kind of placement answers. One module per kind (this folder) subclasses `Kind`
and registers one instance in kinds/__init__.py; the search asks every kind for its
candidates and compares them, the report asks the chosen one for its lines."""
from typing import Dict, List, Optional

from ...room import margin_for
from ...units import format_bytes as fmt


class Kind:
    name = ""              # the kind's id (its module's name)
    decision = ""          # plan JSON extra.fit.components[c].decision (v1 values)
    parallel = "none"      # none | batch | pipeline (the plan's parallel field)
    whole = False          # the component whole on one GPU (see FitContext.may_split)
    moves_to_disk = False  # auto-fit may rest its weights on disk when host RAM is short

    # -- candidates -------------------------------------------------------------------
    def persistent(self, ctx, c: str, room, offered) -> List:
        """Placements whose weights stay on GPUs for the session. `room`: a
        search.PersistentRoom (what the other persistent choices leave); `offered`: what
        the kinds before this one offered (in registry order)."""
        return []

    def floating(self, ctx, c: str, rooms, offered) -> List:
        """Placements that take turns: on GPUs only while c's phase runs, in `rooms`
        (bytes free per GPU then)."""
        return []

    def bound(self, ctx, c: str, persistent: bool) -> Optional[float]:
        """A cost no placement of this kind (persistent: held for the session, else
        taking turns) goes below in any room within the budgets (fit/bounds.py); None
        where the kind's candidates are monotone in room (in more room it offers one no
        dearer than its cheapest in less), so that its cheapest with every GPU to itself
        is that floor. The search's bounds rest on it (fit/search.py)."""
        return None

    def floor(self, ctx, c: str, rooms, offered) -> Optional[float]:
        """A cost no placement floating() offers in `rooms` goes below (inf: it offers
        none), found without pricing them; None: no such shortcut, floating() is priced.
        The search floors a leaf with it before pricing the leaf (fit/floors.py)."""
        return None

    # -- host RAM -----------------------------------------------------------------------
    def to_disk(self, ctx, o, over: int):
        """`o` with its weights resting on disk (host RAM is `over` budget)."""
        raise NotImplementedError(f"{self.name} placements do not move to disk")

    def refill(self, ctx, o, room: int):
        """`o` given `room` more bytes of host RAM (RAM left over after the choice)."""
        return o

    # -- the plan and the report --------------------------------------------------------
    def to_plan(self, ctx, o, cp) -> None:
        """Write what the runtime executes of `o` into the ComponentPlan `cp`."""

    def fit_json(self, ctx, o) -> Dict[str, object]:
        """This kind's keys of extra.fit.components[c] (plan JSON v1)."""
        return {"parallel": self.parallel, "items_per_device": None,
                "serial_forward_s": None, "stream_per_device": None}

    def where(self, o) -> str:
        """A few words: what and where (the report's list of alternatives)."""
        if self.decision == "split":
            return f"split over {'&'.join(o.runtime)}"
        return f"{self.decision} on {'&'.join(o.runtime)}"

    def reasons(self, ctx, o, use) -> List[str]:
        """The decision in words: why this placement, with its figures."""
        raise NotImplementedError(f"kind {self.name} has no reason text")

    def disk_reason(self, ctx, o) -> str:
        """Why auto-fit rests o's weights on disk (host RAM short)."""
        return (f"host RAM budget {fmt(ctx.host_budget)} cannot hold every offloaded "
                f"component -> params on disk, re-read each {action(o)} ({ms(o.load_s)})")

    def failure(self, ctx, c: str, options, budgets, host, inventory):
        """The PlacementError when only this kind was asked for c and none fits; None:
        the general explanation."""
        return None


# -- words shared by the kinds' reasons ------------------------------------------------
ACTION = {"encode": "text encode", "sample": "sampling", "decode": "decode",
          "upscale": "upscale"}


def action(o) -> str:
    from ..option import PHASE_ORDER
    return ACTION[PHASE_ORDER[o.phase]]


def ms(seconds: float) -> str:
    if seconds >= 10:
        return f"{seconds:.1f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.1f} ms"


def per(o) -> str:
    return "per step" if o.runs > 1 else "per forward"


def network_line(ctx, runtime) -> str:
    """The network links a split over worker devices assumed ('' when all are local):
    '; network cuda0->w1.cuda0 1.25 GB/s (measured), 0.5 ms per crossing'."""
    names = list(runtime)
    parts = []
    for a, b in zip(names, names[1:] + names[:1]):
        kind, bw, latency, source = ctx.model.link(a, b)
        if kind == "network" and "." in b:
            parts.append(f"{a}->{b} {bw / 1e9:.2f} GB/s ({source}), "
                         f"{latency * 1e3:.1f} ms per crossing")
    return f"; network {', '.join(parts)}" if parts else ""


def size_line(ctx, c: str) -> str:
    geo = ctx.geos[c]
    return f"{c} {fmt(geo.total)} + {fmt(geo.headroom)} working memory"


def room_without(ctx, use, o, d: int) -> int:
    """What device d offers `o`'s component in its phase, the others' use taken off."""
    mine = o.persist.get(d, 0) + o.use.get(d, 0)
    return ctx.budget[d] - (use[o.phase][d] - mine)


def gpu_change(gpu: str, extra: int, budgets, options, inventory=None) -> str:
    """The one change that gives `gpu` `extra` more bytes, with the options that exist."""
    budget, how = budgets.get(gpu, (0, ""))
    target = budget + extra
    if inventory is not None:
        dev = inventory.get(gpu)
        if target > dev.total_bytes:
            return (f"{gpu} ({fmt(dev.total_bytes)}) cannot give that much even empty: it "
                    f"needs a larger GPU")
        if target > dev.free_bytes:
            return (f"free {fmt(target - dev.free_bytes)} on {gpu} and raise its budget "
                    f"(--max-vram {gpu}=SIZE)" if how.startswith("max_vram") else
                    f"free {fmt(extra)} more on {gpu} (its budget is its free memory less "
                    f"the {fmt(margin_for(dev, options.budget_margin))} margin)")
    if how.startswith("max_vram"):
        return f"raise max_vram {gpu}= to at least {fmt(target)} (--max-vram {gpu}=SIZE)"
    if how.startswith("balanced"):
        return f"raise balanced_threshold or use offload_mode auto (it gives {gpu} more)"
    return (f"free {fmt(extra)} more on {gpu} (its budget is its free memory less its "
            f"margin)")

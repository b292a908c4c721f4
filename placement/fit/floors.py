"""Leaves the search need not price. A leaf's floor is a cost no pricing of it goes
below, found without its large pricings; a leaf whose floor loses to the best leaf
priced so far is dropped (priced, it would lose too), one whose floor loses only to the
ceiling (the leaf where every component takes turns, priced once) is set aside.

The search's cuts are kept exactly: a leaf set aside is one the plain search would have
priced, so where its cost could decide a later cut (or the end), the leaves set aside
are priced then, in their order. The same leaves are reached and the same plan chosen,
whether or not the search's bounds hold; only the pricing of losing leaves is saved.
On 8 GPUs of 4 GiB, each text encoder split held for the session leaves the diffusion
model's streaming split less room than it saves: six of the seven leaves are set aside
before that split is priced (docs/autofit.md, "Measured").

A floor is sound where (checked here) host RAM holds the leaf whatever it picks (else
the search's host pass may change the picks) and the component is alone in its phase
(beside another one it may take a placement it would not alone); each kind's floor is
its own (Kind.floor)."""
from typing import Dict, List, Optional

from .option import PHASE_ORDER, Option

_EPS = 1e-12       # the search's cut: costs past best x (1 + 1e-9) + _EPS
_TIE = 1e-8        # keys compare costs rounded to 9 digits: closer than this may tie


def above(cost: float) -> float:
    """Costs past this lose to `cost` whatever the rest of their keys."""
    return cost * (1 + 1e-9) + _TIE


def cut_at(cost: float) -> float:
    """The search's cut: a branch whose bound is past this loses to a leaf of `cost`."""
    return cost * (1 + 1e-9) + _EPS


class LeafFloors:
    """The Search's leaves priced only when they may matter (a mixin: the Search's
    memo, rooms, _evaluate and best)."""
    floors = True      # False: every leaf is priced (tests/placement/test_leaf_floors.py)

    def init_floors(self) -> None:
        self.best = None
        self.best_leaf = 0            # its number: among equal keys the first leaf wins
        self.ceiling: Optional[float] = None      # priced when first needed
        self.turns = None             # (persist, extra) where every component takes turns
        self.set_aside: List[tuple] = []
        self.lowest_aside = float("inf")

    # -- what the plain search does, with the leaves set aside priced when they count ----
    def consider(self, number: int, found) -> None:
        if found is not None and (self.best is None or
                                  (found[0], number) < (self.best[0], self.best_leaf)):
            self.best, self.best_leaf = found, number

    def cut(self, bound: float) -> bool:
        """The plain search's cut of a branch: its bound past the best leaf priced so far
        (the leaves set aside count: when one of them could decide it, they are priced)."""
        if self.best is not None and bound > cut_at(self.best[0][0]):
            return True
        if self.set_aside and bound > cut_at(self.lowest_aside):
            self.price_set_aside()
            return self.best is not None and bound > cut_at(self.best[0][0])
        return False

    def finish(self) -> None:
        """At the end: a leaf set aside costs more than the ceiling, so it can be the
        best only when nothing priced reaches the ceiling."""
        if self.set_aside and (self.best is None or self.best[0][0] > self.ceiling):
            self.price_set_aside()

    def price_set_aside(self) -> None:
        for number, persist, extra, fixed, floating, _ in self.set_aside:
            self.consider(number, self._evaluate(persist, extra, fixed, floating))
        self.set_aside, self.lowest_aside = [], float("inf")

    def leaf(self, persist, extra, fixed: Dict[str, Option], floating: List[str]) -> None:
        self.leaves += 1
        if self.floors and self.host_holds(fixed, floating) and \
                self.decided_unpriced(persist, extra, fixed, floating):
            return
        if not fixed and self.turns is not None:
            found = self.every_one_takes_turns()         # priced once for the ceiling
        else:
            found = self._evaluate(persist, extra, fixed, floating)
        self.consider(self.leaves, found)

    def decided_unpriced(self, persist, extra, fixed, floating) -> bool:
        """Whether this leaf loses by its floor, checked as it grows (no cost is
        negative): its persistent choices, then the floor of each turn-taking component
        alone in its phase, largest first (one beside another counts 0)."""
        floor = sum(o.cost for o in fixed.values())
        if self.loses_at(floor, persist, extra, fixed, floating):
            return True
        phases = [self.phase_of[c] for c in floating]
        for c, p in zip(floating, phases):
            if phases.count(p) > 1:
                continue
            floor += self.floating_floor(c, [self.budget[d] - persist[d] - extra[p][d]
                                             for d in range(self.G)])
            if self.loses_at(floor, persist, extra, fixed, floating):
                return True
        return False

    def loses_at(self, floor: float, persist, extra, fixed, floating) -> bool:
        """A leaf costing at least `floor`: dropped when it loses to the best priced, set
        aside when it loses to the ceiling (asked only above every component's best
        alone, which it seldom beats: a plan that fits well never prices it)."""
        if self.best is not None and floor > above(self.best[0][0]):
            return True
        if floor > above(sum(self.lbs.values())) and floor > above(self.the_ceiling()):
            self.set_aside.append((self.leaves, [*persist], [[*e] for e in extra],
                                   dict(fixed), list(floating), floor))
            self.lowest_aside = min(self.lowest_aside, floor)
            return True
        return False

    # -- the ceiling --------------------------------------------------------------------
    def the_ceiling(self) -> float:
        """The cost of the leaf where every component takes turns (the DFS reaches it
        last), or inf: any leaf costing more loses to it."""
        if self.ceiling is None:
            found = None if self.turns is None else self.every_one_takes_turns()
            self.ceiling = float("inf") if found is None else found[0][0]
        return self.ceiling

    def every_one_takes_turns(self):
        return self.memo(("leaf", "turns"), lambda: self._evaluate(
            *self.turns, {}, list(self.comps)))

    # -- floors -------------------------------------------------------------------------
    def floating_floor(self, c: str, rooms) -> float:
        """No turn-taking placement of `c` in `rooms` costs less: the cheapest of
        floating_options when they are priced already, else each kind's own floor where it
        has one (Kind.floor), the others priced. A kind answering with its floor leaves
        its options out of `offered`, so the kinds after it offer at least as much
        (`offered` only ever narrows what a kind offers): still a floor."""
        priced = self._memo.get(("floating", c, tuple(rooms)))
        if priced is not None:
            return min((o.cost for o in priced), default=float("inf"))
        floor, offered = float("inf"), []
        for kind in self._kinds(c):
            bound = kind.floor(self, c, rooms, offered)
            if bound is None:
                found = kind.floating(self, c, rooms, offered)
                offered += found
                bound = min((o.cost for o in found), default=float("inf"))
            floor = min(floor, bound)
        return floor

    def host_holds(self, fixed, floating) -> bool:
        """Whether host RAM holds this leaf whatever its turn-taking components pick, so
        that the host pass moves nothing: each rests in RAM whole at most, and one
        computing on the cpu adds its working memory (and its weights, when read from
        disk) in its phase."""
        held = sum(o.host_persist for o in fixed.values())
        per_phase = [0] * len(PHASE_ORDER)
        for o in fixed.values():
            per_phase[o.phase] += o.host_use
        for c in floating:
            geo = self.geos[c]
            held += geo.total
            per_phase[self.phase_of[c]] += geo.headroom + (
                geo.total if self.source(c) == "disk" else 0)
        return held + max(per_phase) <= self.host_budget

"""Leaves priced only when they may matter (placement/fit/floors.py): every plan, the
search's leaf count included, is the one the search makes pricing every leaf; each
kind's floor is below every placement it prices; and on 8 GPUs of 4 GiB (the hard
case of benchmarks/plan_speed.py) six of the seven leaves are never priced."""
import json
from contextlib import contextmanager
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from comfyui_placement.placement import Inventory, PlacementError, PlacementSpec, plan
from comfyui_placement.placement.fit import FitOptions, fit
from comfyui_placement.placement.fit.geometry import Geometry
from comfyui_placement.placement.fit.kinds import KINDS, Kind, split_stream
from comfyui_placement.placement.fit.search import Search
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo
from helpers.flux_models import flux_components, write_flux_pipeline
from test_fit_properties import request, requests

GiB, MiB = 1 << 30, 1 << 20
FLOORED = [kind for kind in KINDS if type(kind).floor is not Kind.floor]


@contextmanager
def floors(on: bool):
    with mock.patch.object(Search, "floors", on):
        yield


@st.composite
def models(draw):
    """Components of two block sizes (Flux's double and single blocks) or of any."""
    names = draw(st.lists(st.sampled_from(["diffusion", "te", "vae", "controlnet",
                                           "clip_vision", "upscaler"]),
                          min_size=1, max_size=4, unique=True))
    out = {}
    for comp in sorted(names):
        big, small = draw(st.integers(1, 40)), draw(st.integers(0, 40))
        sizes = [draw(st.integers(16, 1024)) * MiB] * big + \
            [draw(st.integers(8, 512)) * MiB] * small
        if draw(st.booleans()):
            sizes = [draw(st.integers(1, 1024)) * MiB for _ in sizes]
        blocks = tuple(BlockInfo(f"b.{i}", s, "b", i) for i, s in enumerate(sizes))
        non_block = draw(st.integers(0, 1024)) * MiB
        out[comp] = ComponentInfo(comp, non_block + sum(sizes), blocks, dtype="bf16",
                                  headroom_bytes=draw(st.integers(0, 3072)) * MiB)
    return out


@st.composite
def inventories(draw):
    """1 to 8 GPUs, often equal (the floors' case), sometimes a worker's."""
    n, same = draw(st.integers(1, 8)), draw(st.booleans())
    size = draw(st.integers(2, 96)) * GiB // 4
    parts = []
    for i in range(n):
        if not same:
            size = draw(st.integers(2, 96)) * GiB // 4
        parts.append(f"cuda{i}={size}B")
    if draw(st.integers(0, 5)) == 0:
        parts.append(f"w1.cuda0={draw(st.integers(4, 96)) * GiB // 4}B")
    parts.append(f"cpu={draw(st.integers(4, 128))}GiB")
    return ",".join(parts)


def outcome(req, inv, infos, options) -> str:
    try:
        return fit(req, inv, infos, options).to_json()
    except PlacementError as exc:
        return f"error: {exc}"


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_every_plan_is_the_one_pricing_every_leaf(data):
    inv = Inventory.simulated(data.draw(inventories()))
    infos = data.draw(models())
    req = data.draw(requests([d.name for d in inv.accelerators()], list(infos)))
    options = FitOptions(
        offload_mode=data.draw(st.sampled_from(["auto"] * 3 + ["none", "model", "balanced",
                                                                "sequential"])),
        prefetch_depth=data.draw(st.sampled_from([None, None, 0, 1, 3])),
        executor=data.draw(st.sampled_from(["runtime", "runtime", "comfyui"])),
        cond_batch=data.draw(st.sampled_from([1, 2])),
        steps=data.draw(st.sampled_from([1, 4, 20])),
        host_budget=data.draw(st.one_of(st.none(), st.integers(1, 64).map(lambda x: x * GiB))))
    with floors(False):
        every_leaf = outcome(req, inv, infos, options)
    with floors(True):
        assert outcome(req, inv, infos, options) == every_leaf


def grabbed_search(infos, inventory: str, options=None) -> Search:
    """The Search fit() runs for `infos` on `inventory`, after its run."""
    runs = []
    run = Search.run

    def grab(self):
        runs.append(self)
        return run(self)
    with mock.patch.object(Search, "run", grab):
        try:
            fit(request(), Inventory.simulated(inventory), infos, options or FitOptions())
        except PlacementError:
            pass
    return runs[0]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(models(), st.integers(1, 8), st.integers(2, 64), st.data())
def test_each_floor_is_below_what_its_kind_prices(infos, n, quarters, data):
    search = grabbed_search(infos, ",".join(f"cuda{i}={quarters * GiB // 4}B"
                                            for i in range(n)) + ",cpu=64GiB")
    for c in infos:
        rooms = [data.draw(st.integers(0, quarters * 256)) * MiB for _ in range(n)]
        for kind in FLOORED:
            floor = kind.floor(search, c, rooms, [])
            priced = kind.floating(search, c, rooms, [])
            cheapest = min((o.cost for o in priced), default=float("inf"))
            assert floor is None or floor <= cheapest * (1 + 1e-12), (kind.name, c, rooms)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 400), min_size=2, max_size=24), st.integers(1, 6), st.data())
def test_deepest_fitting_is_the_walk_over_depths(sizes, k, data):
    k = min(k, len(sizes))
    info = ComponentInfo("diffusion", sum(sizes) + 5,
                         tuple(BlockInfo(f"b{i}", s) for i, s in enumerate(sizes)))
    geo = Geometry(info, headroom=0)
    cuts = sorted(data.draw(st.lists(st.integers(1, len(sizes) - 1), min_size=k - 1,
                                     max_size=k - 1, unique=True))) if k > 1 else []
    ends = cuts + [len(sizes)]
    spans = list(zip([0] + cuts, ends))
    caps = [data.draw(st.integers(0, sum(sizes))) for _ in spans]
    top = data.draw(st.integers(0, 5))
    rooms = [cap - (geo.non_block if j == 0 else 0) for j, cap in enumerate(caps)]
    walk = next((d for d in range(top, -1, -1)
                 if all(geo.range_fits(a, b, room, d) for (a, b), room in zip(spans, rooms))),
                None)
    assert split_stream.deepest_fitting(geo, caps, spans, top) == walk


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    return flux_components(write_flux_pipeline(tmp_path_factory.mktemp("floors")))


def test_the_hard_case_prices_one_leaf_of_seven(flux):
    inventory = Inventory.simulated(",".join(f"cuda{i}=4GiB" for i in range(8)) + ",cpu=64GiB")
    plans, pricings = {}, {}
    for on in (False, True):
        priced = []
        price = split_stream.price_spans

        def counted(*args, **kwargs):
            priced.append(args)
            return price(*args, **kwargs)
        with floors(on), mock.patch.object(split_stream, "price_spans", counted):
            plans[on] = plan(PlacementSpec(auto_fit=True), inventory, flux).to_json()
        pricings[on] = len(priced)
    assert plans[True] == plans[False]
    assert json.loads(plans[True])["fit"]["search"] == {"leaves": 7}
    # each room state's streaming split is priced in five layouts: without floors in six
    # room states, with them only in the room of lower_bounds (every GPU empty)
    assert pricings[False] >= 25 and pricings[True] <= 5

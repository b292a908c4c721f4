"""When nothing fits: one line saying which resource binds (which GPU or host RAM), in
which phase, by how much, and one change that exists (a CLI flag, freeing memory, the
offload mode). A kind asked alone (parallel batch, parallel pipeline) explains its own
failure (kinds/*.py `failure`)."""
from ..components import PHASES
from ..errors import PlacementError
from ..units import format_bytes as fmt
from .kinds import BY_NAME
from .kinds.base import ACTION, gpu_change
from .option import PHASE_ORDER
from .search import Search


def explain_failure(search: Search, options, budgets, host, inventory=None) -> PlacementError:
    """One line: which resource binds (which GPU or host RAM), in which phase, by how
    much, and one change that exists (a CLI flag, freeing memory, the offload mode)."""
    mode = options.offload_mode
    hint = {"none": "use offload_mode auto (or balanced/sequential) to let it stream or take turns",
            "model": "use offload_mode auto to stream what does not fit whole",
            "sequential": "raise max_vram or free GPU memory",
            "balanced": "raise balanced_threshold or use offload_mode auto",
            "auto": "raise max_vram or free GPU memory, or leave the placement to auto-fit"}[mode]
    source = host[1] if isinstance(host, tuple) and len(host) > 1 else ""
    host_hint = {"host_budget": "raise host_budget",
                 "max_vram cpu": "raise max_vram cpu= (--max-vram cpu=SIZE)"}.get(
        source, "free host memory")
    lbs = getattr(search, "lbs", None) or search.lower_bounds()
    most = max(search.budget, default=0)
    for c in search.comps:
        if lbs[c] != float("inf"):
            continue
        geo, rule = search.geos[c], search.rules[c]
        if rule.only is not None:
            told = BY_NAME[rule.only].failure(search, c, options, budgets, host, inventory)
            if told is not None:
                return told
        need = geo.total + geo.headroom
        how = "whole"
        if rule.stream and geo.n >= 2:
            k0 = geo.stream_weights(0, 0) + geo.headroom
            if k0 < need:
                need, how = k0, "streamed with no resident block"
        split_devs = search.devices(c) if (rule.float_split or rule.persist_split) else []
        if len(split_devs) >= 2:
            # a split over all its GPUs: every one also holds the working memory
            together = geo.total + len(split_devs) * geo.headroom
            have = sum(search.budget[d] for d in split_devs)
            names = "&".join(search.gpus[d] for d in split_devs)
            if together - have < need - most:
                return PlacementError(
                    f"auto-fit: {c} ({fmt(geo.total)}) fits nowhere under offload_mode "
                    f"{mode}: split over {names} it needs at least {fmt(together)} together "
                    f"(working memory {fmt(geo.headroom)} on each) and their budgets hold "
                    f"{fmt(have)}, short by {fmt(together - have)} for "
                    f"{ACTION[PHASES[c]]}; {hint}")
        asked = ""
        if rule.runtime is not None or rule.params is not None:
            asked = (f" as asked (runtime {'&'.join(rule.runtime or ['auto'])}, "
                     f"params {rule.params or 'auto'})")
        if rule.runtime == ["cpu"] or (not search.gpus and rule.cpu):
            return PlacementError(
                f"auto-fit: {c} needs {fmt(geo.total + geo.headroom)} of host RAM to run on "
                f"the cpu{asked} but the host budget is {fmt(search.host_budget)}; "
                f"{host_hint}")
        gpu = _roomiest(search, c)
        short = max(0, need - most)
        change = hint
        if mode in ("auto", "sequential") and gpu is not None:
            change = gpu_change(gpu, short, budgets, options, inventory) + \
                (", or leave the placement to auto-fit" if asked else "")
        where = f" ({gpu}, for {ACTION[PHASES[c]]})" if gpu is not None else ""
        return PlacementError(
            f"auto-fit: {c} ({fmt(geo.total)}) fits nowhere under offload_mode {mode}{asked}: "
            f"it needs at least {fmt(need)} on a GPU ({how}, working memory "
            f"{fmt(geo.headroom)}) and the largest budget is {fmt(most)}{where}, short by "
            f"{fmt(short)}; {change}")
    # the binding resource: host RAM when more of it alone makes the plan fit (more GPU
    # memory would only hide it), else the GPUs
    host_only = _host_shortfall(search, gpu_extra=0)
    if host_only is not None:
        return PlacementError(
            f"auto-fit: host RAM budget {fmt(search.host_budget)} cannot hold the weights that "
            f"must rest there in every phase (short by {fmt(host_only)}); {host_hint}, or "
            f"{_host_alternative(search)}")
    one = _one_gpu_shortfall(search)
    if one is not None:
        gpu, extra, phase = one
        what = (f"{search.comps[0]} does not fit" if len(search.comps) == 1 else
                "the components fit one at a time but not together")
        on = "the GPU" if len(search.gpus) == 1 else gpu
        change = hint if mode not in ("auto", "sequential") else \
            gpu_change(gpu, extra, budgets, options, inventory)
        return PlacementError(
            f"auto-fit: {what} under offload_mode {mode}; it would fit with {fmt(extra)} "
            f"more on {on} ({gpu} binds in {phase}); {change}")
    extra = _shortfall(search)
    if extra is not None:
        what = (f"{search.comps[0]} does not fit" if len(search.comps) == 1 else
                "the components fit one at a time but not together")
        gpus = "the GPU" if len(search.gpus) == 1 else "every GPU"
        return PlacementError(
            f"auto-fit: {what} under offload_mode {mode}; it would fit with {fmt(extra)} "
            f"more on {gpus}; {hint}")
    host_need = _host_shortfall(search)
    if host_need is not None:
        return PlacementError(
            f"auto-fit: host RAM budget {fmt(search.host_budget)} cannot hold the weights that "
            f"must rest there (short by {fmt(host_need)}); {host_hint}, or leave params to "
            f"auto-fit so they can rest on disk")
    return PlacementError(f"auto-fit: no placement fits under offload_mode {mode}; {hint}")


def _host_alternative(search: Search) -> str:
    """What else frees host RAM: params asked on the cpu could rest on disk; otherwise
    what holds RAM computes on the cpu (its weights must be in RAM), so GPU room helps."""
    asked = [c for c in search.comps if search.rules[c].params == "cpu"]
    if asked:
        return (f"leave params of {', '.join(asked)} to auto-fit so they can rest on "
                f"disk")
    return ("give a GPU room to run what now computes on the cpu (a component computing "
            "on the cpu holds its weights in host RAM)")


def _roomiest(search: Search, c: str):
    """The GPU with the largest budget among those `c` may use (None: no GPU)."""
    devs = search.devices(c) or list(range(search.G))
    if not devs:
        return None
    return search.gpus[max(devs, key=lambda d: (search.budget[d], -d))]


def _one_gpu_shortfall(search: Search):
    """(gpu, bytes, phase): the least memory one GPU alone needs for the plan to fit, and
    the phase that binds there; None when no single GPU's memory makes it fit."""
    best, seen = None, set()
    for d in range(search.G):
        sig = (search.budget[d], search.tp[d], search.bw[d])
        if sig in seen:
            continue
        seen.add(sig)
        high = sum(g.total + 2 * g.headroom for g in search.geos.values())
        extra = _bisect(lambda x: _retry(search, gpu_extra={d: x}), high)
        if extra is not None and (best is None or extra < best[1]):
            best = (d, extra)
    if best is None:
        return None
    d, extra = best
    trial = _trial(search, gpu_extra={d: extra})
    found = trial.run()
    phase = "every phase"
    if found is not None:
        use = found[2]
        over = [p for p in range(len(PHASE_ORDER)) if use[p][d] > search.budget[d]]
        if over and len(over) < len(PHASE_ORDER):
            phase = " and ".join(ACTION[PHASE_ORDER[p]] for p in over)
    return search.gpus[d], extra, phase


def _trial(search: Search, gpu_extra=0, host_extra: int = 0) -> Search:
    """The same fit with more memory: `gpu_extra` bytes on every GPU, or {gpu index:
    bytes}."""
    more = gpu_extra if isinstance(gpu_extra, dict) else \
        {d: gpu_extra for d in range(search.G)}
    return Search(search.geos, search.work, search.rules, search.gpus,
                  {g: b + more.get(d, 0) for d, (g, b) in
                   enumerate(zip(search.gpus, search.budget))},
                  search.host_budget + host_extra, search.model, search.depth,
                  search.tiles, workspace=search.workspace)


def _retry(search: Search, gpu_extra=0, host_extra: int = 0) -> bool:
    return _trial(search, gpu_extra, host_extra).run() is not None


def _bisect(fits, high: int):
    if not fits(high):
        return None
    low = 0
    while high - low > (1 << 20):                 # to the MiB
        mid = (low + high) // 2
        if fits(mid):
            high = mid
        else:
            low = mid
    return high


def _shortfall(search: Search):
    if not search.gpus:
        return None
    high = sum(g.total + 2 * g.headroom for g in search.geos.values())
    return _bisect(lambda x: _retry(search, gpu_extra=x), high)


def _host_shortfall(search: Search, gpu_extra=None):
    high = sum(g.total + g.headroom for g in search.geos.values())
    big = sum(g.total + 2 * g.headroom for g in search.geos.values())
    more = big if gpu_extra is None else gpu_extra
    return _bisect(lambda x: _retry(search, gpu_extra=more, host_extra=x), high)

"""The capability table (placement/capabilities.py) is what auto-fit plans for: every
plan made for the ComfyUI executor passes the adapter's check, and an explicit request
an executor cannot run is a one-line PlacementError naming the missing capability."""
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from comfyui_placement.placement import Inventory, PlacementError, PlacementSpec
from comfyui_placement.placement import capabilities as caps
from comfyui_placement.placement.devices import Device
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo
from comfyui_placement.placement.resolve import plan

GiB = 1 << 30
MiB = 1 << 20
SETTINGS = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def info(comp, n=8, block=256 * MiB, non_block=64 * MiB, headroom=256 * MiB):
    blocks = tuple(BlockInfo(f"b.{i}", block, "b", i) for i in range(n))
    return ComponentInfo(comp, non_block + n * block, blocks, dtype="bf16",
                         headroom_bytes=headroom)


def real_inventory(*gib, cpu=64):
    """Accelerators that are not simulated (what ComfyUI runs on), without a GPU here."""
    devs = [Device(f"cuda{i}", "gpu", int(g * GiB), int(g * GiB), "test gpu",
                   torch_device=f"cuda:{i}") for i, g in enumerate(gib)]
    devs.append(Device("cpu", "cpu", cpu * GiB, cpu * GiB, "test cpu", torch_device="cpu"))
    return Inventory(devs, source="test")


@st.composite
def scenarios(draw):
    names = draw(st.lists(st.sampled_from(["diffusion", "te", "vae", "controlnet",
                                           "clip_vision", "upscaler"]),
                          min_size=1, max_size=6, unique=True))
    infos = {c: info(c, draw(st.integers(0, 24)), draw(st.integers(16, 1536)) * MiB,
                     draw(st.integers(0, 512)) * MiB, draw(st.integers(0, 2048)) * MiB)
             for c in sorted(names)}
    gpus = draw(st.lists(st.integers(1, 48), min_size=0, max_size=3))
    simulated = draw(st.booleans())
    host = draw(st.integers(4, 96))
    if simulated:
        text = ",".join([f"cuda{i}={g}GiB" for i, g in enumerate(gpus)] + [f"cpu={host}GiB"])
        inv = Inventory.simulated(text)
    else:
        inv = real_inventory(*gpus, cpu=host)
    mode = draw(st.sampled_from(["auto", "none", "model", "balanced", "sequential"]))
    params = draw(st.sampled_from(["", "*=cpu", "*=disk"]))
    return infos, inv, mode, params


@SETTINGS
@given(scenarios())
def test_every_autofit_plan_for_comfyui_passes_the_adapters_check(case):
    infos, inv, mode, params = case
    spec = PlacementSpec(auto_fit=True, offload_mode=mode, params_backend=params)
    try:
        p = plan(spec, inv, infos, executor="comfyui")
    except PlacementError as exc:
        assert "\n" not in str(exc)
        if "is not executed" in str(exc):        # only for what the request itself asked
            assert params == "*=disk" and any(
                not caps.allows("comfyui", c, "disk") for c in infos), str(exc)
        return                                   # nothing fits: an error, never a bad plan
    for comp in infos:
        cp = p.components[comp]
        assert caps.missing(cp, inv, "comfyui") == [], (comp, caps.needs(cp, inv))
        caps.check_component(cp, inv, "comfyui")


def test_the_vae_is_streamed_for_the_runtime_but_not_inside_comfyui():
    """The scenario the issue saw: a VAE too big for the GPU whole."""
    inv = real_inventory(4)
    infos = {"vae": info("vae", n=12, block=384 * MiB, headroom=512 * MiB)}
    spec = PlacementSpec(auto_fit=True)
    for_runtime = plan(spec, inv, infos).components["vae"]
    assert for_runtime.stream is not None and for_runtime.main_device == "cuda0"
    inside = plan(spec, inv, infos, executor="comfyui").components["vae"]
    assert inside.stream is None and not inside.is_split
    assert caps.missing(inside, inv, "comfyui") == []
    assert "stream" in caps.missing(for_runtime, inv, "comfyui")


def test_simulated_gpus_take_only_what_the_engine_runs_inside_comfyui():
    inv = Inventory.simulated("cuda0=48GiB,cpu=64GiB")
    infos = {c: info(c, n=4, block=64 * MiB) for c in ("diffusion", "vae", "controlnet",
                                                      "clip_vision")}
    p = plan(PlacementSpec(auto_fit=True), inv, infos, executor="comfyui")
    # the ControlNet cannot run on the simulated GPU: it runs on the cpu, and its
    # residuals hop to the diffusion model's (placement/controlnet_with_diffusion.py)
    assert p.components["controlnet"].runtime == ["cpu"]
    assert p.components["diffusion"].main_device == "cuda0"
    assert p.components["clip_vision"].runtime == ["cpu"]
    del infos["controlnet"]
    p = plan(PlacementSpec(auto_fit=True), inv, infos, executor="comfyui")
    assert p.components["diffusion"].main_device == "cuda0"
    p = plan(PlacementSpec(auto_fit=True), inv, infos)            # the plain runtime
    assert p.components["clip_vision"].main_device == "cuda0"


def test_a_split_vae_is_never_proposed_inside_comfyui():
    inv = real_inventory(3, 3)
    infos = {"vae": info("vae", n=10, block=400 * MiB, headroom=0)}
    p = plan(PlacementSpec(auto_fit=True, params_backend="*=cpu"), inv, infos,
             executor="comfyui")
    assert not p.components["vae"].is_split
    assert caps.missing(p.components["vae"], inv, "comfyui") == []


@pytest.mark.parametrize("spec, executor, missing", [
    (dict(backend="vae=cuda0&cuda1"), "comfyui", "a layer split"),
    (dict(backend="vae=cuda0&cuda1", auto_fit=True), "comfyui", "a layer split"),
    (dict(backend="controlnet=cuda0"), "comfyui", "a simulated device"),
    (dict(backend="controlnet=cuda0", auto_fit=True), "comfyui", "a simulated device"),
    (dict(backend="*=cpu", params_backend="upscaler=disk"), "comfyui", "params disk"),
    # an Impact Pack detector is moved whole for each call (runtime/engine/detector.py)
    (dict(backend="*=cpu", params_backend="yolo=disk"), "comfyui", "params disk"),
    (dict(backend="*=cpu,detector=cuda0&cuda1"), "comfyui", "a layer split"),
    (dict(backend="diffusion=cuda0&cuda1", split_mode="row", params_backend="*=disk"),
     "runtime", "params disk with a row split"),
    (dict(backend="diffusion=cuda0&cuda1", split_mode="row", stream_layers=True),
     "runtime", "streaming with a row split"),
    (dict(backend="vae=cuda0", params_backend="vae=cuda1"), "runtime",
     "weights resting on another GPU"),
    (dict(backend="vae=cuda0", params_backend="vae=cuda1"), "comfyui",
     "weights resting on another GPU"),      # simulated: the engine, which rests on cpu
])
def test_explicit_impossible_requests_name_what_is_missing(spec, executor, missing):
    inv = Inventory.simulated("cuda0=24GiB,cuda1=24GiB,cpu=64GiB")
    infos = {c: info(c, n=6, block=64 * MiB) for c in ("diffusion", "vae", "controlnet",
                                                      "upscaler", "detector")}
    with pytest.raises(PlacementError) as exc:
        plan(PlacementSpec(**spec), inv, infos, executor=executor)
    text = str(exc.value)
    assert "\n" not in text and missing in text
    where = "inside ComfyUI" if executor == "comfyui" else "by the plain runtime"
    assert where in text


def test_explicit_possible_requests_pass_and_a_named_absent_module_is_checked_in_comfyui():
    inv = Inventory.simulated("cuda0=24GiB,cuda1=24GiB,cpu=64GiB")
    ok = plan(PlacementSpec(backend="diffusion=cuda0&cuda1", stream_layers=True), inv,
              {"diffusion": info("diffusion")}, executor="comfyui")
    assert caps.needs(ok.components["diffusion"], inv)[:2] == ["layer_split", "split_stream"]
    # Backend Assignment plans before models are connected: a named module is checked
    with pytest.raises(PlacementError, match="vae: a layer split"):
        plan(PlacementSpec(backend="vae=cuda0&cuda1"), inv, executor="comfyui")
    plan(PlacementSpec(backend="vae=cuda0&cuda1"), inv)            # the runtime splits it


def test_unknown_executor():
    with pytest.raises(PlacementError, match="unknown executor"):
        plan(PlacementSpec(), Inventory.simulated("cpu=8GiB"), executor="vulkan")


def test_the_adapter_reads_the_same_table():
    from comfyui_placement.placement.plan import ComponentPlan, StreamPlan
    inv = Inventory.simulated("cuda0=24GiB,cpu=64GiB")
    cp = ComponentPlan("vae", ["cuda0"], "cpu", stream=StreamPlan(0, 1), present=True)
    assert caps.missing(cp, inv, "comfyui") == ["stream"]
    assert caps.missing(cp, inv, "runtime") == []
    assert caps.needs(cp, inv) == ["stream", "cpu_params", "simulated"]
    assert caps.engine_needs(cp, inv) == ["stream", "simulated"]
    real = real_inventory(8)
    plain = ComponentPlan("vae", ["cuda0"], "cpu", present=True)
    assert caps.engine_needs(plain, real) == []          # ComfyUI's patcher runs it
    lora = ComponentPlan("te", ["cuda0"], "cuda0", lora="runtime", present=True)
    assert caps.engine_needs(lora, real) == ["lora_runtime"]

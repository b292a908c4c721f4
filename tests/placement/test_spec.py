"""The grammar: every example of seed 000 and every error, table-driven."""
import pytest

from comfyui_placement.placement import PlacementError, PlacementSpec, plan


def runtime_of(p):
    return {c: "&".join(cp.runtime) for c, cp in p.components.items()}


def params_of(p):
    return {c: cp.params for c, cp in p.components.items()}


ALL = ("diffusion", "te", "clip_vision", "vae", "controlnet", "photomaker", "upscaler",
       "detector")


def every(value, **over):
    out = {c: value for c in ALL}
    out.update(over)
    return out


# (spec kwargs, expected runtime per component, expected params per component)
SEED_EXAMPLES = [
    (dict(backend="cpu"), every("cpu"), every("cpu")),
    (dict(backend="te=cpu,vae=cuda0,diffusion=vulkan0"),
     every("cuda0", te="cpu", diffusion="vulkan0"),
     every("cuda0", te="cpu", diffusion="vulkan0")),
    (dict(backend="cuda0", params_backend="te=cpu,vae=cpu"),
     every("cuda0"), every("cuda0", te="cpu", vae="cpu")),
    (dict(backend="cuda0", params_backend="disk"), every("cuda0"), every("disk")),
    (dict(backend="diffusion=cuda0,vae=vulkan0", max_vram="cuda0=6,vulkan0=2"),
     every("cuda0", vae="vulkan0"), every("cuda0", vae="vulkan0")),
    (dict(backend="all=cuda0,te=cpu"), every("cuda0", te="cpu"), every("cuda0", te="cpu")),
    (dict(backend="default=cuda1,te=cpu"), every("cuda1", te="cpu"), every("cuda1", te="cpu")),
    (dict(backend="*=vulkan0,te=cpu"), every("vulkan0", te="cpu"), every("vulkan0", te="cpu")),
    (dict(backend="cuda0", params_backend="cpu"), every("cuda0"), every("cpu")),
    (dict(backend="diffusion=cuda0,te=cpu,vae=cpu",
          params_backend="diffusion=cuda0,te=cpu,vae=cpu"),
     every("cuda0", te="cpu", vae="cpu"), every("cuda0", te="cpu", vae="cpu")),
    (dict(backend="te=cpu,vae=cpu"), every("cuda0", te="cpu", vae="cpu"),
     every("cuda0", te="cpu", vae="cpu")),
    # module names: case-insensitive, '-' and '_' ignored, every alias of the table
    (dict(backend="clip_vision=cpu"), every("cuda0", clip_vision="cpu"), None),
    (dict(backend="clip-vision=cpu"), every("cuda0", clip_vision="cpu"), None),
    (dict(backend="ClipVision=cpu"), every("cuda0", clip_vision="cpu"), None),
    (dict(backend="vision=cpu"), every("cuda0", clip_vision="cpu"), None),
    (dict(backend="model=cuda1"), every("cuda0", diffusion="cuda1"), None),
    (dict(backend="UNET=cuda1"), every("cuda0", diffusion="cuda1"), None),
    (dict(backend="dit=cuda1"), every("cuda0", diffusion="cuda1"), None),
    (dict(backend="t5xxl=cpu"), every("cuda0", te="cpu"), None),
    (dict(backend="T5_XXL=cpu"), every("cuda0", te="cpu"), None),
    (dict(backend="text-encoders=cpu"), every("cuda0", te="cpu"), None),
    (dict(backend="llm=cpu"), every("cuda0", te="cpu"), None),
    (dict(backend="cond=cpu"), every("cuda0", te="cpu"), None),
    (dict(backend="conditioner=cpu"), every("cuda0", te="cpu"), None),
    (dict(backend="first_stage=cpu"), every("cuda0", vae="cpu"), None),
    (dict(backend="autoencoder=cpu"), every("cuda0", vae="cpu"), None),
    (dict(backend="tae=cpu"), every("cuda0", vae="cpu"), None),
    (dict(backend="control=cpu"), every("cuda0", controlnet="cpu"), None),
    (dict(backend="pmid=cpu"), every("cuda0", photomaker="cpu"), None),
    (dict(backend="photo-maker-id=cpu"), every("cuda0", photomaker="cpu"), None),
    (dict(backend="esrgan=cpu"), every("cuda0", upscaler="cpu"), None),
    (dict(backend="hires=cpu"), every("cuda0", upscaler="cpu"), None),
    # stable-diffusion.cpp's eighth module (docs/backend.md): the ADetailer detector
    (dict(backend="detector=cpu"), every("cuda0", detector="cpu"), None),
    (dict(backend="ADetailer=cuda1"), every("cuda0", detector="cuda1"), None),
    (dict(backend="yolo=vulkan0"), every("cuda0", detector="vulkan0"), None),
    (dict(backend="cuda1", params_backend="yolo=disk,detector=cpu"), every("cuda1"),
     every("cuda1", detector="cpu")),
    # backend names: exact, case-insensitive, unique prefix, special values, torch spellings
    (dict(backend="CUDA1"), every("cuda1"), None),
    (dict(backend="vulkan"), every("vulkan0"), None),
    (dict(backend="metal"), every("metal"), None),
    (dict(backend="met"), every("metal"), None),
    (dict(backend="auto"), every("cuda0"), None),
    (dict(backend="default"), every("cuda0"), None),
    (dict(backend=""), every("cuda0"), None),
    (dict(backend="gpu"), every("cuda0"), None),
    (dict(backend="cuda:1"), every("cuda1"), None),
    (dict(backend="te=cuda:1,vae=CPU"), every("cuda0", te="cuda1", vae="cpu"), None),
    # an empty value means the default backend
    (dict(backend="cuda1,te="), every("cuda1", te="cuda0"), None),
    # a later entry for the same module wins; a module entry beats the default
    (dict(backend="te=cpu,te=cuda1"), every("cuda0", te="cuda1"), None),
    (dict(backend="te=cpu,cuda1"), every("cuda1", te="cpu"), None),
    (dict(backend="cuda1,cpu"), every("cpu"), None),
    # splits
    (dict(backend="diffusion=cuda0&cuda1"), every("cuda0", diffusion="cuda0&cuda1"), None),
    (dict(backend="te=cuda1&cuda0&vulkan0"), every("cuda0", te="cuda1&cuda0&vulkan0"), None),
    # compatibility flags prepend, so explicit entries win
    (dict(backend="cuda1", clip_on_cpu=True), every("cuda1", te="cpu"), None),
    (dict(backend="cuda1", vae_on_cpu=True), every("cuda1", vae="cpu"), None),
    (dict(backend="cuda1", control_net_cpu=True), every("cuda1", controlnet="cpu"), None),
    (dict(backend="te=cuda1", clip_on_cpu=True), every("cuda0", te="cuda1"), None),
    (dict(clip_on_cpu=True, vae_on_cpu=True, control_net_cpu=True),
     every("cuda0", te="cpu", vae="cpu", controlnet="cpu"), None),
    (dict(backend="cuda0", offload_to_cpu=True), every("cuda0"), every("cpu")),
    (dict(backend="cuda0", offload_to_cpu=True, params_backend="te=disk"),
     every("cuda0"), every("cpu", te="disk")),
    (dict(backend="cuda0", offload_to_cpu=True, params_backend="cuda1"),
     every("cuda0"), every("cuda1")),
    # params default to the module's runtime device; 'auto' params mean the same
    (dict(backend="te=cpu,cuda1", params_backend="auto"), every("cuda1", te="cpu"),
     every("cuda1", te="cpu")),
    (dict(backend="cuda1", params_backend="vae=cuda0"), every("cuda1"),
     every("cuda1", vae="cuda0")),
]


@pytest.mark.parametrize("kwargs,runtime,params", SEED_EXAMPLES,
                         ids=[str(e[0]) for e in SEED_EXAMPLES])
def test_seed_examples(seed_inventory, kwargs, runtime, params):
    p = plan(PlacementSpec(**kwargs), seed_inventory)
    assert runtime_of(p) == runtime
    if params is not None:
        assert params_of(p) == params


def test_budgets_resolve_against_devices(seed_inventory):
    p = plan(PlacementSpec(backend="diffusion=cuda0,vae=vulkan0", max_vram="cuda0=6,vulkan=2"),
             seed_inventory)
    budgets = {d.name: d.budget_bytes for d in p.devices}
    assert budgets == {"cuda0": 6 << 30, "cuda1": None, "vulkan0": 2 << 30, "metal": None,
                       "cpu": None}


@pytest.mark.parametrize("text,expected", [
    ("6", {"cuda0": 6 << 30, "cuda1": 6 << 30, "vulkan0": 6 << 30, "metal": 6 << 30}),
    ("0", {}),
    ("cuda0=0.5", {"cuda0": 512 << 20}),
    ("cuda0=512MiB,cuda1=2GiB", {"cuda0": 512 << 20, "cuda1": 2 << 30}),
    ("cuda0=-1", {"cuda0": 23 << 30}),
    ("-4", {"cuda0": 20 << 30, "cuda1": 8 << 30, "vulkan0": 4 << 30, "metal": 12 << 30}),
    ("all=4,cuda1=0", {"cuda0": 4 << 30, "vulkan0": 4 << 30, "metal": 4 << 30}),
    ("cuda:1=3", {"cuda1": 3 << 30}),
    ("cpu=32", {"cpu": 32 << 30}),
    ("cuda0=-24", {"cuda0": 0}),
])
def test_budget_forms(seed_inventory, text, expected):
    p = plan(PlacementSpec(max_vram=text), seed_inventory)
    got = {d.name: d.budget_bytes for d in p.devices if d.budget_bytes is not None}
    assert got == expected


@pytest.mark.parametrize("text", ["cuda0=-100", "cuda0=-24.5", "-13"])
def test_budget_below_zero_is_one_line_error(seed_inventory, text):
    # a negative budget is 'free minus that'; below zero it is an error, never a 0 B budget
    with pytest.raises(PlacementError) as e:
        plan(PlacementSpec(max_vram=text), seed_inventory)
    msg = str(e.value)
    assert "\n" not in msg and "resolves below zero" in msg and "free" in msg


def test_numeric_budget(seed_inventory):
    p = plan(PlacementSpec(max_vram=1.5), seed_inventory)
    assert p.device("cuda1").budget_bytes == 1536 << 20


@pytest.mark.parametrize("kwargs", [dict(split_mode="row"), dict(split_mode="diffusion=row,te=layer"),
                                    dict(split_mode="LAYER")])
def test_split_mode(seed_inventory, kwargs):
    p = plan(PlacementSpec(backend="cuda0&cuda1", **kwargs), seed_inventory)
    assert p.components["diffusion"].split_mode in ("row", "layer")
    if kwargs["split_mode"] == "row":
        assert all(cp.split_mode == "row" for cp in p.components.values())
    if kwargs["split_mode"].startswith("diffusion"):
        assert p.components["diffusion"].split_mode == "row"
        assert p.components["te"].split_mode == "layer"


# (kwargs, words the one-line message must contain)
ERRORS = [
    (dict(backend="disk"), ["'disk' is not a runtime backend"]),
    (dict(backend="te=disk"), ["'disk' is not a runtime backend"]),
    (dict(backend="foo=cpu"), ["unknown module 'foo'", "diffusion, te, clip_vision"]),
    (dict(params_backend="bogus_module=cpu"), ["unknown module"]),
    (dict(backend="=cpu"), ["empty key"]),
    (dict(backend="cpu,,cuda0"), ["empty entry"]),
    (dict(backend="te=cpu=cuda0"), ["invalid assignment"]),
    (dict(backend="cuda0&auto"), ["default token", "'&' list"]),
    (dict(backend="diffusion=cuda0&&cuda1"), ["default token"]),
    (dict(backend="diffusion=cuda0&disk"), ["invalid device list", "disk"]),
    (dict(backend="cuda0&cuda0"), ["named twice"]),
    (dict(backend="cuda0&cuda:0"), ["named twice"]),
    (dict(backend="cuda 0"), ["invalid device name"]),
    (dict(backend="cu$da"), ["invalid device name"]),
    (dict(params_backend="cuda0&cuda1"), ["device list", "params"]),
    (dict(params_backend="te=cpu&disk"), ["device list"]),
    (dict(split_mode="tensor"), ["invalid split mode 'tensor'", "layer or row"]),
    (dict(split_mode="te=column"), ["invalid split mode"]),
    (dict(max_vram="lots"), ["invalid max_vram value 'lots'", "GiB"]),
    (dict(max_vram="cuda0=6XB"), ["invalid max_vram value"]),
    (dict(max_vram="=6"), ["empty key"]),
    (dict(max_vram="cuda0=6=7"), ["invalid max_vram assignment"]),
    (dict(max_vram="cuda0=nan"), ["invalid max_vram value"]),
    (dict(max_vram="1e400"), ["invalid max_vram value"]),
    (dict(max_vram="6,,"), ["empty entry"]),
    # budgets are per device, as in stable-diffusion.cpp; a module there is said so
    (dict(max_vram="detector=2"), ["max_vram keys are devices, not modules", "detector"]),
    (dict(max_vram="cuda0=6,YOLO=1"), ["max_vram keys are devices", "module detector"]),
    (dict(max_vram="te=4"), ["max_vram keys are devices", "module te"]),
    (dict(offload_mode="fast"), ["invalid offload_mode", "balanced"]),
    (dict(stream_layers="maybe"), ["stream_layers must be true or false"]),
    (dict(backend=3), ["backend must be a string"]),
]


@pytest.mark.parametrize("kwargs,words", ERRORS, ids=[str(e[0]) for e in ERRORS])
def test_errors_are_one_line(kwargs, words):
    with pytest.raises(PlacementError) as info:
        PlacementSpec(**kwargs)
    msg = str(info.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg


RESOLVE_ERRORS = [
    (dict(backend="cuda7"), ["device 'cuda7' not found", "cuda0, cuda1, vulkan0, metal, cpu"]),
    (dict(backend="cuda"), ["ambiguous", "cuda0, cuda1"]),
    (dict(backend="c"), ["ambiguous", "cuda0, cuda1, cpu"]),
    (dict(backend="te=rocm0"), ["not found"]),
    (dict(params_backend="vae=cuda9"), ["not found"]),
    (dict(max_vram="cuda9=6"), ["not found"]),
    (dict(backend="vulkan&vulkan0"), ["named twice"]),
]


@pytest.mark.parametrize("kwargs,words", RESOLVE_ERRORS, ids=[str(e[0]) for e in RESOLVE_ERRORS])
def test_resolution_errors_are_strict(seed_inventory, kwargs, words):
    spec = PlacementSpec(**kwargs)      # syntax is fine; the devices are not
    with pytest.raises(PlacementError) as info:
        plan(spec, seed_inventory)
    assert "\n" not in str(info.value)
    for w in words:
        assert w in str(info.value)


def test_gpu_without_gpu_is_an_error():
    from comfyui_placement.placement import Inventory
    with pytest.raises(PlacementError, match="no GPU"):
        plan(PlacementSpec(backend="gpu"), Inventory.simulated("cpu=8"))


def test_auto_prefers_gpu_then_igpu_then_cpu():
    from comfyui_placement.placement import Inventory
    assert plan(PlacementSpec(), Inventory.simulated("igpu0=8,cuda0=8")) \
        .components["vae"].runtime == ["cuda0"]
    assert plan(PlacementSpec(backend="gpu"), Inventory.simulated("igpu0=8")) \
        .components["vae"].runtime == ["igpu0"]
    assert plan(PlacementSpec(), Inventory.simulated("cpu=8")).components["vae"].runtime == ["cpu"]


def test_lenient_resolution_falls_back_with_warnings(seed_inventory):
    spec = PlacementSpec(backend="te=cuda7,vae=cuda1,diffusion=cuda1&cuda9",
                         params_backend="vae=cuda8", max_vram="rocm0=4")
    p = plan(spec, seed_inventory, strict=False)
    assert p.components["te"].runtime == ["cuda0"]          # fell back to auto
    assert p.components["vae"].runtime == ["cuda1"]
    assert p.components["vae"].params == "cuda1"             # params fell back too
    assert p.components["diffusion"].runtime == ["cuda1"]    # the missing part dropped
    text = " ".join(p.warnings)
    for name in ("cuda7", "cuda8", "cuda9", "rocm0"):
        assert name in text


def test_spec_round_trips_through_dict():
    spec = PlacementSpec(backend="te=cpu", params_backend="disk", max_vram="cuda0=6",
                         split_mode="row", stream_layers=True, clip_on_cpu=True)
    assert PlacementSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(PlacementError, match="unknown placement field"):
        PlacementSpec.from_dict({"backendd": "cpu"})

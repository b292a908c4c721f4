"""The backend-assignment grammar of stable-diffusion.cpp (seed 000), made strict.

One parser serves the runtime backend, the params backend and the split mode:
a comma list of `value` (the default) or `module=value`; `all=`, `default=` and `*=`
also set the default; module names are case-insensitive with '-' and '_' ignored.
A later entry for the same key wins, and a module's own entry beats the default
whatever the order (this is how the compatibility flags' prepending works).

Parallelism uses the same grammar: `parallel` (none | batch | pipeline, a default or per
module), and `batch` and `pipeline` are also accepted as split modes (`split_mode
diffusion=batch`, `split_mode diffusion=pipeline`), so a text input that carries split
modes (the Backend Assignment node's) carries them. With batch a component whose runtime
names several devices (`a&b`) runs whole on each of them, with shares of the batch at
once, instead of being split by layers or rows. With pipeline it is a layer split whose
stages run a batch's shares one behind the other: `split_mode pipeline` is split mode
layer plus parallel pipeline, and a row split (no stages) with pipeline is refused.

Parsing here is syntax only; device names are resolved against an inventory by
placement.resolve, so a spec can be written for hardware that is not present.
"""
import re
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from .components import COMPONENTS, canonical_component, is_module_name
from .devices import DEFAULT_TOKENS, canonical_device_name
from .errors import PlacementError
from .units import ACCEPTED as BYTES_ACCEPTED, parse_bytes

DEFAULT_KEYS = ("all", "default", "*")
SPLIT_MODES = ("layer", "row")
PARALLEL_MODES = ("none", "batch", "pipeline")
OFFLOAD_MODES = ("auto", "none", "model", "balanced", "sequential")
LORA_MODES = ("auto", "fuse", "runtime")
_DEVICE_TOKEN = re.compile(r"^[a-z][a-z0-9]*(?::\d+)?$|^[a-z][a-z0-9.]*$")

Value = Optional[Tuple[str, ...]]   # runtime: device tokens (a split if >1); None = auto


@dataclass(frozen=True)
class Assignment:
    """Parsed `a,module=b,...`: a default and per-module values (canonical keys)."""
    default: object = None
    modules: Dict[str, object] = field(default_factory=dict)

    def for_component(self, component: str):
        return self.modules.get(component, self.default)

    def explicit_for(self, component: str) -> bool:
        return component in self.modules or self.default is not None


def _entries(text: str, what: str):
    """Yield (key or None for default, raw value) from a comma list."""
    if text is None:
        return
    if not isinstance(text, str):
        raise PlacementError(f"{what} must be a string, got {type(text).__name__}")
    if not text.strip():
        return
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise PlacementError(f"empty entry in {what} {text.strip()!r}; expected "
                                 f"VALUE or MODULE=VALUE separated by commas")
        key, eq, value = item.partition("=")
        if not eq:
            yield None, item
            continue
        key = key.strip()
        if not key:
            raise PlacementError(f"empty key in {what} entry {item!r}; expected MODULE=VALUE "
                                 f"with a module, or all=/default=/*= for the default")
        if "=" in value:
            raise PlacementError(f"invalid assignment {item!r} in {what}; expected MODULE=VALUE")
        if key.lower() in DEFAULT_KEYS:
            yield None, value.strip()
        else:
            yield canonical_component(key), value.strip()


def _parse(text: str, what: str, parse_value, prefix=()) -> Assignment:
    default, modules = None, {}
    for key, raw in list(prefix) + list(_entries(text, what)):
        value = parse_value(raw)
        if key is None:
            default = value
        else:
            modules[key] = value
    return Assignment(default, modules)


def _device_token(token: str, what: str) -> str:
    name = canonical_device_name(token)
    if not _DEVICE_TOKEN.match(name):
        raise PlacementError(f"invalid device name {token.strip()!r} in {what}; expected a "
                             f"device such as cpu, cuda0, cuda:1, vulkan0, mps, or auto/gpu")
    return name


def parse_runtime_value(raw: str) -> Value:
    what = "backend"
    name = raw.strip().lower()
    if "&" not in name:
        if name in DEFAULT_TOKENS:
            return None
        if name == "disk":
            raise PlacementError("'disk' is not a runtime backend: it is a params residency "
                                 "(use it in params_backend); runtime backends are devices")
        return (_device_token(name, what),)
    parts = [p.strip() for p in name.split("&")]
    for p in parts:
        if p in DEFAULT_TOKENS:
            raise PlacementError(f"invalid device list {raw.strip()!r}: a default token "
                                 f"(auto/default/empty) cannot be part of a '&' list; "
                                 f"name devices, e.g. cuda0&cuda1")
        if p == "disk":
            raise PlacementError(f"invalid device list {raw.strip()!r}: 'disk' is not a "
                                 f"runtime backend")
    tokens = tuple(_device_token(p, what) for p in parts)
    if len(set(tokens)) != len(tokens):
        raise PlacementError(f"invalid device list {raw.strip()!r}: a device is named twice")
    return tokens


def parse_params_value(raw: str) -> Optional[str]:
    name = raw.strip().lower()
    if "&" in name:
        raise PlacementError(f"params backend {raw.strip()!r} is a device list; params rest "
                             f"in one place: a device, cpu or disk ('&' lists are for backend)")
    if name in DEFAULT_TOKENS:
        return None            # the module's runtime device
    if name == "disk":
        return "disk"
    return _device_token(name, "params backend")


def parse_split_value(raw: str) -> Optional[str]:
    name = raw.strip().lower()
    if name in DEFAULT_TOKENS:
        return None
    if name not in SPLIT_MODES + SPLIT_PARALLEL:
        raise PlacementError(f"invalid split mode {raw.strip()!r}; expected layer or row, "
                             f"or batch (batch parallel) or pipeline (pipelined layer split)")
    return name


def parse_parallel_value(raw: str) -> Optional[str]:
    name = raw.strip().lower()
    if name in DEFAULT_TOKENS:
        return None
    if name not in PARALLEL_MODES:
        raise PlacementError(f"invalid parallel {raw.strip()!r}; expected none, batch or "
                             f"pipeline")
    return name


# Parallel modes also accepted as a split mode, and the split mode each leaves behind:
# batch is no split of the weights; pipeline is a layer split with pipelined stages.
SPLIT_PARALLEL = ("batch", "pipeline")
_SPLIT_LEFT = {"batch": None, "pipeline": "layer"}


def _parallel_from_split(split: Assignment,
                         parallel: Assignment) -> Tuple[Assignment, Assignment]:
    """`batch` or `pipeline` given as a split mode moves to the parallel assignment (batch
    leaves no split mode, pipeline leaves layer). Refused, one line each: a module with a
    layer/row split and parallel batch; a split mode batch/pipeline and a different
    parallel value for the same key; a module left with a row split and parallel
    pipeline (a row split has no stages to pipeline). A module's own layer/row split
    mode beats a default split mode batch/pipeline (`split_mode pipeline,te=row`: te is
    a plain row split)."""
    for key, value in parallel.modules.items():
        if value == "batch" and split.modules.get(key) in SPLIT_MODES:
            raise PlacementError(f"{key}: split_mode {split.modules[key]} and parallel batch "
                                 f"both set; batch parallel runs the whole {key} on each "
                                 f"device: set one of them")
    modules = dict(parallel.modules)
    for key, value in split.modules.items():
        if value in SPLIT_PARALLEL:
            if parallel.modules.get(key) not in (None, value):
                raise PlacementError(f"{key}: split_mode {value} and parallel "
                                     f"{parallel.modules[key]} both set; set one of them")
            modules[key] = value
    default = parallel.default
    if split.default in SPLIT_PARALLEL:
        if default not in (None, split.default):
            raise PlacementError(f"split_mode {split.default} and parallel {default} both "
                                 f"set as the default; set one of them")
        if default is None:
            default = split.default
            for key, value in split.modules.items():
                # a module's own split mode beats the default one, parallel part included
                if value in SPLIT_MODES and key not in modules:
                    modules[key] = "none"
    split_out = Assignment(_SPLIT_LEFT.get(split.default, split.default),
                           {k: _SPLIT_LEFT.get(v, v) for k, v in split.modules.items()
                            if _SPLIT_LEFT.get(v, v) is not None})
    parallel_out = Assignment(default, modules)
    for comp in COMPONENTS:
        if parallel_out.for_component(comp) == "pipeline" and \
                split_out.for_component(comp) == "row":
            raise PlacementError(f"{comp}: split_mode row and parallel pipeline both set; a "
                                 f"pipeline runs a layer split's stages and a row split has "
                                 f"none: use split_mode layer (or pipeline) or drop parallel "
                                 f"pipeline")
    return split_out, parallel_out


def _parse_budget_value(raw: str) -> int:
    return parse_bytes(raw, "max_vram value")


def parse_budgets(text) -> Assignment:
    """`6`, `-1`, `cuda0=6,vulkan0=2`, `512MiB`, `all=4,cuda1=0.5`: keys stay raw device
    tokens (resolved later against the inventory); values are signed bytes, 0 = off."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        text = repr(text)
    default, devices = None, {}
    if text is None or not str(text).strip():
        return Assignment(None, {})
    if not isinstance(text, str):
        raise PlacementError(f"max_vram must be a string or a number, got "
                             f"{type(text).__name__}")
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise PlacementError(f"empty entry in max_vram {text.strip()!r}; expected "
                                 f"GiB or DEVICE=GiB separated by commas")
        key, eq, value = item.partition("=")
        if not eq:
            default = _parse_budget_value(item)
            continue
        key = key.strip()
        if not key:
            raise PlacementError(f"empty key in max_vram entry {item!r}; expected DEVICE=GiB")
        if "=" in value:
            raise PlacementError(f"invalid max_vram assignment {item!r}; expected DEVICE=GiB")
        if key.lower() in DEFAULT_KEYS:
            default = _parse_budget_value(value)
        elif is_module_name(key):
            # stable-diffusion.cpp budgets devices too; say so rather than "not found"
            raise PlacementError(f"max_vram keys are devices, not modules: {key!r} is the "
                                 f"module {canonical_component(key)}; budget the device it "
                                 f"runs on, e.g. cuda0=6 (or all=6)")
        else:
            devices[_device_token(key, "max_vram")] = _parse_budget_value(value)
    return Assignment(default, devices)


def _flag(value, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        return value.strip().lower() in ("true", "1", "yes", "on")
    raise PlacementError(f"{name} must be true or false, got {value!r}")


def _text(value, name: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PlacementError(f"{name} must be a string, got {type(value).__name__}")
    return value


class PlacementSpec:
    """What a user asked for, validated on construction (raises PlacementError)."""

    FIELDS = ("backend", "params_backend", "max_vram", "split_mode", "stream_layers",
              "auto_fit", "offload_to_cpu", "clip_on_cpu", "vae_on_cpu", "control_net_cpu",
              "offload_mode", "lora_mode", "parallel")

    def __init__(self, backend: str = "", params_backend: str = "", max_vram="",
                 split_mode: str = "", stream_layers: bool = False, auto_fit: bool = False,
                 offload_to_cpu: bool = False, clip_on_cpu: bool = False,
                 vae_on_cpu: bool = False, control_net_cpu: bool = False,
                 offload_mode: str = "auto", lora_mode: str = "auto", parallel: str = ""):
        self.backend = _text(backend, "backend")
        self.params_backend = _text(params_backend, "params_backend")
        self.max_vram = max_vram if isinstance(max_vram, (int, float)) and \
            not isinstance(max_vram, bool) else _text(max_vram, "max_vram")
        self.split_mode = _text(split_mode, "split_mode")
        self.parallel = _text(parallel, "parallel")
        self.stream_layers = _flag(stream_layers, "stream_layers")
        self.auto_fit = _flag(auto_fit, "auto_fit")
        self.offload_to_cpu = _flag(offload_to_cpu, "offload_to_cpu")
        self.clip_on_cpu = _flag(clip_on_cpu, "clip_on_cpu")
        self.vae_on_cpu = _flag(vae_on_cpu, "vae_on_cpu")
        self.control_net_cpu = _flag(control_net_cpu, "control_net_cpu")
        mode = _text(offload_mode, "offload_mode").strip().lower() or "auto"
        if mode not in OFFLOAD_MODES:
            raise PlacementError(f"invalid offload_mode {offload_mode!r}; expected one of "
                                 f"{', '.join(OFFLOAD_MODES)}")
        self.offload_mode = mode
        lora = _text(lora_mode, "lora_mode").strip().lower() or "auto"
        if lora not in LORA_MODES:
            raise PlacementError(f"invalid lora_mode {lora_mode!r}; expected one of "
                                 f"{', '.join(LORA_MODES)}")
        self.lora_mode = lora

        # The compatibility flags prepend entries, so explicit entries still win.
        runtime_prefix = [(comp, "cpu") for comp, on in
                          (("te", self.clip_on_cpu), ("vae", self.vae_on_cpu),
                           ("controlnet", self.control_net_cpu)) if on]
        params_prefix = [(None, "cpu")] if self.offload_to_cpu else []
        self.runtime = _parse(self.backend, "backend", parse_runtime_value, runtime_prefix)
        self.params = _parse(self.params_backend, "params backend", parse_params_value,
                             params_prefix)
        self.split, self.parallelism = _parallel_from_split(
            _parse(self.split_mode, "split mode", parse_split_value),
            _parse(self.parallel, "parallel", parse_parallel_value))
        self.budgets = parse_budgets(self.max_vram)

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.FIELDS}

    @classmethod
    def from_dict(cls, data: dict) -> "PlacementSpec":
        if not isinstance(data, dict):
            raise PlacementError("placement spec must be an object of fields")
        unknown = set(data) - set(cls.FIELDS)
        if unknown:
            raise PlacementError(f"unknown placement field(s) {', '.join(sorted(unknown))}; "
                                 f"fields are: {', '.join(cls.FIELDS)}")
        return cls(**data)

    def __eq__(self, other):
        return isinstance(other, PlacementSpec) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        set_fields = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()
                               if v not in ("", False, "auto"))
        return f"PlacementSpec({set_fields})"


__all__ = ["PlacementSpec", "Assignment", "SPLIT_MODES", "PARALLEL_MODES", "OFFLOAD_MODES", "LORA_MODES", "COMPONENTS",
           "BYTES_ACCEPTED"]

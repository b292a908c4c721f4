"""How a worker builds the module whose blocks it runs, without any weights sent: a class
and its config (diffusers models: `from_config`) or an importable factory with JSON
kwargs, built on the meta device; the worker then fills only its range from its file.
Imports are limited to allowed module prefixes (diffusers and this pack by default).

Descriptor (JSON): {"target": "pkg.mod:Class", "config": {...}} or {"target":
"pkg.mod:factory", "kwargs": {...}} and optionally "file_arg": NAME, the keyword under
which the factory is given the worker's own path of the range's file (a factory that
reads the file's header, e.g. ComfyUI's detection: runtime/comfy/worker/remote_model.py). A main
asks for it with builder=(target, kwargs, {"file_arg": NAME}).

A tensor the built module holds as a subclass of torch.Tensor (ComfyUI-GGUF's GGMLTensor
on the meta device) keeps its class and attributes when set_tensor fills it."""
import importlib
import json
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from ...placement.errors import PlacementError

PACKAGE = __name__.split(".")[0]          # this pack, under whatever folder name
DEFAULT_ALLOWED = ("diffusers.", PACKAGE + ".")


def _json_clean(value):
    return json.loads(json.dumps(value, default=lambda v: list(v) if isinstance(v, tuple)
                                 else str(v)))


def _factory_desc(builder) -> dict:
    """(target, kwargs) or (target, kwargs, {"file_arg": NAME}) as a descriptor."""
    parts = tuple(builder) if isinstance(builder, (tuple, list)) else ()
    target, kwargs, extra = (parts + ({},))[:3] if len(parts) in (2, 3) else (None, None, None)
    file_arg = extra.get("file_arg") if isinstance(extra, dict) else None
    if not isinstance(target, str) or ":" not in target or not isinstance(kwargs, dict) or \
            not isinstance(extra, dict) or set(extra) - {"file_arg"} or \
            (file_arg is not None and not (isinstance(file_arg, str) and
                                           file_arg.isidentifier() and file_arg not in kwargs)):
        raise PlacementError(f"invalid builder {builder!r}; expected ('package.module:factory', "
                             f"{{json kwargs}}), optionally with {{'file_arg': NAME}} third (a "
                             f"keyword not among the kwargs)")
    desc = {"target": target, "kwargs": _json_clean(kwargs)}
    if file_arg is not None:
        desc["file_arg"] = file_arg
    return desc


def describe_module(module: nn.Module, builder: Optional[Tuple[str, dict]] = None) -> dict:
    """What the worker needs to build `module`'s structure."""
    if builder is not None:
        return _factory_desc(builder)
    cls = type(module)
    config = getattr(module, "config", None)
    if config is not None and hasattr(cls, "from_config"):
        clean = {k: v for k, v in dict(config).items() if not k.startswith("_")}
        return {"target": f"{cls.__module__}:{cls.__qualname__}",
                "config": _json_clean(clean)}
    raise PlacementError(f"a worker cannot build a {cls.__name__} by itself; pass "
                         f"builder=('package.module:factory', {{json kwargs}}) or use a "
                         f"diffusers model (built from its config)")


def _import(target: str, allowed: Sequence[str]):
    mod_name, _, attr = target.partition(":")
    if not any((mod_name + ".").startswith(p) for p in allowed):
        raise PlacementError(f"builder {target!r} is not allowed on this worker; allowed "
                             f"module prefixes: {', '.join(allowed)} (add more with "
                             f"--allow-import)")
    try:
        obj = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        missing = getattr(exc, "name", None) or ""
        if missing == "comfy" or missing.startswith("comfy."):   # ComfyUI's own models
            raise PlacementError(f"builder {target!r} needs ComfyUI on this worker; start "
                                 f"it with --comfyui PATH (a ComfyUI folder)") from None
        raise PlacementError(f"builder {target!r} cannot be imported on this worker: "
                             f"{exc}") from None
    return obj


def build_on_meta(desc: dict, allowed: Sequence[str], file: Optional[str] = None) -> nn.Module:
    """`file`: the worker's path of the range's file, given as desc["file_arg"] asks."""
    target = _import(str(desc.get("target", "")), allowed)
    kwargs = dict(desc.get("kwargs", {}))
    file_arg = desc.get("file_arg")
    if file_arg is not None:
        if not isinstance(file_arg, str) or not file_arg.isidentifier() or file_arg in kwargs:
            raise PlacementError(f"builder file_arg {file_arg!r} must be a keyword name that "
                                 f"is not among its kwargs")
        if file is None:
            raise PlacementError(f"builder {desc.get('target')!r} wants the range's file "
                                 f"and none was resolved")
        kwargs[file_arg] = file
    try:
        with torch.device("meta"):
            if "config" in desc:
                module = target.from_config(desc["config"])
            else:
                module = target(**kwargs)
    except PlacementError:
        raise
    except Exception as exc:             # a main newer than this worker, a broken factory
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise PlacementError(f"builder {desc.get('target')!r} failed on this worker: "
                             f"{type(exc).__name__}: {first}") from None
    if not isinstance(module, nn.Module):
        raise PlacementError(f"builder {desc.get('target')!r} made a "
                             f"{type(module).__name__}, not a torch module")
    return module.eval()


def block_tensor_names(block_name: str, block: nn.Module) -> Dict[str, torch.Tensor]:
    """Qualified name -> tensor for every parameter and buffer of a block (ties kept)."""
    out = {}
    for name, t in list(block.named_parameters(remove_duplicate=False)) + \
            list(block.named_buffers(remove_duplicate=False)):
        out[f"{block_name}.{name}"] = t
    return out


def owner_of(root: nn.Module, qualified: str) -> Tuple[nn.Module, str]:
    path, _, leaf = qualified.rpartition(".")
    return root.get_submodule(path), leaf


def _like(value: torch.Tensor, like: Optional[torch.Tensor]) -> Tuple[torch.Tensor, dict]:
    """`value` as the class of `like` where that is a tensor subclass, and the attributes
    to give it (ComfyUI-GGUF's type and torch shape live on the tensor)."""
    if like is None or type(like) in (torch.Tensor, nn.Parameter):
        return value, {}
    attrs = {k: (list(v) if isinstance(v, list) else v) for k, v in vars(like).items()
             if k != "_is_param"}
    return value.as_subclass(type(like)), attrs


def set_tensor(root: nn.Module, qualified: str, value: torch.Tensor,
               like: Optional[torch.Tensor] = None) -> None:
    """Put `value` where `qualified` is; `like`: the tensor it replaces (its class kept)."""
    mod, leaf = owner_of(root, qualified)
    value, attrs = _like(value, like)
    if leaf in mod._parameters:
        value = nn.Parameter(value, requires_grad=False)
    elif leaf not in mod._buffers:
        raise PlacementError(f"{qualified!r} is neither a parameter nor a buffer")
    for k, v in attrs.items():
        setattr(value, k, v)
    (mod._parameters if leaf in mod._parameters else mod._buffers)[leaf] = value

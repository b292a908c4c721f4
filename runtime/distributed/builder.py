"""How a worker builds the module whose blocks it runs, without any weights sent: a class
and its config (diffusers models: `from_config`) or an importable factory with JSON
kwargs, built on the meta device; the worker then fills only its range from its file.
Imports are limited to allowed module prefixes (diffusers and this pack by default)."""
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


def describe_module(module: nn.Module, builder: Optional[Tuple[str, dict]] = None) -> dict:
    """What the worker needs to build `module`'s structure."""
    if builder is not None:
        target, kwargs = builder
        if not isinstance(target, str) or ":" not in target or not isinstance(kwargs, dict):
            raise PlacementError(f"invalid builder {builder!r}; expected "
                                 f"('package.module:factory', {{json kwargs}})")
        return {"target": target, "kwargs": _json_clean(kwargs)}
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
        raise PlacementError(f"builder {target!r} cannot be imported on this worker: "
                             f"{exc}") from None
    return obj


def build_on_meta(desc: dict, allowed: Sequence[str]) -> nn.Module:
    target = _import(str(desc.get("target", "")), allowed)
    with torch.device("meta"):
        if "config" in desc:
            module = target.from_config(desc["config"])
        else:
            module = target(**desc.get("kwargs", {}))
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


def set_tensor(root: nn.Module, qualified: str, value: torch.Tensor) -> None:
    mod, leaf = owner_of(root, qualified)
    if leaf in mod._parameters:
        mod._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    elif leaf in mod._buffers:
        mod._buffers[leaf] = value
    else:
        raise PlacementError(f"{qualified!r} is neither a parameter nor a buffer")

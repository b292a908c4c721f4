"""ComfyUI's own diffusion models on a worker (`worker --comfyui PATH`): the worker builds
the model from its copy of the file with ComfyUI's detection, on the meta device, from the
file's header only (shapes and dtypes: no weight is read to build it), then reads its
range. Any family ComfyUI loads, from a diffusion-model file, a checkpoint or a GGUF file.

Main side: `remote_options(model, weights_file)` gives place()'s options for a MODEL's
diffusion model (remote_range takes "weights_file" as its file argument):
- builder: build_diffusion with what the worker cannot read from the file but must
  match: the detected config class and unet_config (checked there), the weight dtype,
  manual cast dtype and the operations class the main's layers come from (named, not
  picked again: pick_operations looks at the machine's hardware);
- remote_file: the file's path under ComfyUI's models folders ("diffusion_models/x");
- key_map: module tensor name -> file key (checkpoint prefixes, GGUF);
- weights_file: the file itself.

Worker side: `build_diffusion(file, ...)` does what comfy.sd's loaders do (prefix, detection,
dtypes, get_model), with meta tensors for the state dict. A GGUF file is built as
ComfyUI-GGUF builds it (its GGMLOps layers and GGMLTensors, from the worker's ComfyUI
custom_nodes): the range dequantizes on the fly with ComfyUI-GGUF's own code, so it
computes what the main's ComfyUI-GGUF layers compute, bit for bit on the same kind of
device.

Imported on the worker only when a builder names it (it imports comfy).
"""
import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from typing import List, Optional

import torch
from torch import nn

from ....placement.errors import PlacementError

# the name the worker runs this pack under (`python -m comfyui_placement worker`), whatever
# folder name ComfyUI loaded it from on the main
TARGET = "comfyui_placement.runtime.comfy.worker.remote_model:build_diffusion"
PREFER = ("diffusion_models", "checkpoints")      # folder kinds a worker resolves by name
GGUF_PREFIX = "model.diffusion_model."            # ComfyUI-GGUF strips it when present
_GGUF_PACKAGE = "comfyui_placement_worker_gguf"   # ComfyUI-GGUF's ops, loaded alone
_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
              "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
              "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
              "F8_E4M3": getattr(torch, "float8_e4m3fn", torch.uint8),
              "F8_E5M2": getattr(torch, "float8_e5m2", torch.uint8)}


def _clean(value):
    return json.loads(json.dumps(value, default=lambda v: list(v) if isinstance(v, tuple)
                                 else str(v)))


def _dtype_name(dtype) -> Optional[str]:
    return None if dtype is None else str(dtype).replace("torch.", "")


def _dtype(name):
    if name is None or name == "target":
        return name
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise PlacementError(f"unknown dtype {name!r} from the main process")
    return dtype


# -- main side -----------------------------------------------------------------------------
def remote_options(model, weights_file: str, models_root: Optional[str] = None) -> dict:
    """place() options that run ranges of `model`'s (a ComfyUI MODEL) diffusion model on a
    worker; `models_root`: the folder remote_file is relative to (default: ComfyUI's
    model folders, folder_paths)."""
    from ..files.model_file import file_key_map
    base = getattr(model, "model", model)
    dm = getattr(base, "diffusion_model", None)
    config = getattr(base, "model_config", None)
    if dm is None or config is None:
        raise PlacementError(f"remote_options takes a ComfyUI MODEL (a ModelPatcher of a "
                             f"diffusion model), not {type(model).__name__}")
    kwargs = {"config": type(config).__name__, "unet_config": _clean(config.unet_config),
              "dtype": _dtype_name(config.unet_config.get("dtype")),
              "manual_cast_dtype": _dtype_name(base.manual_cast_dtype),
              "operations": operations_of(dm)}
    out = {"builder": (TARGET, kwargs, {"file_arg": "file"}),
           "remote_file": models_relative(weights_file, models_root),
           "key_map": file_key_map(weights_file, dm), "weights_file": weights_file}
    units = layer_blocks(dm)
    if units is not None:     # a UNet: a block's range runs as the layers its loop calls
        from ...blocks.find import find_blocks
        out["units"] = {n: [u for u in units if u == n or u.startswith(n + ".")]
                        for n, _ in find_blocks(dm)}
    return out


def operations_of(dm: nn.Module):
    """The comfy.ops class the module's layers come from, by name ("disable_weight_init",
    "manual_cast", "fp8_ops", ...), or {"gguf": {...}} for ComfyUI-GGUF's GGMLOps with
    the dequant/patch dtypes its loader set on the Linear class."""
    import comfy.ops
    # a plain torch Linear the model code makes itself is built the same on the worker
    lin = next((m for m in dm.modules() if isinstance(m, nn.Linear) and
                hasattr(m, "comfy_cast_weights")), None)
    if lin is None:
        raise PlacementError(f"{type(dm).__name__} has no ComfyUI Linear layer to tell its "
                             f"operations by; a worker cannot rebuild it")
    cls = type(lin)
    if hasattr(lin, "is_ggml_quantized"):              # ComfyUI-GGUF's layers
        return {"gguf": {"dequant_dtype": _dtype_name(getattr(cls, "dequant_dtype", None)),
                         "patch_dtype": _dtype_name(getattr(cls, "patch_dtype", None))}}
    owner = cls.__qualname__.rpartition(".")[0]
    ns = getattr(comfy.ops, owner, None) if cls.__module__ == "comfy.ops" else None
    if not isinstance(ns, type) or getattr(ns, "Linear", None) is not cls:
        raise PlacementError(f"{type(dm).__name__}'s layers are {cls.__module__}."
                             f"{cls.__qualname__}; a worker rebuilds layers of comfy.ops "
                             f"(disable_weight_init, manual_cast, fp8_ops) and ComfyUI-GGUF "
                             f"only")
    return owner


def layer_blocks(dm: nn.Module) -> Optional[List[str]]:
    """Block names for remote_range(block_names=...): None where the blocks' own forwards
    run (DiTs); for ComfyUI's UNet, whose loop calls the layers of each input, middle and
    output block itself (forward_timestep_embed), never the block's forward, those layers
    (a range over the blocks would run their released layers here)."""
    from comfy.ldm.modules.diffusionmodules.openaimodel import TimestepEmbedSequential
    from ...blocks.find import find_blocks
    found = find_blocks(dm)
    if not any(isinstance(b, TimestepEmbedSequential) for _, b in found):
        return None
    names: List[str] = []
    for name, block in found:
        if isinstance(block, TimestepEmbedSequential):
            names += [f"{name}.{child}" for child, _ in block.named_children()]
        else:
            names.append(name)
    return names


def models_relative(path: str, models_root: Optional[str] = None) -> str:
    """`path` as a worker's models folder names it: relative to models_root, else to
    ComfyUI's models folder, else the folder kind and the path below a root of that kind
    (extra_model_paths.yaml), else the file's bare name."""
    real = os.path.realpath(path)

    def below(root):
        root = os.path.realpath(root)
        if os.path.commonpath([root, real]) == root and root != real:
            return os.path.relpath(real, root).replace(os.sep, "/")
        return None
    if models_root is not None:
        rel = below(models_root)
        if rel is None:
            raise PlacementError(f"{path} is not inside models_root {models_root}")
        return rel
    try:
        import folder_paths
    except ImportError:
        return os.path.basename(real)
    rel = below(folder_paths.models_dir)
    if rel is not None:
        return rel
    kinds = list(PREFER) + [k for k in folder_paths.folder_names_and_paths if k not in PREFER]
    for kind in kinds:
        try:
            roots = folder_paths.get_folder_paths(kind)
        except Exception:                 # a folder kind some custom node broke
            continue
        for root in roots:
            rel = below(root)
            if rel is not None:
                return f"{'diffusion_models' if kind == 'unet_gguf' else kind}/{rel}"
    return os.path.basename(real)


# -- worker side ---------------------------------------------------------------------------
def build_diffusion(file: str, config: str, unet_config: dict, dtype: Optional[str],
                    manual_cast_dtype: Optional[str], operations) -> nn.Module:
    """The diffusion model of `file` as the main's ComfyUI built it, on the meta device."""
    import comfy.model_detection as detection
    import comfy.utils
    name = os.path.basename(file)
    gguf = isinstance(operations, dict) and "gguf" in operations
    ops = _gguf_operations(operations["gguf"]) if gguf else _comfy_operations(operations)
    sd, metadata = meta_state_dict(file)
    if not gguf:                                    # as comfy.sd's loaders
        sd, metadata = comfy.utils.convert_old_quants(sd, "", metadata=metadata)
    prefix = detection.unet_prefix_from_state_dict(sd)
    stripped = comfy.utils.state_dict_prefix_replace(sd, {prefix: ""}, filter_keys=True)
    if stripped:
        sd = stripped
    model_config = detection.model_config_from_unet(sd, "", metadata=metadata)
    if model_config is None:
        raise PlacementError(f"{name}: ComfyUI's detection on this worker does not recognise "
                             f"its diffusion model; the main process's ComfyUI did "
                             f"({config}): update this worker's ComfyUI")
    if type(model_config).__name__ != config:
        raise PlacementError(f"{name}: detected as {type(model_config).__name__} here and "
                             f"as {config} on the main process; use one ComfyUI version")
    model_config.set_inference_dtype(_dtype(dtype), _dtype(manual_cast_dtype))
    model_config.manual_cast_dtype = _dtype(manual_cast_dtype)   # never this machine's pick
    model_config.custom_operations = ops
    base = model_config.get_model(sd, "", device=torch.device("meta"))
    here = _clean(model_config.unet_config)
    if here != unet_config:
        key = next(k for k in sorted(set(here) | set(unet_config))
                   if here.get(k) != unet_config.get(k))
        raise PlacementError(f"{name}: the model built here has {key}={here.get(key)!r}, the "
                             f"main process's {unet_config.get(key)!r}; run one ComfyUI "
                             f"version on both, with the builder remote_options() gives")
    base.load_model_weights(sd, "")      # meta into meta; GGUF layers take their GGMLTensors
    return base.diffusion_model


def meta_state_dict(file: str):
    """(key -> meta tensor, safetensors metadata or None) from the file's header alone;
    a GGUF file's tensors as ComfyUI-GGUF's loader makes them (prefix stripped)."""
    if file.lower().endswith(".gguf"):
        return _gguf_meta_state_dict(file), None
    from ....placement.metadata.safetensors_header import read_header
    header = read_header(file)
    sd = {e.name: torch.empty(tuple(e.shape), dtype=_ST_DTYPES.get(e.dtype, torch.uint8),
                              device="meta") for e in header.entries}
    return sd, (dict(header.metadata) or None)


def _gguf_meta_state_dict(file: str) -> dict:
    import gguf
    from ...distributed.ggufrange import read_table
    ops = _comfyui_gguf()
    table, _ = read_table(file)
    strip = any(k.startswith(GGUF_PREFIX) for k in table)
    sd = {}
    for key, t in table.items():
        if strip and not key.startswith(GGUF_PREFIX):
            continue
        meta = torch.empty(t.storage, dtype=t.dtype, device="meta")
        if not t.converted:          # ComfyUI-GGUF dequantizes BF16 vectors to plain float32
            meta = meta.as_subclass(ops.GGMLTensor)
            meta.tensor_type = gguf.GGMLQuantizationType[t.qtype]
            meta.tensor_shape = torch.Size(t.shape)
            meta.patches = []
        sd[key[len(GGUF_PREFIX):] if strip else key] = meta
    return sd


def _comfy_operations(name):
    import comfy.ops
    ns = getattr(comfy.ops, str(name), None)
    if not isinstance(ns, type) or not hasattr(ns, "Linear"):
        raise PlacementError(f"the main process's layers are comfy.ops.{name}, which this "
                             f"worker's ComfyUI lacks; use one ComfyUI version")
    return ns


def _gguf_operations(spec: dict):
    """ComfyUI-GGUF's GGMLOps with the main's dequant/patch dtypes (its loader sets them on
    the shared Linear class; a subclass here keeps them to this model)."""
    base = _comfyui_gguf().GGMLOps

    class Linear(base.Linear):
        dequant_dtype = _dtype(spec.get("dequant_dtype"))
        patch_dtype = _dtype(spec.get("patch_dtype"))
    return type("GGMLOps", (base,), {"Linear": Linear})


def _comfyui_gguf():
    """ComfyUI-GGUF's ops module from this ComfyUI's custom_nodes, loaded alone (its ops.py
    and dequant.py, not its nodes)."""
    if _GGUF_PACKAGE + ".ops" in sys.modules:
        return sys.modules[_GGUF_PACKAGE + ".ops"]
    import comfy.model_detection                  # comfy itself has no __init__ file
    here = os.path.dirname(os.path.abspath(comfy.model_detection.__file__))
    roots = [os.path.join(os.path.dirname(here), "custom_nodes")]
    try:
        import folder_paths
        roots = list(folder_paths.get_folder_paths("custom_nodes")) + roots
    except Exception:                   # no folder_paths, or no custom_nodes kind
        pass
    for root in roots:
        names = sorted(os.listdir(root)) if os.path.isdir(root) else []
        for entry in names:
            where = os.path.join(root, entry)
            if entry.lower().replace("_", "-") == "comfyui-gguf" and \
                    os.path.isfile(os.path.join(where, "ops.py")):
                spec = importlib.machinery.ModuleSpec(_GGUF_PACKAGE, None, is_package=True)
                package = importlib.util.module_from_spec(spec)
                package.__path__ = [where]
                sys.modules[_GGUF_PACKAGE] = package
                return importlib.import_module(_GGUF_PACKAGE + ".ops")
    raise PlacementError("this GGUF model runs on ComfyUI-GGUF's layers on the main process; "
                         "install ComfyUI-GGUF in this worker's ComfyUI (custom_nodes/"
                         "ComfyUI-GGUF)")

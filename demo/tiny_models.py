"""`python -m comfyui_placement tiny-models --comfyui PATH`: a try-out with no downloads.

Writes three tiny models with random weights into ComfyUI's model folders, built with
ComfyUI's own classes so that its loaders detect them as the real architectures:

- `diffusion_models/placement-tiny-sd3.safetensors`: an MMDiT (SD3 / SD3.5's diffusion
  transformer), 4 joint blocks of width 256 (ComfyUI reads the depth and width from the
  file), taking SD3's 4096-wide text context and 2048-wide pooled vector;
- `text_encoders/placement-tiny-clip-l.safetensors`: CLIP-L at its real size (ComfyUI
  hard-codes CLIP-L's widths: no smaller file loads as CLIP-L); loaded by CLIPLoader with
  type `sd3`, the smallest text encoder set SD3 accepts;
- `vae/placement-tiny-sd3-vae.safetensors`: SD3's 16-channel VAE with a narrow decoder
  (ComfyUI reads the decoder's width from the file; the encoder's is fixed).

The weights are random (seeded): the image is noise, the models exist so that the
placement nodes have something real to plan, place, stream and measure. Every file says
so in its metadata, and the names start with `placement-tiny-` so nobody mistakes them
for real models. `example_workflows/tiny_try_out.json` uses them.

The command runs in ComfyUI's Python (it needs torch and ComfyUI's `comfy` package:
`--comfyui PATH` puts PATH on sys.path). A file already there that this command wrote is
kept; any other file of the same name is refused, and nothing is written then.
"""
import json
import os
import sys
import time
from typing import Dict, List

from ..placement.errors import PlacementError
from ..placement.units import format_bytes

MARKER = "comfyui_placement_tiny"     # metadata key every file carries
FORMAT = 1                            # bump when what is written changes
SEED = 20240801

# name -> folder under models/, file name, what it is (the loader and its settings)
FILES = {
    "diffusion": {"folder": "diffusion_models", "file": "placement-tiny-sd3.safetensors",
                  "what": "MMDiT (SD3 architecture), 4 joint blocks of width 256, random",
                  "loader": "UNETLoader"},
    "te": {"folder": "text_encoders", "file": "placement-tiny-clip-l.safetensors",
           "what": "CLIP-L text encoder (full size: ComfyUI fixes its widths), random",
           "loader": "CLIPLoader, type sd3"},
    "vae": {"folder": "vae", "file": "placement-tiny-sd3-vae.safetensors",
            "what": "SD3 VAE (16 latent channels, decoder width 32), random",
            "loader": "VAELoader"},
}

MMDIT_DEPTH = 4                       # width 64 x depth, 4 heads (SD3's rule)
MMDIT_CONFIG = {
    "in_channels": 16, "patch_size": 2, "out_channels": 16, "depth": MMDIT_DEPTH,
    "input_size": None, "adm_in_channels": 2048,
    "context_embedder_config": {"target": "torch.nn.Linear",
                                "params": {"in_features": 4096, "out_features": 64 * MMDIT_DEPTH}},
    "num_patches": 32 * 32, "pos_embed_max_size": 32,          # latents up to 64x64 (512 px)
    "qk_norm": "rms", "pos_embed_scaling_factor": None, "x_block_self_attn_layers": [],
}
VAE_ENCODER = {"double_z": True, "z_channels": 16, "resolution": 256, "in_channels": 3,
               "out_ch": 3, "ch": 128, "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2,
               "attn_resolutions": [], "dropout": 0.0}
VAE_DECODER_CH = 32


def comfyui_root(path: str) -> str:
    """The ComfyUI folder `path` names, or a one-line PlacementError."""
    root = os.path.abspath(os.path.expanduser(str(path or "")))
    if not os.path.isdir(root):
        raise PlacementError(f"--comfyui {path!r} is not a folder; give ComfyUI's folder "
                             f"(the one holding main.py and comfy/)")
    if not (os.path.isfile(os.path.join(root, "comfy", "sd.py"))
            and os.path.isfile(os.path.join(root, "folder_paths.py"))):
        raise PlacementError(f"--comfyui {path!r} is not a ComfyUI folder (no comfy/sd.py "
                             f"and folder_paths.py in it); give the folder holding main.py")
    return root


def _import_comfy(root: str):
    """ComfyUI's modules, from `root`, without starting CUDA (ComfyUI parses `--cpu`
    while it is imported here) and without touching this command's own arguments."""
    if root not in sys.path:
        sys.path.insert(0, root)
    argv = sys.argv
    try:
        if "comfy.model_management" not in sys.modules:
            import comfy.options
            comfy.options.enable_args_parsing()
            sys.argv = [argv[0], "--cpu"]
        import torch  # noqa: F401
        import safetensors.torch  # noqa: F401
        import comfy.model_detection  # noqa: F401
        import comfy.supported_models  # noqa: F401
        import comfy.clip_model  # noqa: F401
        import comfy.ops  # noqa: F401
        import comfy.ldm.modules.diffusionmodules.model  # noqa: F401
    except ImportError as exc:
        raise PlacementError(f"cannot import ComfyUI from {root} with this Python "
                             f"({sys.executable}): {exc}; run the command with ComfyUI's "
                             f"own Python") from None
    finally:
        sys.argv = argv


# -- the state dicts (shapes from ComfyUI's classes on the meta device, values seeded) ---
def _shapes_mmdit() -> Dict[str, tuple]:
    import torch
    import comfy.model_detection
    cfg = comfy.model_detection.model_config_from_unet_config(dict(MMDIT_CONFIG))
    if cfg is None or type(cfg).__name__ != "SD3":
        raise PlacementError("this ComfyUI does not detect the tiny MMDiT as SD3 "
                             f"(it matched {type(cfg).__name__ if cfg else 'nothing'})")
    cfg.set_inference_dtype(torch.float32, None)
    model = cfg.get_model({}, "", device=torch.device("meta"))
    return {k: tuple(v.shape) for k, v in model.diffusion_model.state_dict().items()}


def _shapes_clip_l(root: str) -> Dict[str, tuple]:
    import torch
    import comfy.clip_model
    import comfy.ops
    with open(os.path.join(root, "comfy", "sd1_clip_config.json")) as fh:
        config = json.load(fh)
    model = comfy.clip_model.CLIPTextModel(config, torch.float32, torch.device("meta"),
                                           comfy.ops.manual_cast)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _shapes_vae() -> Dict[str, tuple]:
    import torch
    from comfy.ldm.modules.diffusionmodules.model import Decoder, Encoder
    with torch.device("meta"):
        enc = Encoder(**VAE_ENCODER)
        dec = Decoder(**dict(VAE_ENCODER, ch=VAE_DECODER_CH))
    out = {f"encoder.{k}": tuple(v.shape) for k, v in enc.state_dict().items()}
    out.update({f"decoder.{k}": tuple(v.shape) for k, v in dec.state_dict().items()})
    return out


def _is_norm(key: str) -> bool:
    low = key.lower()
    return any(w in low for w in ("norm", "ln_", ".ln", "layer_norm", "gamma"))


def _random(shapes: Dict[str, tuple], seed: int, dtype) -> dict:
    """Seeded values: weights ~ N(0, 1/fan_in), norm scales 1, biases 0."""
    import math
    import torch
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, shape in sorted(shapes.items()):
        if len(shape) <= 1 and key.endswith(("weight", "scale", "gamma")) and _is_norm(key):
            value = torch.ones(shape)
        elif len(shape) <= 1 and (key.endswith("bias") or _is_norm(key)):
            value = torch.zeros(shape)
        elif len(shape) == 0:
            value = torch.zeros(shape)
        else:
            fan_in = max(1, math.prod(shape[1:])) if len(shape) > 1 else shape[0]
            value = torch.randn(shape, generator=g) / math.sqrt(fan_in)
        out[key] = value.to(dtype).contiguous()
    return out


def _state_dict(component: str, root: str) -> dict:
    import torch
    if component == "diffusion":
        sd = _random(_shapes_mmdit(), SEED, torch.float16)
        # SD3's logit-free layers are fine random; the position table is a buffer ComfyUI
        # loads from the file: random too, small
        return sd
    if component == "te":
        return _random(_shapes_clip_l(root), SEED + 1, torch.float16)
    return _random(_shapes_vae(), SEED + 2, torch.bfloat16)


def _metadata(component: str) -> dict:
    spec = FILES[component]
    return {MARKER: json.dumps({"format": FORMAT, "component": component, "seed": SEED,
                                "file": spec["file"]}, sort_keys=True),
            "description": f"comfyui-placement tiny try-out model: {spec['what']}. "
                           f"Not a real model: its output is noise."}


def written_by_us(path: str, component: str) -> bool:
    """Whether `path` is the file this command writes for `component` (by its metadata)."""
    try:
        import safetensors
        with safetensors.safe_open(path, framework="pt") as fh:
            meta = fh.metadata() or {}
    except Exception:
        return False
    try:
        mine = json.loads(meta.get(MARKER, "null"))
    except ValueError:
        return False
    return mine == json.loads(_metadata(component)[MARKER])


def write_tiny_models(comfyui: str, models: str = None) -> List[dict]:
    """Writes the three files into `models` (default: ComfyUI's models/ folder); returns
    one {component, path, bytes, status: written | kept, seconds} per file. Refuses (a
    PlacementError, nothing written) when a file of the same name that this command did
    not write is there."""
    root = comfyui_root(comfyui)
    base = os.path.abspath(models) if models else os.path.join(root, "models")
    targets = {c: os.path.join(base, s["folder"], s["file"]) for c, s in FILES.items()}
    foreign = [p for c, p in targets.items() if os.path.lexists(p) and not written_by_us(p, c)]
    if foreign:
        raise PlacementError(f"{foreign[0]} exists and was not written by this command; "
                             f"nothing written (move it away to write the tiny models)")
    _import_comfy(root)
    import safetensors.torch
    out = []
    for component, path in targets.items():
        t0 = time.perf_counter()
        if os.path.exists(path):
            out.append({"component": component, "path": path, "bytes": os.path.getsize(path),
                        "status": "kept", "seconds": 0.0})
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        sd = _state_dict(component, root)
        tmp = path + ".part"
        try:
            safetensors.torch.save_file(sd, tmp, metadata=_metadata(component))
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        out.append({"component": component, "path": path, "bytes": os.path.getsize(path),
                    "status": "written", "seconds": time.perf_counter() - t0})
    return out


def add_parser(sub) -> None:
    p = sub.add_parser("tiny-models", help="write tiny random models of real architectures "
                       "(SD3's MMDiT, CLIP-L, SD3's VAE) into ComfyUI's model folders, for "
                       "example_workflows/tiny_try_out.json: a try-out with no downloads")
    p.add_argument("--comfyui", required=True, metavar="PATH",
                   help="ComfyUI's folder (run this command with ComfyUI's Python)")
    p.add_argument("--models", metavar="DIR", help="the models folder to write into "
                   "(default: PATH/models)")


def run(args) -> int:
    for f in write_tiny_models(args.comfyui, args.models):
        print(f"{f['status']}\t{format_bytes(f['bytes'])}\t{f['path']}")
    print("open example_workflows/tiny_try_out.json in ComfyUI (Templates > "
          "comfyui-placement > tiny_try_out) and run it")
    return 0

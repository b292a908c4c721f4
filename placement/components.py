"""The components and the names people use for them: seed 000's seven, and `detector`
(the ADetailer YOLO detector) from stable-diffusion.cpp's current docs/backend.md."""
from .errors import PlacementError

COMPONENTS = ("diffusion", "te", "clip_vision", "vae", "controlnet", "photomaker", "upscaler",
              "detector")

# Accepted names per component, already normalised (lower case, no '-' or '_').
ALIASES = {
    "diffusion": ("diffusion", "model", "unet", "dit"),
    "te": ("te", "clip", "text", "textencoder", "textencoders", "conditioner", "cond",
           "llm", "t5", "t5xxl"),
    "clip_vision": ("clipvision", "vision"),
    "vae": ("vae", "firststage", "autoencoder", "tae"),
    "controlnet": ("controlnet", "control"),
    "photomaker": ("photomaker", "photomakerid", "pmid", "photo"),
    "upscaler": ("upscaler", "esrgan", "hires"),
    "detector": ("detector", "adetailer", "yolo"),
}

_BY_ALIAS = {alias: comp for comp, names in ALIASES.items() for alias in names}

# The phase in which each component computes; components of different phases never
# run at the same time, so they can take turns on one device.
PHASES = {
    "te": "encode", "clip_vision": "encode", "photomaker": "encode",
    "diffusion": "sample", "controlnet": "sample",
    "vae": "decode", "upscaler": "upscale",
    # ADetailer detects on the decoded image, then VAE-encodes, samples and decodes each
    # crop: the detector and the VAE work in one stretch, so they share the decode phase
    "detector": "decode",
}


def normalise_key(name: str) -> str:
    return name.strip().lower().replace("-", "").replace("_", "")


def canonical_component(name: str) -> str:
    """'CLIP-Vision' -> 'clip_vision'; unknown names raise with the list of modules."""
    comp = _BY_ALIAS.get(normalise_key(name))
    if comp is None:
        raise PlacementError(
            f"unknown module {name.strip()!r}; modules are: {', '.join(COMPONENTS)} "
            f"(aliases: {', '.join(sorted(_BY_ALIAS))})")
    return comp


def is_module_name(name: str) -> bool:
    return normalise_key(name) in _BY_ALIAS

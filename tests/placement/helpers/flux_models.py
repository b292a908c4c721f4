"""The realistic Flux.1-dev pipeline of issue 10, as header-only files with the published
shapes (fp16; sparse, no weights): Flux.1-dev (22.17 GiB, 57 blocks), CLIP-L + T5-XXL
(9.10 GiB, 36 blocks), the AE (fp32, as published). Planned at 1024x1024 like the issue's commands."""
from comfyui_placement.placement import Inventory, PlacementSpec, plan

from . import tiny_files as tf


def write_flux_pipeline(directory):
    """{name: path} of the four files."""
    def write(name, layout):
        return str(tf.write_header_file(directory / name, layout))
    return {
        "flux": write("flux1-dev.safetensors", tf.flux(dtype="F16")),
        "t5": write("t5xxl_fp16.safetensors", tf.t5(hidden=4096, ffn=10240, depth=24,
                                                     vocab=32128, dtype="F16")),
        "clip_l": write("clip_l.safetensors", tf.clip_text(hidden=768, depth=12, vocab=49408)),
        "vae": write("ae.safetensors", tf.vae(ch=128, levels=4, dtype="F32")),
    }


def flux_components(files):
    return {"diffusion": files["flux"], "te": [files["clip_l"], files["t5"]],
            "vae": files["vae"]}


def plan_flux(files, inventory: str, **spec):
    """plan --auto-fit --simulate INVENTORY (plus spec fields) at 1024x1024."""
    spec.setdefault("auto_fit", True)
    return plan(PlacementSpec(**spec), Inventory.simulated(inventory), flux_components(files),
                resolution=(1024, 1024))


def generation_s(p) -> float:
    return p.extra["fit"]["predicted"]["generation_s"]

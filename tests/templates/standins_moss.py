"""MOSS-Image (image_moss_image_t2i, image_moss_image_base_t2i) for the official
templates (issue 31 item 3): no stand-in while ComfyUI has no such model.

A stand-in is the architecture ComfyUI's own detection finds; ComfyUI 0.29.0 has no
MOSS-Image (no detection branch, no model class, no text-encoder recipe), and its
CLIPLoader has no "moss_image" type, so validation refuses the templates' CLIPLoader
whatever files are there. build() says which of the two holds, read from the ComfyUI
it runs in, so that a ComfyUI that gains the type shows up as a missing builder.
"""
import builders

ARCHITECTURES = {"diffusion:moss_image"}


def build(work, arch, dest):
    import nodes
    types = nodes.CLIPLoader.INPUT_TYPES()["required"]["type"][0]
    if "moss_image" not in types:
        import comfyui_version
        raise builders.NoBuilder(
            f"ComfyUI {comfyui_version.__version__} has no MOSS-Image: no detection for "
            f"its diffusion model and CLIPLoader's type 'moss_image' is not one of its "
            f"{len(types)} types (validation refuses it: Value not in list)")
    raise builders.NoBuilder(f"no stand-in builder for {arch} yet: this ComfyUI's "
                             f"CLIPLoader has the 'moss_image' type "
                             f"(tests/templates/standins_moss.py)")

"""`worker --comfyui PATH`: ComfyUI's model code in a worker, so that it builds ComfyUI's
own models from their files (runtime/comfy/worker/remote_model.py). Imported only when the flag
is given (`worker --help` imports none of ComfyUI): PATH goes on sys.path first, then
comfy is imported with ComfyUI's default options, as --cpu on a machine without CUDA
(comfy.model_management refuses to import there otherwise)."""
import os
import shlex
import sys

from .placement.errors import PlacementError


def import_comfyui(path: str, comfy_args: str = "") -> tuple:
    """Import ComfyUI's model code from the folder `path`, under ComfyUI's own command
    line flags `comfy_args` (e.g. "--use-pytorch-cross-attention": the attention and
    precision the main ComfyUI runs with, so a range computes the same there and here);
    returns the builder module prefixes this makes usable on the worker."""
    root = os.path.realpath(path)
    if not os.path.isfile(os.path.join(root, "comfy", "model_detection.py")):
        raise PlacementError(f"--comfyui {path!r} is not a ComfyUI folder (it has no "
                             f"comfy/model_detection.py)")
    if root not in sys.path:
        sys.path.insert(0, root)
    flags = shlex.split(comfy_args or "")
    try:
        import torch
        import comfy.options
        if flags:                     # parsed by ComfyUI's own parser, as its main.py does
            sys.argv = [sys.argv[0], *flags]
            comfy.options.enable_args_parsing()
        try:
            import comfy.cli_args
        except SystemExit:            # argparse has printed what it refused
            raise PlacementError(f"--comfyui-args {comfy_args!r}: ComfyUI refused these "
                                 f"flags (its message is above); give flags of "
                                 f"`python main.py`, e.g. --use-pytorch-cross-attention") \
                from None
        if not torch.cuda.is_available():
            comfy.cli_args.args.cpu = True
        import comfy.model_management  # noqa: F401
        import comfy.model_detection  # noqa: F401
        import comfy.ops  # noqa: F401
    except Exception as exc:           # whatever a broken or foreign checkout raises
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise PlacementError(f"cannot import ComfyUI from {path}: {type(exc).__name__}: "
                             f"{first}") from None
    where = os.path.realpath(comfy.model_detection.__file__)    # comfy has no __init__
    if os.path.commonpath([root, where]) != root:
        raise PlacementError(f"--comfyui {path}: 'comfy' was already imported from "
                             f"{os.path.dirname(os.path.dirname(os.path.dirname(where)))}; "
                             f"start the worker from another folder")
    from .runtime.distributed.builder import PACKAGE
    return (PACKAGE + ".runtime.comfy.worker.remote_model.",)

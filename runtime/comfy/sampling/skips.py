"""ComfyUI's UNet under a layer split: its skip connections cross devices.

`UNetModel.forward` keeps each input block's output (`hs`) and concatenates it with an
output block's input (`torch.cat([h, hsp])`) in its own code, outside any block: with
the input blocks on one device and the output blocks on another, a GPU refuses that
cat. ComfyUI's `output_block_patch` (transformer_options["patches"], called as
`h, hsp = p(h, hsp, transformer_options)` just before the cat) is the supported point
to bring `hsp` to the device `h` is on; the caller's options are copied, not changed.
Text encoders keep block outputs in a list their own code joins (joins_follow below;
the layer split's own forward guard does the same for any module: runtime/blocks/crossings.py).
"""
from contextlib import nullcontext
from typing import Callable

from ...blocks.crossings import JoinsFollow      # noqa: F401  (rehearse_call's text encoders)


def skip_follow_patch(follow: Callable):
    def bring_skip(h, hsp, transformer_options):
        if hsp is None or h is None:
            return h, hsp
        return h, follow(hsp, h)
    bring_skip.placement = True         # marks the pack's patch (tests, repr)
    return bring_skip


def with_skip_follow(args, kwargs, follow: Callable):
    """APPLY_MODEL's (args, kwargs) with the skip patch added to transformer_options
    (BaseModel._apply_model's sixth argument or keyword)."""
    args = list(args)
    if "transformer_options" in kwargs:
        options = kwargs["transformer_options"]
    elif len(args) > 5:
        options = args[5]
    else:
        options = {}
    options = dict(options or {})
    patches = dict(options.get("patches") or {})
    patches["output_block_patch"] = list(patches.get("output_block_patch") or []) + \
        [skip_follow_patch(follow)]
    options["patches"] = patches
    if len(args) > 5:
        args[5] = options
    else:
        kwargs = {**kwargs, "transformer_options": options}
    return tuple(args), kwargs


def joins_follow(placed):
    """A layer-split call's own code that keeps block outputs in a list and joins them
    (ComfyUI's Llama2_ concatenates the hidden states of every layer it was asked for,
    SDXL's CLIP the outputs of CLIP-L and CLIP-G, each taken from a layer on its own
    device): a GPU refuses operands on two devices, so each is brought to the device of
    the list's first tensor (`placed.follow`, a hop like the UNet's skips). Other
    placements: nothing to bring."""
    if not placed.crosses_devices:
        return nullcontext()
    return JoinsFollow(placed.follow)

"""How ComfyUI's per-call inputs are cut into a batch's shares (batch parallel, the
pipelined split): `transformer_options` by meaning, not by shape: `sigmas` per item, the
per-chunk lists `cond_or_uncond` and `uuids` to the chunks a share's items come from;
everything else in it (patches, sample_sigmas, wrappers) goes whole to every share. Other
inputs (x, timestep, context, y, guidance, control's tensors) are cut where their leading
size is the batch (runtime/parallel/batch_cut.cut_all)."""
import torch

from ...parallel.batch_cut import cut_all

PER_CHUNK = ("cond_or_uncond", "uuids")      # one entry per conditioning chunk
PER_ITEM = ("sigmas",)                      # one entry per batch item


def cut_transformer_options(to: dict, batch: int, start: int, stop: int) -> dict:
    """A share's transformer_options: a shallow copy with the per-item and per-chunk
    entries cut to items start:stop (chunks are equal runs of the batch, as
    samplers.calc_cond_batch concatenates them)."""
    out = dict(to)
    for key in PER_ITEM:
        v = to.get(key)
        if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == batch:
            out[key] = v[start:stop]
    for key in PER_CHUNK:
        v = to.get(key)
        if isinstance(v, list) and v and batch % len(v) == 0:
            per = batch // len(v)
            out[key] = v[start // per:(stop + per - 1) // per]
    return out


def cut_comfy_inputs(args, kwargs, batch: int, start: int, stop: int):
    to = kwargs.get("transformer_options")
    rest = {k: v for k, v in kwargs.items() if k != "transformer_options"}
    share_args, share_kwargs = cut_all(args, rest, batch, start, stop)
    if isinstance(to, dict):
        share_kwargs["transformer_options"] = cut_transformer_options(to, batch, start, stop)
    elif "transformer_options" in kwargs:
        share_kwargs["transformer_options"] = to
    return share_args, share_kwargs

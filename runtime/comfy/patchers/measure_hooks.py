"""Where Apply Placement's meter (nodes/measured.py) hooks into ComfyUI: the placed
MODEL's outermost OUTER_SAMPLE wrapper, the placed VAE's decode, and the engine
session of a placed copy. Kept here so that nodes/ never touches ComfyUI's patcher,
wrappers or classes itself; only the node's own copies are changed, never a given
object.
"""
from typing import Dict

from .engine_patcher import KEY

METER_KEY = "placement_meter"      # the meter's wrapper and attachment key
# the meter of a placed VAE rides on the VAE copy itself: a module-level map from the
# copy to its meter would hold the meter, and through it the copy and the placed MODEL
# (their BaseModels: ComfyUI's "memory leak with model ..."), for the whole process
_VAE_METER_ATTR = "_placement_meter"
_TIMED_CLASSES: Dict[type, type] = {}


def meter_sampling(placed_model, meter) -> None:
    """`meter` as an attachment of the placed MODEL and `meter.outer_sample` as its
    outermost OUTER_SAMPLE wrapper: it runs after the engine has closed its placement
    and written its stats."""
    import comfy.patcher_extension as ext
    placed_model.set_attachments(METER_KEY, meter)
    # ComfyUI has no "outermost" option: the first key of the wrapper dict is outermost
    wrappers = placed_model.wrappers.setdefault(ext.WrappersMP.OUTER_SAMPLE, {})
    others = [(k, v) for k, v in wrappers.items() if k != METER_KEY]
    wrappers.clear()
    wrappers[METER_KEY] = [meter.outer_sample]
    wrappers.update(others)


def meter_decode(placed_vae, meter) -> None:
    """Each `placed_vae.decode(...)` runs as `meter.timed_decode(call)`. ComfyUI's VAE has
    no decode wrapper, so the copy's class becomes a subclass with a timed decode."""
    setattr(placed_vae, _VAE_METER_ATTR, meter)
    placed_vae.__class__ = _timed_class(type(placed_vae))


def _timed_class(cls: type) -> type:
    """A subclass of the VAE's class whose decode reports to the VAE's meter."""
    if getattr(cls, "_placement_timed", False):
        return cls
    hit = _TIMED_CLASSES.get(cls)
    if hit is None:
        def decode(self, *args, **kwargs):
            meter = getattr(self, _VAE_METER_ATTR, None)
            call = lambda: cls.decode(self, *args, **kwargs)  # noqa: E731
            return call() if meter is None else meter.timed_decode(call)
        hit = _TIMED_CLASSES[cls] = type(cls.__name__, (cls,), {
            "decode": decode, "_placement_timed": True, "__module__": cls.__module__})
    return hit


def engine_session(obj):
    """The engine session (sampling_session.SamplingSession, engine_calls.CallSession)
    of a placed MODEL, VAE or CLIP, or None where the pack's engine does not run it."""
    patcher = getattr(obj, "patcher", obj)
    get = getattr(patcher, "get_attachment", None)
    return get(KEY) if get else None

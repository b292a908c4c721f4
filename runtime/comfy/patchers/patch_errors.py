"""A weight patch that fails is an error, not a log line.

ComfyUI's weight adapters (comfy/weight_adapter/*.py: LoRA, LoHa, LoKr, OFT, BOFT, GLoRA)
catch every exception while they compute a patched weight, log "ERROR <adapter> <key>
<error>" and go on with the unpatched weight. Under the pack the patch is computed when a
streamed block arrives, on the device, next to a ring that fills the budget: an out of
memory there would leave the LoRA silently unapplied (the simulated device's working-memory
meter found exactly that). While a placed component runs, a filter on the root logger turns
such a record back into the exception being handled, with a note naming the patch."""
import contextlib
import logging
import os
import re
import sys

_ADAPTER_ERROR = re.compile(r"^ERROR (\S+) (\S+) ")


def _from_adapter(path: str) -> bool:
    """Logged by ComfyUI's weight adapters (comfy/weight_adapter/*.py) or comfy/lora.py."""
    parts = os.path.normpath(path or "").split(os.sep)
    return "weight_adapter" in parts[-2:-1] or parts[-2:] == ["comfy", "lora.py"]


class _RaisePatchErrors(logging.Filter):
    def __init__(self, component: str):
        super().__init__()
        self.component = component

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not _from_adapter(record.pathname):
            return True
        exc = sys.exc_info()[1]
        hit = _ADAPTER_ERROR.match(record.getMessage()) if exc is not None else None
        if hit is None:
            return True
        note = (f"{self.component}: ComfyUI's {hit.group(1)} patch of {hit.group(2)} failed "
                f"while the placed model ran; ComfyUI would log it and go on without the "
                f"patch, so the pack stops here instead")
        if hasattr(exc, "add_note"):
            exc.add_note(note)
        raise exc


@contextlib.contextmanager
def patches_must_apply(component: str):
    root = logging.getLogger()
    flt = _RaisePatchErrors(component)
    root.addFilter(flt)
    try:
        yield
    finally:
        root.removeFilter(flt)

"""Several devices computing one component at once (issue 13): batch parallel
(batch.py: shares of a batch on different devices, each under its own placement)."""
from .batch import BatchPlaced, device_plan, place_batch
from .batch_cut import share_counts

__all__ = ["BatchPlaced", "device_plan", "place_batch", "share_counts"]

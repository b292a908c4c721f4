"""The kinds of placement auto-fit prices, one module each; a new kind is one module
plus one line here. Order matters only where a kind looks at what the kinds before it
offered (splits skip equal GPUs when one holds the component whole; the streaming split
is tried only when no resident split fits)."""
from .base import Kind
from .batch_parallel import BATCH_PARALLEL
from .cpu import CPU
from .layer_split import LAYER_SPLIT
from .pipeline import PIPELINE
from .resident import RESIDENT
from .row_split import ROW_SPLIT
from .split_stream import SPLIT_STREAM
from .streamed import STREAMED
from .tiled_vae import TILED_VAE
from .turns import TURNS
from .worker_ranges import WORKER_RANGES

KINDS = (RESIDENT, TURNS, TILED_VAE, STREAMED, LAYER_SPLIT, ROW_SPLIT, SPLIT_STREAM,
         WORKER_RANGES, CPU, PIPELINE, BATCH_PARALLEL)
BY_NAME = {k.name: k for k in KINDS}

__all__ = ["Kind", "KINDS", "BY_NAME"]

"""Executes a Plan on torch modules: residency, transfers, streaming, ledgers.

Knows torch, never ComfyUI (the adapter is runtime/comfy). See docs/runtime.md.
"""
from .blocks import find_blocks
from .ledger import Ledger
from .place import Placed, place
from .simdevice import Link

__all__ = ["place", "Placed", "find_blocks", "Ledger", "Link"]

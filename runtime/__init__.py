"""Executes a Plan on torch modules: residency, transfers, streaming, ledgers.

Knows torch, never ComfyUI (the adapter is runtime/comfy). See docs/runtime.md.
"""
from .blocks.find import find_blocks
from .device.ledger import Ledger
from .device.simdevice import Link
from .place import Placed, place

__all__ = ["place", "Placed", "find_blocks", "Ledger", "Link"]

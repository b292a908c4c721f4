"""Applying a Plan to one workflow's ComfyUI objects: placed copies per type
(placed_copies.py), components run by the engine per call (engine_calls.py), the tiled
VAE decode (vae_tiles.py), and the entry point (apply_plan.py)."""

"""ComfyUI's ModelPatcher for placed components: the engine's patcher flavour
(engine_patcher.py), retargeted clones (retarget.py), the two torch devices ComfyUI
understands (patcher_devices.py), patches kept, checked and applied to row splits, and
the device memory ComfyUI's manager is told about (claims.py)."""

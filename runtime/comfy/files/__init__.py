"""Where a ComfyUI model's weights are in its files (for params disk and the workers):
ComfyUI-GGUF's models (gguf_models.py), text encoders (te_files.py), the diffusion
model's key map (model_file.py)."""

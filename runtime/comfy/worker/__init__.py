"""The worker side of ComfyUI models: a worker builds ComfyUI's own diffusion model from
its copy of the file (remote_model.py); the main side's block ranges on workers
(worker_ranges.py)."""

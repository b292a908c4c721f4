"""The diffusion model inside ComfyUI's sampler: the session that runs it under the engine
(sampling_session.py, engine_model.py), batch parallel and its cuts, and what crosses
devices inside ComfyUI's own forward (skips.py, control_hops.py, family_containers.py)."""

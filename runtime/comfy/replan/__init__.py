"""Re-planning at run time: the real workload read from the sampler (workload.py) and the
sampling call rehearsed on the meta device before it computes (rehearse_call.py)."""

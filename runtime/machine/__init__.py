"""Commands that measure this machine: `selftest` proves the runtime on it, `calibrate`
times the speeds the auto-fit cost model uses."""

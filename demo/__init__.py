"""The `demo` and `tiny-models` commands: a small built-in pipeline planned and run on
a simulated device, and tiny model files written for a first try-out (no downloads)."""

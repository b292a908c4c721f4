"""A device as the runtime sees it, real or simulated: its transfer queue (transfer.py),
the simulated accelerator (simdevice.py) and what it refuses (simcheck.py,
subclass_check.py), the bytes held (ledger.py) and the working-memory meter (workmeter.py)."""

"""The engine: a module's blocks cut into stages, one per runtime device, streamed or
resident, run and given back exactly (base.py the shared engine, stages.py the staged
blocks, one_device.py its one-stage case, stream.py the byte ring, restore.py the way back)."""

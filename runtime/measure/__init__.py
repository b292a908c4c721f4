"""Sizing a placement before it runs: a forward rehearsed on the meta device under the
working-memory meter (rehearse.py), at the first call's real shapes (first_call.py)."""

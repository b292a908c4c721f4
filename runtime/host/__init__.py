"""Host memory: pinned buffers (pinned.py), where weights rest and how a group is packed
for one-copy transfers (residency.py), and the packed copies kept across runs (hoststore.py)."""

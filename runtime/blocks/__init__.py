"""What executes: a module's repeated blocks in execution order (find.py), when execution
enters one (entry.py), the code between them (crossings.py), and the activations that
cross devices there (moves.py, hops.py)."""

"""One error per fault: teardown after a failure must not replace the first error.

A placement's teardown (drain the copies, free the slots, restore the module) can meet
a second error caused by the first (the copy that failed is seen again at drain, a
worker that is stuck). The caller gets the first; the later one is attached to it as a
note, so nothing is lost and nothing is raised twice.
"""


def teardown_after(teardown, exc) -> None:
    """Run `teardown()`. With `exc` (the error in flight) a teardown error is noted on
    `exc` and swallowed; without one it propagates."""
    try:
        teardown()
    except BaseException as second:
        if exc is None:
            raise
        if hasattr(exc, "add_note"):
            exc.add_note(f"during the placement's teardown, after it: {second!r}")

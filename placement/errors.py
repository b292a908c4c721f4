"""The one error type of the pack: bad input, said in one line."""


class PlacementError(ValueError):
    """A placement spec, budget, inventory, file or plan that cannot be used.

    The message is one line naming the bad part and what is accepted.
    """

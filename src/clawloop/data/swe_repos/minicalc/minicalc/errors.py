class CalcError(Exception):
    """A bad expression; `pos` is the offset in the input where the problem is (or None)."""

    def __init__(self, message, pos=None):
        super().__init__(message if pos is None else f"{message} at position {pos}")
        self.pos = pos

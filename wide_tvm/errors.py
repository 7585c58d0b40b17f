"""The one error type users see: a message naming the problem, never a TVM traceback."""


class WideError(Exception):
    """A user-facing error: bad model file, unsupported operator, bad target, bad group size..."""

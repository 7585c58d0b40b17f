"""The one error type users see: a message naming the problem, never a TVM traceback."""


class WideError(Exception):
    """A user-facing error: bad model file, unsupported operator, bad target, bad group size..."""


def check_id_range(lowest: int, highest: int, bound: int, what: str) -> None:
    """Token ids index a table of `bound` rows: a WideError naming `what` and the first id outside [0, bound)
    (an id past the table reads another buffer's memory on the device, or faults)."""
    if lowest < 0 or highest >= bound:
        bad = lowest if lowest < 0 else highest
        raise WideError(f"{what}: token id {bad} is outside [0, {bound}) (the vocabulary has {bound} ids)")

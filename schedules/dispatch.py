"""Pick one of several kernel bodies by token count, on the host: one kernel launch either way.

Every gated kernel has variants per token bucket (decode kernels with their own knobs on CUDA, tiles of
their own size on the CPU); `token_dispatch` chains them into `if n <= bound` branches of one PrimFunc.

Worked example: token_dispatch([(1, a), (8, b), (16, b), (32, c), (None, d)]) gives one macro that runs
`if n <= 1: a  elif n <= 16: b  elif n <= 32: c  else: d` (the two buckets of body b share one branch), so a call
with n = 12 tokens launches b and nothing else.
"""

from __future__ import annotations

from tvm.script import tirx as T


def token_dispatch(kernels: list) -> object:
    """Macro (n, *args) that runs, of [(max_tokens, body), ..., (None, body)], the first body whose bound
    holds n, as body(*args, n); the choice is made on the host, so it is one kernel launch either way.
    Neighbouring buckets with the same body object share one branch."""
    merged = []
    for bound, body in kernels:
        if merged and merged[-1][1] is body:
            merged[-1] = (bound, body)
        else:
            merged.append((bound, body))
    chain = _last(merged[-1][1])
    for bound, body in reversed(merged[:-1]):
        chain = _pick(bound, body, chain)
    return chain


def _last(body):
    @T.macro
    def run(n, *args):
        body(*args, n)

    return run


def _pick(bound: int, body, rest):
    @T.macro
    def run(n, *args):
        if n <= bound:
            body(*args, n)
        else:
            rest(n, *args)

    return run

"""What a request asks of generation (`SamplingParams`), checked once at the boundary, and the per-step arrays
the device's sampler takes (passes/sampling.py).

    SamplingParams(max_new_tokens=32)                          greedy (temperature 0)
    SamplingParams(temperature=0.8, top_p=0.95, seed=7)        nucleus sampling, reproducible: the request draws
                                                               its uniform numbers from its own generator
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .errors import WideError

# the largest float32 below 1: a uniform number rounded up to 1.0 would select past the kept tokens
_BELOW_ONE = float(np.nextafter(np.float32(1), np.float32(0)))


@dataclass(frozen=True)
class SamplingParams:
    """`temperature` 0 is greedy; `top_p` in (0, 1] keeps the smallest most-likely set reaching it; `top_k` 0 keeps
    every token; `stop_token_ids` and `stop` (strings, needs a tokenizer) end a sequence (the stop string is not
    part of the text); `seed` None draws from the operating system's entropy."""

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        def bad(what):
            raise WideError(what)

        if not isinstance(self.max_new_tokens, (int, np.integer)) or self.max_new_tokens < 1:
            bad(f"max_new_tokens {self.max_new_tokens!r}: expected an integer of at least 1")
        if not _number(self.temperature) or self.temperature < 0:
            bad(f"temperature {self.temperature!r}: expected a number >= 0")
        if not _number(self.top_p) or not 0 < self.top_p <= 1:
            bad(f"top_p {self.top_p!r}: expected a number in (0, 1]")
        if not isinstance(self.top_k, (int, np.integer)) or self.top_k < 0:
            bad(f"top_k {self.top_k!r}: expected an integer >= 0 (0: no limit)")
        if self.seed is not None and (not isinstance(self.seed, (int, np.integer)) or self.seed < 0):
            bad(f"seed {self.seed!r}: expected a non-negative integer")
        if any(not isinstance(t, (int, np.integer)) or t < 0 for t in self.stop_token_ids):
            bad(f"stop_token_ids {list(self.stop_token_ids)!r}: expected non-negative integers")
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad(f"stop {list(self.stop)!r}: expected non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and math.isfinite(x)


def sampler_arrays(params: list[SamplingParams], rngs: list[np.random.Generator], vocab: int) -> dict:
    """The SAMPLE function's per-row inputs for one step: temperature, top_p, top_k (0 -> the vocabulary), and one
    uniform number per row drawn from that row's generator (greedy rows draw none, so their generator's sequence
    is the same whatever the batch)."""
    uniform = [min(float(rng.random()), _BELOW_ONE) if not p.greedy else 0.0 for p, rng in zip(params, rngs)]
    return {"temperature": np.asarray([p.temperature for p in params], "float32"),
            "top_p": np.asarray([p.top_p for p in params], "float32"),
            "top_k": np.asarray([p.top_k or vocab for p in params], "int32"),
            "uniform": np.asarray(uniform, "float32")}

"""Greedy generation with a library compiled with `generation=True` (`wide-compile --generation`): the prompts
prefilled as one ragged batch into TVM's paged KV cache, then one decode step per new token for every unfinished
sequence, batched (`batch_forward`, passes/kv_cache_attention.py).

    model = wide_tvm.load("model.so")
    engine = Engine(model)
    [r.token_ids for r in engine.generate([[1, 2, 3], [4, 5]], max_new_tokens=8)]

Each call creates its own cache (`create_kv_cache`) and runs on the calling thread's VM, so threads may share one
engine. Greedy only for now (temperature 0): the next token is the argmax of the last position's logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .entry_points import CREATE_CACHE, FORWARD
from .errors import WideError


@dataclass
class Generation:
    """One prompt's result: the generated ids (prompt excluded) and why it stopped ("length" or "stop")."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = "length"


class Engine:
    """Generator over a loaded model (runtime.WideModel) whose library has the paged-KV-cache entry points.
    `max_batch`: sequences at once; `max_total_tokens`: the cache's capacity over all of them; `page_size`: tokens
    per cache page; `prefill_chunk`: the most prompt tokens one forward takes."""

    def __init__(self, model, max_batch: int = 16, max_total_tokens: int = 4096, page_size: int = 16,
                 prefill_chunk: int = 2048):
        shape = model.meta.get("kv_cache")
        if not shape:
            raise WideError("this library has no paged KV cache: compile it with generation=True "
                            "(wide-compile --generation)")
        self.model, self.shape = model, shape
        self.max_batch, self.max_total, self.page, self.chunk = max_batch, max_total_tokens, page_size, prefill_chunk
        spec = (model.meta.get("inputs") or [{}])[0]
        self.vocab = spec.get("index_bound")

    def _check(self, prompts) -> list[list[int]]:
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise WideError("prompts: expected a non-empty list of token-id lists")
        if len(prompts) > self.max_batch:
            raise WideError(f"{len(prompts)} prompts; this engine takes at most {self.max_batch} at once")
        out = []
        for i, p in enumerate(prompts):
            arr = np.asarray(p)
            if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
                raise WideError(f"prompt {i}: expected a non-empty list of integer token ids")
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or (self.vocab is not None and hi >= self.vocab):
                raise WideError(f"prompt {i}: token id {lo if lo < 0 else hi} is outside [0, {self.vocab})")
            if arr.size > self.chunk:
                raise WideError(f"prompt {i}: {arr.size} tokens, more than one prefill takes ({self.chunk})")
            out.append([int(t) for t in arr])
        if sum(len(p) for p in out) > self.max_total:
            raise WideError(f"prompts of {sum(len(p) for p in out)} tokens do not fit the cache "
                            f"({self.max_total} tokens)")
        return out

    def generate(self, prompts, max_new_tokens: int = 32, stop_token_ids=(), on_token=None) -> list[Generation]:
        """Greedy continuation of each prompt (a list of token ids), up to `max_new_tokens` new ids or a stop id.
        `on_token(prompt_index, token_id)` is called for each new id as soon as it is known (streaming)."""
        import tvm
        from tvm.runtime import ShapeTuple

        prompts = self._check(prompts)
        if max_new_tokens < 1:
            raise WideError(f"max_new_tokens {max_new_tokens}: expected at least 1")
        if sum(len(p) for p in prompts) + len(prompts) * max_new_tokens > self.max_total:
            raise WideError(f"{len(prompts)} prompts plus {max_new_tokens} new tokens each do not fit the cache "
                            f"({self.max_total} tokens)")
        builtin = tvm.get_global_func
        add, remove = builtin("vm.builtin.kv_state_add_sequence"), builtin("vm.builtin.kv_state_remove_sequence")
        begin, end = builtin("vm.builtin.kv_state_begin_forward"), builtin("vm.builtin.kv_state_end_forward")
        vm, weights, dev = self.model.vm, self.model.weights, self.model.device
        cache = vm[CREATE_CACHE](ShapeTuple([self.max_batch]), ShapeTuple([self.max_total]),
                                 ShapeTuple([self.chunk]), ShapeTuple([self.page]), ShapeTuple([0]))
        results = [Generation() for _ in prompts]
        stops = set(int(t) for t in stop_token_ids)

        def forward(seq_ids, tokens_per_seq, flat):
            begin(cache, ShapeTuple(seq_ids), ShapeTuple(tokens_per_seq))
            out = vm[FORWARD](tvm.runtime.tensor(np.asarray([flat], "int64"), dev), cache, *weights)
            end(cache)
            logits = out[0] if not hasattr(out, "numpy") else out
            return logits.numpy()[0]  # [tokens, vocab]

        for i in range(len(prompts)):
            add(cache, i)
        lengths = [len(p) for p in prompts]
        logits = forward(list(range(len(prompts))), lengths, [t for p in prompts for t in p])
        last = np.cumsum(lengths) - 1
        active = list(range(len(prompts)))
        nxt = {i: int(np.argmax(logits[last[i]])) for i in active}
        while active:
            for i in list(active):
                results[i].token_ids.append(nxt[i])
                if on_token is not None:
                    on_token(i, nxt[i])
                if nxt[i] in stops or len(results[i].token_ids) >= max_new_tokens:
                    results[i].finish_reason = "stop" if nxt[i] in stops else "length"
                    active.remove(i)
                    remove(cache, i)
            if not active:
                break
            logits = forward(active, [1] * len(active), [nxt[i] for i in active])
            nxt = {i: int(np.argmax(logits[j])) for j, i in enumerate(active)}
        return results

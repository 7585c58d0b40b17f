"""Generation with a library compiled with `generation=True` (`wide-compile --generation`): continuous batching
over TVM's paged KV cache, sampling on the device.

    model = wide_tvm.load("model.so")
    engine = Engine(model)
    [r.token_ids for r in engine.generate([[1, 2, 3], [4, 5]], max_new_tokens=8)]

One scheduler thread owns the library's virtual machine and the cache; `generate` and `submit` may be called from
any number of threads. Each step of the scheduler:

    admit    waiting requests join while the batch has room and the cache can hold their prompt plus every token
             they may generate (pages reserved up front: a running request never runs out); a request that could
             never fit is refused at once, the others wait in order
    prefill  prompts not yet in the cache, as one ragged batch of at most `prefill_chunk` tokens (a longer prompt
             spans several steps); logits only at the last token of each prompt completed, sampled: its first token
    decode   one token for every running sequence, batched (`decode`); sampled on the device, so the step's one
             transfer back is the new ids
    finish   a sequence that generated a stop id or string, or its `max_new_tokens`, or was cancelled, leaves the
             cache and frees its pages

A request's tokens do not depend on what else runs beside it (the same as running it alone): each sequence attends
to its own cache only, and a sampling request draws its numbers from its own seeded generator.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .entry_points import CREATE_CACHE, DECODE, PREFILL, SAMPLE, SAMPLE_GREEDY
from .errors import WideError, check_id_range
from .sampling import SamplingParams, sampler_arrays

PAGE_SIZE = 16  # tokens per cache page: TVM's paged-attention kernels are written for 16 (others fail at run time)


@dataclass
class Generation:
    """One prompt's result: the generated ids (prompt excluded), their text (with a tokenizer, stop string
    excluded), and why it stopped: "length", "stop", or "cancelled"."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    text: str | None = None
    prompt_tokens: int = 0


@dataclass
class Event:
    """A streamed step of one request: its new id and text, and `finish_reason` once it ended."""

    index: int
    token_id: int | None
    text: str
    finish_reason: str | None = None


class Request:
    """One prompt in flight (`Engine.submit`). `result` fills as tokens come; `done` is set when it ends;
    `on_event(Event)` is called from the scheduler thread for each token and at the end (keep it short)."""

    _ids = itertools.count()

    def __init__(self, prompt: list[int], params: SamplingParams, index: int = 0, on_event=None, detok=None):
        self.id, self.index = next(self._ids), index
        self.prompt, self.params, self.on_event, self.detok = prompt, params, on_event, detok
        self.result = Generation(prompt_tokens=len(prompt), text="" if detok is not None else None)
        self.done = threading.Event()
        self.error: Exception | None = None
        self.cancelled = False
        self.rng = np.random.default_rng(params.seed)
        self.prefilled = 0  # prompt tokens already in the cache
        self.pages = 0  # cache pages reserved
        self.sent = 0  # characters of the text streamed

    def wait(self, timeout: float | None = None) -> Generation:
        """The result once the request ends; its error re-raised (a WideError) where it failed."""
        if not self.done.wait(timeout):
            raise TimeoutError(f"request {self.id} still running")
        if self.error is not None:
            raise self.error
        return self.result


class Engine:
    """Continuous-batching generator over a loaded model (runtime.WideModel) whose library has the generation
    entry points. `max_batch`: sequences decoded together (at most what the library was compiled for);
    `max_total_tokens`: the cache's capacity over all sequences (its memory bound), in pages of PAGE_SIZE tokens;
    `prefill_chunk`: the most prompt tokens one prefill takes; `tokenizer` (wide_tvm.tokenizer.Tokenizer):
    text prompts, `.text` results, stop strings, and the model's end-of-sequence ids as stops."""

    def __init__(self, model, max_batch: int | None = None, max_total_tokens: int = 4096, prefill_chunk: int = 2048,
                 tokenizer=None):
        gen = model.meta.get("generation")
        if not gen:
            raise WideError("this library has no generation entry points: compile it with generation=True "
                            "(wide-compile --generation)" + (" again (it predates prefill / decode / sampling)"
                                                              if model.meta.get("kv_cache") else ""))
        bound = int(gen["max_batch"])
        max_batch = bound if max_batch is None else max_batch
        if not 1 <= max_batch <= bound:
            raise WideError(f"max_batch {max_batch}: this library decodes at most {bound} sequences at once "
                            "(wide-compile --max-batch)")
        if max_total_tokens < PAGE_SIZE or prefill_chunk < 1:
            raise WideError(f"cache of {max_total_tokens} tokens, prefill chunks of {prefill_chunk}: expected at "
                            f"least one page ({PAGE_SIZE} tokens) and one token")
        self.model, self.tokenizer = model, tokenizer
        self.max_batch, self.page, self.chunk = max_batch, PAGE_SIZE, prefill_chunk
        self.total_pages = max_total_tokens // PAGE_SIZE
        self.max_total = self.total_pages * PAGE_SIZE
        self.vocab = (model.meta.get("inputs") or [{}])[0].get("index_bound") or int(gen["vocab"])
        self._cv = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._reserved = 0  # pages
        self._thread: threading.Thread | None = None
        self._closed = False
        self._broken: Exception | None = None

    # ---- the boundary (any thread) ----

    def check_prompt(self, prompt, index: int = 0) -> list[int]:
        """`prompt` as a list of ids, or a WideError naming what is wrong with it."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise WideError(f"prompt {index}: text needs a tokenizer (load(..., tokenizer=DIR))")
            prompt = self.tokenizer.encode(prompt)
        arr = np.asarray(prompt) if isinstance(prompt, (list, tuple, np.ndarray)) else np.asarray([[]])
        if arr.ndim != 1 or arr.size == 0 or not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == object
                                                  and all(isinstance(t, int) for t in prompt)):
            raise WideError(f"prompt {index}: expected a non-empty list of integer token ids, or text")
        ids = [int(t) for t in arr]
        check_id_range(min(ids), max(ids), self.vocab, f"prompt {index}")
        return ids

    def submit(self, prompt, params: SamplingParams | None = None, on_event=None, index: int = 0) -> Request:
        """Queue one prompt (ids or text); returns its Request at once. A prompt that can never fit the cache is a
        WideError here; one that fits waits for room."""
        params = params or SamplingParams()
        ids = self.check_prompt(prompt, index)
        if params.stop and self.tokenizer is None:
            raise WideError("stop strings need a tokenizer (load(..., tokenizer=DIR)); use stop_token_ids")
        need = self._pages(len(ids) + params.max_new_tokens)
        if need > self.total_pages:
            raise WideError(f"prompt {index}: {len(ids)} tokens plus {params.max_new_tokens} new ones need "
                            f"{need * self.page} tokens of cache; it holds {self.max_total} (max_total_tokens)")
        detok = self.tokenizer.stream(ids) if self.tokenizer is not None else None
        request = Request(ids, params, index, on_event, detok)
        with self._cv:
            if self._broken is not None:
                raise WideError(f"the engine stopped: {self._broken}")
            if self._closed:
                raise WideError("the engine is closed")
            self._waiting.append(request)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="wide-engine", daemon=True)
                self._thread.start()
            self._cv.notify_all()
        return request

    def cancel(self, request: Request) -> None:
        """End `request` (finish_reason "cancelled"); its cache pages are freed at the scheduler's next step."""
        with self._cv:
            request.cancelled = True
            self._cv.notify_all()

    def generate(self, prompts, max_new_tokens: int = 32, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, stop=(), seed: int | None = None, stream: bool = False, on_token=None,
                 stop_token_ids=(), ignore_eos: bool = False):
        """Continue each prompt (token ids or text) up to `max_new_tokens` new tokens; returns one Generation per
        prompt, or with `stream=True` an iterator of Events as tokens come. `stop`: ids, strings, or both;
        `seed`: every prompt's sampling starts from this seed. `on_token(index, token_id)` is called for each new
        id as soon as it is known."""
        if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)) or not prompts:
            raise WideError("prompts: expected a non-empty list of prompts (token-id lists or strings)")
        if isinstance(stop, (str, int)):
            stop = [stop]
        ids = [s for s in stop if isinstance(s, (int, np.integer))] + list(stop_token_ids)
        params = SamplingParams(max_new_tokens, temperature, top_p, top_k, tuple(int(i) for i in ids),
                                tuple(s for s in stop if not isinstance(s, (int, np.integer))), seed, ignore_eos)
        checked = [self.check_prompt(p, i) for i, p in enumerate(prompts)]  # every prompt before any runs
        events: queue.Queue = queue.Queue()

        def on_event(event):
            if on_token is not None and event.token_id is not None:
                on_token(event.index, event.token_id)
            events.put(event)

        requests = []
        try:
            for i, p in enumerate(checked):
                requests.append(self.submit(p, params, on_event, i))
        except BaseException:
            for r in requests:
                self.cancel(r)
            raise
        if stream:
            return self._stream(requests, events)
        try:
            return [r.wait() for r in requests]
        except BaseException:
            for r in requests:
                self.cancel(r)
            raise

    def _stream(self, requests, events):
        try:
            open_ = len(requests)
            while open_:
                event = events.get()
                if event.finish_reason is not None:
                    open_ -= 1
                    err = requests[event.index].error
                    if err is not None:
                        raise err
                yield event
        finally:  # (the consumer stopped early: nothing keeps running for it)
            for r in requests:
                if not r.done.is_set():
                    self.cancel(r)

    def stats(self) -> dict:
        """Requests running and waiting, and cache pages reserved out of the total."""
        with self._cv:
            return {"running": len(self._running), "waiting": len(self._waiting),
                    "reserved_pages": self._reserved, "total_pages": self.total_pages}

    def close(self) -> None:
        """Stop the scheduler; running and waiting requests end as cancelled."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    # ---- the scheduler thread ----

    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.page)

    def _loop(self) -> None:
        try:
            self._steps = Steps(self.model, self.max_batch, self.max_total, self.chunk, self.vocab)
            while True:
                with self._cv:
                    while not (self._waiting or self._running or self._closed):
                        self._cv.wait()
                    if self._closed:
                        break
                    for r in [r for r in self._running if r.cancelled]:
                        self._finish(r, "cancelled")
                    for r in [r for r in self._waiting if r.cancelled]:
                        self._waiting.remove(r)
                        self._finish(r, "cancelled")
                    self._admit()
                    running = list(self._running)
                if running:
                    self._step(running)
        except Exception as err:  # noqa: BLE001 - every request ends with the error, none hangs
            failure = err if isinstance(err, WideError) else WideError(
                f"generation failed: {str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__}")
            with self._cv:
                self._broken = failure
                for r in [*self._running, *self._waiting]:
                    r.error = failure
                    self._finish(r, "error", remove=False)
                self._waiting.clear()
            return
        with self._cv:
            for r in [*self._running, *self._waiting]:
                self._finish(r, "cancelled")
            self._waiting.clear()

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.max_batch:
            r = self._waiting[0]
            need = self._pages(len(r.prompt) + r.params.max_new_tokens)
            if self._reserved + need > self.total_pages:
                return  # (in order: it waits for pages, and so do those behind it)
            self._waiting.popleft()
            r.pages, self._reserved = need, self._reserved + need
            self._steps.add(r.id)
            self._running.append(r)

    def _step(self, running: list[Request]) -> None:
        prefill = [r for r in running if r.prefilled < len(r.prompt)]
        if prefill:
            budget, seqs, lengths, flat, last = self.chunk, [], [], [], []
            for r in prefill:
                take = min(len(r.prompt) - r.prefilled, budget)
                if take == 0:
                    break
                seqs.append(r)
                lengths.append(take)
                flat += r.prompt[r.prefilled:r.prefilled + take]
                r.prefilled += take
                budget -= take
                if r.prefilled == len(r.prompt):
                    last.append((r, len(flat) - 1))
            rows = [pos for _, pos in last] or [len(flat) - 1]
            logits = self._steps.prefill([r.id for r in seqs], lengths, flat, rows)
            if last:
                done = [r for r, _ in last]
                self._emit(done, self._steps.sample(logits, [r.params for r in done], [r.rng for r in done]))
        decoding = [r for r in running if r.prefilled == len(r.prompt) and r.result.token_ids
                    and r.result.finish_reason is None and r not in prefill]
        if decoding:
            logits = self._steps.decode([r.id for r in decoding], [r.result.token_ids[-1] for r in decoding])
            self._emit(decoding, self._steps.sample(logits, [r.params for r in decoding],
                                                    [r.rng for r in decoding]))

    def _emit(self, requests: list[Request], tokens: list[int]) -> None:
        stops = self.tokenizer.eos_ids if self.tokenizer is not None else ()
        for r, token in zip(requests, tokens):
            p, res = r.params, r.result
            res.token_ids.append(token)
            reason = "stop" if token in p.stop_token_ids or (token in stops and not p.ignore_eos) else None
            delta = ""
            if r.detok is not None and reason is None:
                text = res.text + r.detok.add(token)
                cut = min((i for i in (text.find(s) for s in p.stop) if i >= 0), default=-1)
                res.text, reason = (text[:cut], "stop") if cut >= 0 else (text, None)
            if reason is None and len(res.token_ids) >= p.max_new_tokens:
                reason = "length"
            if r.detok is not None:
                # streamed text holds back what may be the start of a stop string, so the pieces add up to .text
                end = len(res.text) if reason else len(res.text) - _stop_prefix(res.text, p.stop)
                delta, r.sent = res.text[r.sent:end], max(r.sent, end)
            if r.on_event is not None:
                r.on_event(Event(r.index, token, delta))
            if reason is not None:
                with self._cv:
                    self._finish(r, reason)

    def _finish(self, r: Request, reason: str, remove: bool = True) -> None:
        """(Under the lock.) End `r`: out of the cache, its pages back, its waiters woken."""
        if r.done.is_set():
            return
        r.result.finish_reason = reason
        if r in self._running:
            self._running.remove(r)
            self._reserved -= r.pages
            if remove:
                self._steps.remove(r.id)
        if r.on_event is not None:
            r.on_event(Event(r.index, None, "", reason))
        r.done.set()


class Steps:
    """The device side of generation: one paged KV cache and the library's prefill / decode / sample functions
    (the scheduler's, and the end-to-end benchmark's, which times them). `model`: .vm, .weights, .device."""

    def __init__(self, model, max_batch: int, max_total_tokens: int, prefill_chunk: int, vocab: int):
        import tvm
        from tvm.runtime import ShapeTuple

        self.tvm, self.shape, self.dev = tvm, ShapeTuple, model.device
        self.vm, self.weights, self.vocab = model.vm, model.weights, vocab
        f = tvm.get_global_func
        self._add, self._remove = f("vm.builtin.kv_state_add_sequence"), f("vm.builtin.kv_state_remove_sequence")
        self._begin, self._end = f("vm.builtin.kv_state_begin_forward"), f("vm.builtin.kv_state_end_forward")
        self.cache = self.vm[CREATE_CACHE](ShapeTuple([max_batch]), ShapeTuple([max_total_tokens]),
                                           ShapeTuple([prefill_chunk]), ShapeTuple([PAGE_SIZE]), ShapeTuple([0]))

    def add(self, seq: int) -> None:
        self._add(self.cache, seq)

    def remove(self, seq: int) -> None:
        self._remove(self.cache, seq)

    def _array(self, values, dtype):
        return self.tvm.runtime.tensor(np.asarray(values, dtype), self.dev)

    def prefill(self, seqs: list[int], lengths: list[int], flat: list[int], rows: list[int]):
        """Append `lengths[i]` tokens of `flat` to sequence `seqs[i]`; logits [1, len(rows), vocab] (device) at the
        rows `rows` of the ragged batch."""
        self._begin(self.cache, self.shape(seqs), self.shape(lengths))
        logits = self.vm[PREFILL](self._array([flat], "int64"), self._array(rows, "int32"), self.cache,
                                  *self.weights)
        self._end(self.cache)
        return first_output(logits)

    def decode(self, seqs: list[int], tokens: list[int]):
        """One token per sequence; logits [1, len(seqs), vocab] (device)."""
        self._begin(self.cache, self.shape(seqs), self.shape([1] * len(seqs)))
        logits = self.vm[DECODE](self._array([tokens], "int64"), self.cache, *self.weights)
        self._end(self.cache)
        return first_output(logits)

    def sample(self, logits, params: list[SamplingParams], rngs: list) -> list[int]:
        """One id per row of `logits` [1, m, vocab] (device), sampled on the device; the step's one copy back."""
        if all(p.greedy for p in params):
            ids = self.vm[SAMPLE_GREEDY](logits)
        else:
            a = sampler_arrays(params, rngs, self.vocab)
            ids = self.vm[SAMPLE](logits, *(self.tvm.runtime.tensor(a[k], self.dev)
                                            for k in ("temperature", "top_p", "top_k", "uniform")))
        return [int(t) for t in ids.numpy()[:len(params)]]


def _stop_prefix(text: str, stops) -> int:
    """The length of the longest end of `text` that begins one of `stops` (0: none)."""
    return max((k for s in stops for k in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:k])),
               default=0)


def first_output(out):
    """The logits of a forward's result (a torch.export model returns a tuple of them)."""
    return out if hasattr(out, "shape") else out[0]

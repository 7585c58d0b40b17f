"""The generation engine (wide_tvm/engine.py) on the CPU: sampling on the device against NumPy, per-request seeds,
continuous batching against each request alone, a bounded cache, cancellation, threads, text in and out."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import wide_tvm
from conftest import greedy_tokens
from wide_tvm.engine import Engine
from wide_tvm.errors import WideError
from wide_tvm.sampling import SamplingParams


def _reference_sample(logits, temperature, top_p, top_k, uniform) -> int:
    """NumPy: softmax(logits / t), the most likely tokens while their cumulative probability stays below top_p (and
    fewer than top_k), renormalised; the first whose cumulative probability exceeds `uniform`."""
    if temperature == 0:
        return int(np.argmax(logits))
    x = logits.astype(np.float64) / temperature
    p = np.exp(x - x.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order])
    keep = 1
    while keep < len(p) and cum[keep - 1] < top_p and keep < top_k:
        keep += 1
    return int(order[np.argmax(cum[:keep] / cum[keep - 1] > uniform)])


@pytest.fixture(scope="module")
def model(generation_library):
    lib, torch_model, cfg, tokenizer = generation_library
    return wide_tvm.load(lib, tokenizer=tokenizer), torch_model, cfg


def test_the_device_sampler_matches_numpy(model):
    """`sample` on random logits: temperature, top_p, top_k and the uniform number as the NumPy reference picks,
    greedy rows their argmax; `sample_greedy` is the argmax."""
    import tvm

    loaded, _, cfg = model
    vm = loaded.vm
    rng = np.random.default_rng(0)
    rows = [(0.0, 1.0, 0), (1.0, 1.0, 0), (0.7, 0.9, 0), (1.3, 0.5, 0), (1.0, 1.0, 5), (0.5, 0.8, 3), (2.0, 1.0, 1),
            (1.0, 0.05, 0)]
    for trial in range(3):
        logits = rng.standard_normal((1, len(rows), cfg.vocab_size)).astype("float32") * 3
        uniform = rng.random(len(rows)).astype("float32")
        args = [np.asarray(col, dt) for col, dt in zip(zip(*rows), ("float32", "float32", "int32"))]
        args[2] = np.where(args[2] == 0, cfg.vocab_size, args[2]).astype("int32")
        got = vm["sample"](*(tvm.runtime.tensor(a) for a in (logits, *args, uniform))).numpy()
        want = [_reference_sample(logits[0, i], t, p, k or cfg.vocab_size, u)
                for i, ((t, p, k), u) in enumerate(zip(rows, uniform))]
        assert got.tolist() == want, trial
        assert vm["sample_greedy"](tvm.runtime.tensor(logits)).numpy().tolist() == logits[0].argmax(-1).tolist()


def test_sampling_is_reproducible_by_seed(model):
    loaded, torch_model, cfg = model
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6]]
    opts = dict(max_new_tokens=16, temperature=0.9, top_p=0.9, top_k=50)
    a = [r.token_ids for r in loaded.generate(prompts, seed=5, **opts)]
    assert a == [r.token_ids for r in loaded.generate(prompts, seed=5, **opts)]
    assert [loaded.generate([p], seed=5, **opts)[0].token_ids for p in prompts] == a  # batched == alone
    assert a != [r.token_ids for r in loaded.generate(prompts, seed=6, **opts)]
    # top_k 1 at any temperature is the greedy choice
    assert loaded.generate([prompts[0]], 8, temperature=1.5, top_k=1, seed=1)[0].token_ids == \
        greedy_tokens(torch_model, prompts[0], 8)
    for bad, what in ((dict(temperature=-1), "temperature"), (dict(top_p=0), "top_p"), (dict(top_k=-2), "top_k"),
                      (dict(seed=-1), "seed"), (dict(temperature=float("nan")), "temperature")):
        with pytest.raises(WideError, match=what):
            loaded.generate([[1]], 2, **bad)


def test_continuous_batching_gives_each_request_its_tokens_alone(model):
    """Requests from 6 threads at once into an engine of 2 sequences and a cache of 4 pages of 16 tokens, with
    prefill chunks of 8 (a 21-token prompt spans 3): they join and leave as room frees, queueing in order; each
    gets PyTorch's greedy tokens, and every page comes back."""
    loaded, torch_model, cfg = model
    eng = Engine(loaded, max_batch=2, max_total_tokens=64, prefill_chunk=8)
    rng = np.random.default_rng(3)
    jobs = [(rng.integers(0, cfg.vocab_size, n).tolist(), new) for n, new in
            ((1, 12), (21, 9), (5, 30), (8, 3), (13, 17), (2, 25))]
    results = [None] * len(jobs)
    load = []  # the engine's state at each token

    def run(i):
        prompt, new = jobs[i]
        results[i] = eng.submit(prompt, SamplingParams(max_new_tokens=new), lambda _: load.append(eng.stats())).wait(120)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (prompt, new), result in zip(jobs, results):
        assert result.token_ids == greedy_tokens(torch_model, prompt, new) and result.finish_reason == "length"
    assert eng.stats() == {"running": 0, "waiting": 0, "reserved_pages": 0, "total_pages": 4}
    assert max(s["running"] for s in load) == 2 and max(s["waiting"] for s in load) >= 1
    assert max(s["reserved_pages"] for s in load) <= 4
    with pytest.raises(WideError, match="need 80 tokens of cache; it holds 64"):
        eng.submit([1] * 60, SamplingParams(max_new_tokens=5))
    eng.close()
    with pytest.raises(WideError, match="closed"):
        eng.submit([1], SamplingParams())


def test_cancelling_frees_the_cache_and_threads_share_one_model(model):
    loaded, torch_model, cfg = model
    eng = Engine(loaded, max_batch=2, max_total_tokens=256)
    started = threading.Event()
    request = eng.submit([7, 7, 7], SamplingParams(max_new_tokens=200), on_event=lambda e: started.set())
    started.wait(60)
    eng.cancel(request)
    result = request.wait(60)
    assert result.finish_reason == "cancelled" and 1 <= len(result.token_ids) < 200
    assert eng.stats()["reserved_pages"] == 0
    # a stream the consumer leaves early is cancelled too
    events = eng.generate([[1, 2]], max_new_tokens=200, stream=True)
    next(events)
    events.close()
    for _ in range(600):
        if eng.stats()["reserved_pages"] == 0:
            break
        threading.Event().wait(0.05)
    assert eng.stats() == {"running": 0, "waiting": 0, "reserved_pages": 0, "total_pages": 16}
    eng.close()
    # two threads generating on one loaded model at once (one engine under it)
    prompts = [[[5, 4, 3]], [[9, 9]]]
    out = [None, None]
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, loaded.generate(prompts[i], 10)))
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [o[0].token_ids for o in out] == [greedy_tokens(torch_model, p[0], 10) for p in prompts]


def test_text_prompts_stop_strings_and_streams(model):
    loaded, torch_model, cfg = model
    tok = loaded.tokenizer
    prompt = "bab bad baf"
    ids = tok.encode(prompt)
    full = loaded.generate([prompt], max_new_tokens=12)[0]
    assert full.token_ids == greedy_tokens(torch_model, ids, 12)
    assert full.text.strip() == tok.decode(full.token_ids)
    stop_word = tok.decode([full.token_ids[4]])
    if stop_word not in tok.decode(full.token_ids[:4]).split():
        cut = loaded.generate([prompt], max_new_tokens=12, stop=[stop_word])[0]
        assert cut.finish_reason == "stop" and cut.token_ids == full.token_ids[:5]
        assert cut.text == full.text[:full.text.index(stop_word)]
    # a stop string across two tokens: the stream holds its start back, so the pieces add up to the text
    words = tok.decode(full.token_ids[:8]).split()
    if len(set(words)) == len(words):
        span = " ".join(words[5:7])
        events = list(loaded.generate([prompt], max_new_tokens=12, stop=[span], stream=True))
        cut = loaded.generate([prompt], max_new_tokens=12, stop=[span])[0]
        assert cut.finish_reason == "stop" and cut.token_ids == full.token_ids[:7]
        assert "".join(e.text for e in events) == cut.text == full.text[:full.text.index(span)]
    by_id = loaded.generate([ids], max_new_tokens=12, stop=[full.token_ids[2]])[0]
    assert by_id.token_ids == full.token_ids[:3] and by_id.finish_reason == "stop"
    events = list(loaded.generate([prompt, [1, 2, 3]], max_new_tokens=6, stream=True))
    assert "".join(e.text for e in events if e.index == 0) == loaded.generate([prompt], 6)[0].text
    assert [e.finish_reason for e in events if e.finish_reason] == ["length", "length"]
    chat = tok.chat([{"role": "user", "content": "bab"}])
    assert chat == "<s>user: bab assistant:" and tok.encode(chat)[0] == 0


def test_prefill_returns_the_logits_of_the_rows_asked_and_decode_continues(model):
    """A ragged prefill of two prompts: the logits at their last tokens only, or at every token when asked; a decode
    step after it; all equal PyTorch's (fp32)."""
    from wide_tvm.engine import Steps

    loaded, torch_model, cfg = model
    steps = Steps(loaded, 4, 256, 64, cfg.vocab_size)
    a, b = [3, 1, 4], [1, 5, 9, 2, 6]
    with torch.no_grad():
        ref = [torch_model(torch.tensor([p]))[0].numpy() for p in (a, b)]
    for rows, want in (([2, 7], [ref[0][-1], ref[1][-1]]), (list(range(8)), [*ref[0], *ref[1]])):
        steps.add(0)
        steps.add(1)
        got = steps.prefill([0, 1], [3, 5], a + b, rows).numpy()[0]
        assert got.shape == (len(rows), cfg.vocab_size)
        np.testing.assert_allclose(got, np.stack(want), rtol=0, atol=1e-5 * np.abs(want).max())
        nxt = [int(ref[0][-1].argmax()), int(ref[1][-1].argmax())]
        got = steps.decode([0, 1], nxt).numpy()[0]
        with torch.no_grad():
            dec = [torch_model(torch.tensor([p + [t]]))[0, -1].numpy() for p, t in zip((a, b), nxt)]
        np.testing.assert_allclose(got, np.stack(dec), rtol=0, atol=1e-5 * np.abs(dec).max())
        steps.remove(0)
        steps.remove(1)

"""wide-serve (wide_tvm/server.py) as a real process, through the `openai` client: answers equal the engine's,
streaming and not; 32 concurrent clients; malformed requests get 4xx JSON errors; a cancelled stream frees its
cache pages."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

import wide_tvm

openai = pytest.importorskip("openai")


def _http(url: str, body=None, raw: bytes | None = None) -> tuple[int, dict]:
    """(status, JSON answer) of a GET, or a POST of `body` as JSON (or `raw` bytes)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data, {"content-type": "application/json"} if data is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def server(generation_library):
    lib, _, cfg, tokenizer = generation_library
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-c", "import sys; from wide_tvm.cli import serve_main; sys.exit(serve_main())", lib,
           "--tokenizer", tokenizer, "--port", str(port), "--name", "tiny", "--max-batch", "8"]
    env = dict(os.environ, TVM_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if _http(f"{base}/health")[0] == 200:
                break
        except (urllib.error.URLError, ConnectionError):
            if proc.poll() is not None:
                pytest.fail(f"wide-serve exited: {proc.stdout.read()}")
            time.sleep(0.1)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120)
    yield client, base, wide_tvm.load(lib, tokenizer=tokenizer)
    proc.terminate()
    proc.wait(30)


def test_answers_equal_the_engine_streaming_or_not(server):
    client, base, model = server
    assert [m.id for m in client.models.list().data] == ["tiny"]
    prompt = "bab bad baf dab"
    want = model.generate([prompt], max_new_tokens=10)[0]
    got = client.completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0)
    assert got.choices[0].text == want.text and got.choices[0].finish_reason == "length"
    assert got.usage.completion_tokens == 10 and got.usage.prompt_tokens == len(model.tokenizer.encode(prompt))
    pieces = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in pieces) == want.text
    assert pieces[-1].choices[0].finish_reason == "length"
    # token ids in, seeded sampling
    ids = [5, 17, 42]
    sampled = model.generate([ids], max_new_tokens=12, temperature=0.8, top_p=0.9, seed=3)[0]
    got = client.completions.create(model="tiny", prompt=ids, max_tokens=12, temperature=0.8, top_p=0.9, seed=3)
    assert got.choices[0].text == sampled.text
    # chat, through the tokenizer's template
    messages = [{"role": "system", "content": "bab"}, {"role": "user", "content": "bad baf"}]
    want = model.generate([model.tokenizer.chat(messages)], max_new_tokens=8)[0]
    got = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    assert got.choices[0].message.content == want.text and got.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text


def test_32_concurrent_clients_all_complete_with_their_own_tokens(server):
    client, _, model = server
    prompts = [[(7 * i + j) % 200 + 3 for j in range(1 + i % 5)] for i in range(32)]

    def ask(prompt):
        return client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0).choices[0].text

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(ask, prompts))
    assert answers == [model.generate([p], max_new_tokens=6)[0].text for p in prompts]


def test_malformed_requests_get_4xx_json_errors(server):
    client, base, _ = server
    bad = [({"prompt": "bab", "temperature": -1}, 400, "temperature"),
           ({"prompt": [1, 2, 10**6]}, 400, "outside"),
           ({"prompt": [1.5]}, 400, "prompt"),
           ({"prompt": "bab", "max_tokens": 10**6}, 400, "tokens of cache"),
           ({"prompt": "bab", "model": "other"}, 404, "not served"),
           ({"prompt": "bab", "n": 2}, 400, "n"),
           ({}, 400, "prompt"),
           ({"messages": []}, 400, "messages")]
    for body, status, what in bad:
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        code, answer = _http(base + path, body)
        assert code == status and what in answer["error"]["message"], (body, answer)
    code, answer = _http(base + "/v1/completions", raw=b"{not json")
    assert code == 400 and answer["error"]["type"] == "invalid_request_error"
    assert _http(base + "/v1/nothing")[0] == 404
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="bab", top_p=0)
    assert _http(base + "/health")[1]["status"] == "ok"  # (still serving)


def test_a_cancelled_stream_frees_its_cache_pages(server):
    client, base, _ = server
    stream = client.completions.create(model="tiny", prompt="bab bad", max_tokens=3000, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    assert _http(base + "/health")[1]["reserved_pages"] > 0
    stream.close()
    for _ in range(200):
        health = _http(base + "/health")[1]
        if health["reserved_pages"] == 0:
            break
        time.sleep(0.05)
    assert (health["reserved_pages"], health["running"]) == (0, 0), json.dumps(health)

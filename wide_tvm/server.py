"""An OpenAI-compatible HTTP server over one model's engine (FastAPI + uvicorn): `wide-serve LIB --tokenizer DIR`.

    POST /v1/completions         prompt (text, ids, or a list of either), max_tokens, temperature, top_p, top_k,
                                 stop, stop_token_ids, seed, ignore_eos, stream
    POST /v1/chat/completions    messages rendered by the tokenizer's chat template, the same sampling fields
    GET  /v1/models              the one model served
    GET  /health                 {"status": "ok"} plus the engine's load (running, waiting, cache pages reserved)

Every request becomes engine requests (wide_tvm/engine.py), batched continuously with whatever else runs. With
"stream": true the answer is server-sent events, one chunk per token, then `data: [DONE]`. A malformed request
gets a 4xx JSON error in OpenAI's shape ({"error": {"message", "type", "param", "code"}}), never a crash; a client
that disconnects cancels its requests, which frees their cache pages.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, Literal, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from .errors import WideError
from .sampling import SamplingParams

DEFAULT_CHAT_TOKENS = 256  # (max_tokens absent from a chat request: up to this, within the cache)


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    stop: Union[str, list[str], None] = None
    stop_token_ids: list[int] | None = None
    seed: int | None = Field(None, ge=0)
    ignore_eos: bool = False
    stream: bool = False
    n: int = Field(1, ge=1, le=1)
    logprobs: Any = None


class CompletionRequest(_Sampling):
    prompt: Union[str, list[int], list[str], list[list[int]]]


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Union[str, list[dict], None] = None


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)


class _ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        self.status, self.message, self.kind, self.param = status, message, kind, param


def create_app(model, name: str):
    """The FastAPI app serving `model` (runtime.WideModel with a tokenizer) as `name`."""
    engine = model.engine()
    tokenizer = model.tokenizer
    app = FastAPI(title="wide-serve", docs_url=None, redoc_url=None)

    def error(status: int, message: str, kind: str = "invalid_request_error", param=None):
        return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}},
                            status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            return error(400, "the request body is not valid JSON")
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return error(400, f"{where}: {first.get('msg', 'invalid request')}" if where else
                     first.get("msg", "invalid request"), param=where or None)

    @app.exception_handler(HTTPException)
    async def _http(_request, exc: HTTPException):
        return error(exc.status_code, str(exc.detail), "not_found_error" if exc.status_code == 404 else
                     "invalid_request_error")

    @app.exception_handler(_ApiError)
    async def _api(_request, exc: _ApiError):
        return error(exc.status, exc.message, exc.kind, exc.param)

    @app.get("/health")
    async def health():
        return {"status": "ok", **engine.stats()}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "wide-tvm"}]}

    def params(body: _Sampling, prompt_len: int, default_max: int | None) -> SamplingParams:
        if body.model not in (None, name):
            raise _ApiError(404, f"model {body.model!r} is not served here (this server serves {name!r})",
                            "not_found_error", "model")
        if body.logprobs not in (None, False, 0):
            raise _ApiError(400, "logprobs are not supported", param="logprobs")
        new = body.max_tokens or body.max_completion_tokens
        if new is None:  # (absent: the default, within what the cache holds beside the prompt)
            new = max(min(default_max or engine.max_total, engine.max_total - prompt_len), 1)
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        try:
            return SamplingParams(new, body.temperature, body.top_p, body.top_k, tuple(body.stop_token_ids or ()),
                                  tuple(stop), body.seed, body.ignore_eos)
        except WideError as err:
            raise _ApiError(400, str(err)) from None

    def submit(prompts: list, body: _Sampling, default_max: int | None, on_event):
        requests = []
        try:
            for i, prompt in enumerate(prompts):
                ids = engine.check_prompt(prompt, i)
                requests.append(engine.submit(ids, params(body, len(ids), default_max), on_event, i))
        except (WideError, _ApiError) as err:
            for r in requests:
                engine.cancel(r)
            if isinstance(err, _ApiError):
                raise
            raise _ApiError(400, str(err), param="prompt") from None
        return requests

    async def run(http: Request, prompts: list, body: _Sampling, default_max, make_chunk, make_final):
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        requests = submit(prompts, body, default_max,
                          lambda event: loop.call_soon_threadsafe(events.put_nowait, event))
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

        async def next_events():
            open_ = len(requests)
            while open_:
                try:
                    event = await asyncio.wait_for(events.get(), 0.5)
                except asyncio.TimeoutError:
                    if await http.is_disconnected():
                        return
                    continue
                if event.finish_reason is not None:
                    open_ -= 1
                    if event.finish_reason == "error":
                        raise _ApiError(500, str(requests[event.index].error), "server_error")
                yield event

        def usage():
            done = [r.result for r in requests]
            new = sum(len(g.token_ids) for g in done)
            prompt = sum(g.prompt_tokens for g in done)
            return {"prompt_tokens": prompt, "completion_tokens": new, "total_tokens": prompt + new}

        if body.stream:
            async def sse():
                try:
                    first = make_chunk(rid, created, None, None)
                    for i in range(len(requests)):
                        if first is not None:
                            yield f"data: {json.dumps(first(i))}\n\n"
                    async for event in next_events():
                        chunk = make_chunk(rid, created, event, requests[event.index])
                        if chunk is not None:
                            yield f"data: {json.dumps(chunk)}\n\n"
                    yield "data: [DONE]\n\n"
                except _ApiError as err:
                    failure = {"error": {"message": err.message, "type": err.kind}}
                    yield f"data: {json.dumps(failure)}\n\n"
                finally:  # (the client went away, or the stream ended: nothing keeps running for it)
                    for r in requests:
                        if not r.done.is_set():
                            engine.cancel(r)

            return StreamingResponse(sse(), media_type="text/event-stream")
        try:
            async for _ in next_events():
                pass
        finally:
            for r in requests:
                if not r.done.is_set():
                    engine.cancel(r)
        return make_final(rid, created, requests, usage())

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: Request):
        prompt = body.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            prompts = [prompt]
        else:
            prompts = list(prompt)
        if not prompts:
            raise _ApiError(400, "prompt: empty", param="prompt")

        def chunk(rid, created, event, request):
            if event is None:
                return None
            if event.finish_reason is None and not event.text:
                return None
            return {"id": rid, "object": "text_completion", "created": created, "model": name,
                    "choices": [{"index": event.index, "text": event.text, "logprobs": None,
                                 "finish_reason": _reason(event.finish_reason)}]}

        def final(rid, created, requests, usage):
            return {"id": rid, "object": "text_completion", "created": created, "model": name,
                    "choices": [{"index": r.index, "text": r.result.text, "logprobs": None,
                                 "finish_reason": _reason(r.result.finish_reason)} for r in requests],
                    "usage": usage}

        return await run(http, prompts, body, 16, chunk, final)  # (OpenAI's default max_tokens: 16)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, http: Request):
        messages = [{"role": m.role, "content": _text(m.content)} for m in body.messages]
        try:
            prompt = tokenizer.chat(messages)
        except WideError as err:
            raise _ApiError(400, str(err), param="messages") from None

        def chunk(rid, created, event, request):
            base = {"id": f"chat{rid}", "object": "chat.completion.chunk", "created": created, "model": name}
            if event is None:  # (the first chunk of each choice: the role)
                return lambda i: base | {"choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                      "finish_reason": None}]}
            if event.finish_reason is None and not event.text:
                return None
            delta = {"content": event.text} if event.finish_reason is None else {}
            return base | {"choices": [{"index": event.index, "delta": delta,
                                        "finish_reason": _reason(event.finish_reason)}]}

        def final(rid, created, requests, usage):
            return {"id": f"chat{rid}", "object": "chat.completion", "created": created, "model": name,
                    "choices": [{"index": r.index, "message": {"role": "assistant", "content": r.result.text},
                                 "finish_reason": _reason(r.result.finish_reason)} for r in requests],
                    "usage": usage}

        return await run(http, [prompt], body, DEFAULT_CHAT_TOKENS, chunk, final)

    return app


def _reason(reason: str | None) -> str | None:
    return {"cancelled": "abort"}.get(reason, reason)


def _text(content) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def serve(model, name: str, host: str, port: int) -> None:
    """Run the server until interrupted."""
    import uvicorn

    uvicorn.run(create_app(model, name), host=host, port=port, log_level="warning")

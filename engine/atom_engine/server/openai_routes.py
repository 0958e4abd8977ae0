"""The OpenAI routes: /v1/completions, /v1/chat/completions (plain and SSE), /v1/models.

A request's life: parse and check (400), encode, queue (400 if it can never fit, 429 if the queue is full, 503
if the engine is dead), then stream the engine's outputs. Streaming responses send their headers with the first
token, so a request that fails before producing anything (a prefill worker that is gone) still gets a plain
503 with an error body; a failure after the first token ends the stream with an error event and ``[DONE]``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from atom_engine.engine import LLMEngine
from atom_engine.sequence import QueueFull, RequestRejected, SamplingParams, Sequence, StepOutput
from atom_engine.server.chat import ChatTemplate
from atom_engine.server.engine_loop import AsyncEngine, EngineDead
from atom_engine.server.errors import ApiError, error_body
from atom_engine.server.metrics import ServerMetrics
from atom_engine.server.protocol import ChatCompletionRequest, CompletionRequest, _Common, parse

log = logging.getLogger("atom_engine.server")
PREFILL_UNAVAILABLE = "PrefillUnavailable"
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass
class _Call:
    """One request being served: what the route needs to format chunks and the final response."""

    rid: str
    kind: str  # "completion" or "chat"
    req: _Common
    seq: Sequence
    created: int = field(default_factory=lambda: int(time.time()))
    sent: str = ""
    tokens: list[int] = field(default_factory=list)  # as delivered: seq.output is the engine thread's to change


class OpenAIRoutes:
    def __init__(self, engine: LLMEngine, aengine: AsyncEngine, metrics: ServerMetrics) -> None:
        self.engine, self.aengine, self.metrics = engine, aengine, metrics
        self.model_name = engine.settings.model_name
        self.chat_template = ChatTemplate(engine.settings.model_source)
        self.rejected = 0

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v1/completions", self.completions), web.post("/v1/chat/completions", self.chat),
                web.get("/v1/models", self.models)]

    async def models(self, _request: web.Request) -> web.Response:
        card = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "atom",
                "max_model_len": self.engine.settings.max_seq_len}
        return web.json_response({"object": "list", "data": [card]})

    # -- routes -----------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        rid = f"cmpl-{uuid.uuid4().hex}"
        try:
            req = parse(CompletionRequest, await _json(request))
            self._check_model(req.model)
            prompt = req.prompt
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
                if len(prompt) != 1:
                    raise ApiError(400, f"prompt: one prompt per request (n=1); got {len(prompt)}", param="prompt")
                prompt = prompt[0]
            ids = self._encode(prompt)
            return await self._serve(request, rid, "completion", req, ids, DEFAULT_COMPLETION_TOKENS)
        except ApiError as exc:
            self.rejected += 1
            log.info("event=request_refused request_id=%s status=%d message=%r", rid, exc.status, exc.message)
            return exc.response()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        try:
            req = parse(ChatCompletionRequest, await _json(request))
            self._check_model(req.model)
            ids = self._encode(self.chat_template.render(req.messages))
            default = max(1, self.engine.settings.max_seq_len - len(ids))  # as vLLM: the rest of the context
            return await self._serve(request, rid, "chat", req, ids, default)
        except ApiError as exc:
            self.rejected += 1
            log.info("event=request_refused request_id=%s status=%d message=%r", rid, exc.status, exc.message)
            return exc.response()

    def _check_model(self, model: str) -> None:
        if model != self.model_name:
            raise ApiError(400, f"model {model!r} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    def _encode(self, prompt: str | list[int]) -> list[int]:
        try:
            return self.engine.encode(prompt)
        except RequestRejected as exc:
            raise ApiError(400, str(exc), param="prompt", code="invalid_prompt") from None

    # -- serving ----------------------------------------------------------------------------------
    async def _serve(self, request: web.Request, rid: str, kind: str, req: _Common, ids: list[int],
                     default_max_tokens: int) -> web.StreamResponse:
        try:
            params = req.sampling(default_max_tokens)
        except ValueError as exc:
            raise ApiError(400, str(exc), code="invalid_value") from None
        arrived = time.perf_counter()
        try:
            seq, stream = await self.aengine.submit(ids, params, rid)
        except RequestRejected as exc:
            context = "maximum context length" in str(exc)
            raise ApiError(400, str(exc), param="max_tokens" if context else "prompt",
                           code="context_length_exceeded" if context else "invalid_prompt") from None
        except QueueFull as exc:
            raise ApiError(429, str(exc), code="queue_full") from None
        except EngineDead as exc:
            raise ApiError(503, str(exc), code="engine_dead") from None
        log.info("event=request_queued request_id=%s kind=%s prompt_tokens=%d max_tokens=%d stream=%s", rid, kind,
                 len(ids), params.max_tokens, req.stream)
        call = _Call(rid, kind, req, seq)
        async with aclosing(self._timed(stream, arrived)) as outs:
            if req.stream:
                return await self._sse(request, call, outs, params)
            return await self._whole(call, outs)

    async def _timed(self, stream: AsyncIterator[StepOutput], arrived: float) -> AsyncIterator[StepOutput]:
        last = None
        async with aclosing(stream) as outs:
            async for out in outs:
                now = time.perf_counter()
                if out.new_tokens:
                    hist = self.metrics.ttft if last is None else self.metrics.itl
                    hist.labels(self.model_name).observe(now - (arrived if last is None else last))
                    last = now
                if out.finished:
                    self.metrics.e2e.labels(self.model_name).observe(now - arrived)
                yield out

    def _failure(self, call: _Call, error: str | None) -> ApiError:
        log.warning("event=request_failed request_id=%s error=%r", call.rid, error)
        if error and error.startswith(PREFILL_UNAVAILABLE):
            return ApiError(503, error, code="prefill_unavailable")
        return ApiError(500, error or "the request failed", code="internal_error")

    async def _whole(self, call: _Call, outs: AsyncIterator[StepOutput]) -> web.Response:
        last = None
        try:
            async for out in outs:
                last = out
        except EngineDead as exc:
            raise ApiError(503, str(exc), code="engine_dead") from None
        assert last is not None and last.finished
        if last.finish_reason == "error":
            raise self._failure(call, last.error)
        result = self.engine.output(call.seq)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": last.finish_reason}
        if call.kind == "chat":
            choice["message"] = {"role": "assistant", "content": result.text or ""}
        else:
            choice["text"] = result.text or ""
        if call.req.return_token_ids:
            choice["token_ids"] = result.token_ids
        body = {**self._head(call), "choices": [choice], "usage": _usage(call.seq)}
        if call.req.return_token_ids:
            body["prompt_token_ids"] = result.prompt_token_ids
        log.info("event=request_done request_id=%s finish_reason=%s tokens=%d", call.rid, last.finish_reason,
                 len(result.token_ids))
        return web.json_response(body)

    async def _sse(self, request: web.Request, call: _Call, outs: AsyncIterator[StepOutput],
                   params: SamplingParams) -> web.StreamResponse:
        resp: web.StreamResponse | None = None
        hold = max((len(s) for s in params.stop), default=1) - 1  # never send text a stop string may cut

        async def send(obj: dict | str) -> None:
            nonlocal resp
            if resp is None:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
                await resp.prepare(request)
                if call.kind == "chat":
                    await send(self._chunk(call, {"role": "assistant", "content": ""}, None, None))
            data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
            await resp.write(f"data: {data}\n\n".encode())

        try:
            async for out in outs:
                if out.finished and out.finish_reason == "error":
                    error = self._failure(call, out.error)
                    if resp is None:
                        return error.response()
                    await send(error_body(error.status, error.message, code=error.code))
                    break
                text = self._text(call, out, hold)
                if out.new_tokens or text or out.finished:
                    await send(self._chunk(call, text, out.finish_reason if out.finished else None,
                                           list(out.new_tokens)))
                if out.finished:
                    opts = call.req.stream_options
                    if opts is not None and opts.include_usage:
                        await send({**self._head(call, chunk=True), "choices": [], "usage": _usage(call.seq)})
                    log.info("event=request_done request_id=%s finish_reason=%s tokens=%d", call.rid,
                             out.finish_reason, len(call.seq.output))
        except EngineDead as exc:
            if resp is None:
                return ApiError(503, str(exc), code="engine_dead").response()
            await send(error_body(503, str(exc), code="engine_dead"))
        await send("[DONE]")
        assert resp is not None
        await resp.write_eof()
        return resp

    def _text(self, call: _Call, out: StepOutput, hold: int) -> str:
        tok = self.engine.tokenizer
        if tok is None:
            return ""
        call.tokens.extend(out.new_tokens)
        if out.finished:  # the engine is done with the sequence: its stop_text is final
            full = call.seq.stop_text if call.seq.stop_text is not None else tok.decode(call.tokens)
        else:
            full = tok.decode(call.tokens)
            full = full[: len(full) - hold] if hold else full
            if full.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for its next bytes
                full = full.rstrip("\ufffd")
        if not full.startswith(call.sent):
            return ""
        delta, call.sent = full[len(call.sent):], full
        return delta

    def _head(self, call: _Call, *, chunk: bool = False) -> dict[str, Any]:
        obj = {"completion": "text_completion", "chat": "chat.completion"}[call.kind]
        if chunk and call.kind == "chat":
            obj = "chat.completion.chunk"
        return {"id": call.rid, "object": obj, "created": call.created, "model": self.model_name}

    def _chunk(self, call: _Call, content: str | dict, finish: str | None, token_ids: list[int] | None) -> dict:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if call.kind == "chat":
            choice["delta"] = content if isinstance(content, dict) else ({"content": content} if content else {})
        else:
            choice["text"] = content
        if call.req.return_token_ids and token_ids is not None:
            choice["token_ids"] = token_ids
        return {**self._head(call, chunk=True), "choices": [choice]}


def _usage(seq: Sequence) -> dict[str, Any]:
    return {"prompt_tokens": len(seq.prompt), "completion_tokens": len(seq.output),
            "total_tokens": len(seq.prompt) + len(seq.output),
            "prompt_tokens_details": {"cached_tokens": seq.cached_tokens}}


async def _json(request: web.Request) -> Any:
    try:
        return json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None

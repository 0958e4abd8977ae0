"""The OpenAI routes: /v1/completions, /v1/chat/completions (plain and SSE), /v1/models, and vLLM's /tokenize and
/detokenize.

A request's life: parse and check (400; an unknown model 404), encode, queue one sequence per choice (each
prompt times ``n``; 400 if one can never fit, 429 if the queue is full, 503 if the engine is dead: the choices
queued before are cancelled), then stream the engine's outputs. Streaming responses send their headers with the
first token, so a request that fails before producing anything (a prefill worker that is gone) still gets a
plain 503 with an error body; a failure after the first token ends the stream with an error event and
``[DONE]``. A client that leaves cancels every choice of its request (an info-level event, not an error).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, aclosing
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web

from atom_engine.engine import LLMEngine
from atom_engine.errors import ContextTooLong, KVRefused, KVUnavailable, QueueFull, RequestRejected
from atom_engine.sequence import FinishReason, SamplingParams, StepOutput, TokenLogprob
from atom_engine.server.chat import ChatTemplate
from atom_engine.server.engine_loop import AsyncEngine, EngineDead
from atom_engine.server.error_responses import ApiError, error_body
from atom_engine.server.logprobs import chat_logprobs, completion_logprobs, prompt_logprobs_vllm, token_text_fn
from atom_engine.server.metrics import ServerMetrics
from atom_engine.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    SamplingRequest,
    TokenizeRequest,
    parse,
)
from atom_engine.server.responses_route import ResponsesAPI
from atom_engine.server.structured import StructuredOutputs
from atom_engine.server.tool_stream import ToolStream
from atom_engine.server.tools import ToolRequest, chat_message, chat_tools, check_template, tool_request

log = logging.getLogger("atom_engine.server")
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass
class _Choice:
    """One sequence of a request (one prompt, one of its ``n``) and what the engine has delivered of it: the
    server knows a request only by its outputs (:class:`StepOutput`), never by the engine's ``Sequence``."""

    index: int
    request_id: str
    prompt: list[int]
    stream: AsyncIterator[StepOutput]
    prompt_text: str  # for echo
    tokens: list[int] = field(default_factory=list)  # as delivered
    logprobs: list[TokenLogprob] = field(default_factory=list)  # as delivered, one per token (when asked)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    cached_tokens: int = 0
    text_offset: int = 0  # of the next logprob token (completions, streamed)
    finish: StepOutput | None = None

    def take(self, out: StepOutput) -> None:
        """Record what an output delivers."""
        self.tokens.extend(out.new_tokens)
        self.logprobs.extend(out.logprobs)
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = list(out.prompt_logprobs)
        self.cached_tokens = out.cached_tokens
        if out.finished:
            self.finish = out


@dataclass
class _Call:
    """One request being served: what the route needs to format chunks and the final response."""

    rid: str
    kind: str  # "completion" or "chat"
    req: SamplingRequest
    choices: list[_Choice]
    prompt_tokens: int  # each prompt once, as vLLM counts them (not once per n)
    tools: ToolRequest | None = None  # chat: the tools whose calls the output may hold (parsed out of the text)
    created: int = field(default_factory=lambda: int(time.time()))


class OpenAIRoutes:
    def __init__(self, engine: LLMEngine, aengine: AsyncEngine, metrics: ServerMetrics) -> None:
        self.engine, self.aengine, self.metrics = engine, aengine, metrics
        self.model_name = engine.settings.model_name
        self.chat_template = ChatTemplate(engine.settings.model_source, engine.settings.chat_template)
        self.structured = StructuredOutputs(engine)
        self.responses_api = ResponsesAPI(self)
        self.rejected = 0

    # method, path, handler: the server registers these (answering 503 until the model is loaded)
    ROUTES = (("POST", "/v1/completions", "completions"), ("POST", "/v1/chat/completions", "chat"),
              ("GET", "/v1/models", "models"), ("POST", "/tokenize", "tokenize"),
              ("POST", "/detokenize", "detokenize"), ("GET", "/tokenizer_info", "tokenizer_info"),
              ("POST", "/v1/responses", "responses"), ("GET", "/v1/responses/{response_id}", "get_response"))

    async def models(self, _request: web.Request) -> web.Response:
        card = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "atom",
                "root": self.engine.settings.model_source, "parent": None,
                "max_model_len": self.engine.settings.max_seq_len, "permission": []}
        return web.json_response({"object": "list", "data": [card]})

    # -- routes -----------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        rid = f"cmpl-{uuid.uuid4().hex}"
        try:
            req = parse(CompletionRequest, await _json(request))
            self._check_model(req.model)
            req.check()
            req.check_vocab(self.engine.vocab_size)
            prompts = [(p if isinstance(p, str) else None, self._encode(p)) for p in req.prompts()]
            params = self._params(lambda: req.completion_sampling(DEFAULT_COMPLETION_TOKENS))
            params = await self.structured.apply(req.grammar(), params)
            self._check_prompt_logprobs(params)
            return await self._serve(request, rid, "completion", req, prompts, params)
        except ApiError as exc:
            return self._refused(rid, exc)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        try:
            req = parse(ChatCompletionRequest, await _json(request))
            self._check_model(req.model)
            req.check()
            req.check_vocab(self.engine.vocab_size)
            tools = chat_tools(req, self.chat_template.tool_format, self.engine.settings.model_source)
            ids = self._encode(self.chat_template.render(req.messages, tools=tools.rendered), add_special_tokens=False)
            default = max(1, self.engine.settings.max_seq_len - len(ids))  # as vLLM: the rest of the context
            params = self._params(lambda: req.chat_sampling(default))
            params = await self.structured.apply(tools.grammar, params)
            return await self._serve(request, rid, "chat", req, [(None, ids)], params, tools.parse)
        except ApiError as exc:
            return self._refused(rid, exc)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self.responses_api.create(request)

    async def get_response(self, request: web.Request) -> web.Response:
        return await self.responses_api.get(request)

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize: ``{"count", "max_model_len", "tokens", "token_strs"}``."""
        try:
            req = parse(TokenizeRequest, await _json(request))
            if req.model is not None:
                self._check_model(req.model)
            req.check()
            if req.messages is None:
                text, specials = req.prompt, req.add_special_tokens
            else:  # a rendered template holds its own special tokens (vLLM's chat default)
                tools = tool_request(req.tools, None, None)
                check_template(tools, False, self.chat_template.tool_format, self.engine.settings.model_source)
                rendered = list(tools.tools) if tools is not None else None
                text, specials = self.chat_template.render(req.messages, req.add_generation_prompt, rendered), False
            ids = self._encode(text, add_special_tokens=specials) if text else []
            strs = [self._text_of(t) for t in ids] if req.return_token_strs else None
            return web.json_response({"count": len(ids), "max_model_len": self.engine.settings.max_seq_len,
                                      "tokens": ids, "token_strs": strs})
        except ApiError as exc:
            return self._refused("tokenize", exc)

    async def tokenizer_info(self, _request: web.Request) -> web.Response:
        """vLLM's /tokenizer_info: the tokenizer's special tokens and chat template, so a client (lm-eval's
        remote tokenizer) can tokenize through /tokenize without the checkpoint's files."""
        from atom_engine.server.chat import template_source

        template, specials = template_source(self.engine.settings.model_source, self.engine.settings.chat_template)
        info = {"tokenizer_class": type(self.engine.tokenizer).__name__, "eos_token": None, "bos_token": None,
                "pad_token": None, **specials, "chat_template": template,
                "model_max_length": self.engine.settings.max_seq_len}
        return web.json_response(info)

    async def detokenize(self, request: web.Request) -> web.Response:
        """vLLM's /detokenize: ``{"prompt": text}``."""
        try:
            req = parse(DetokenizeRequest, await _json(request))
            if req.model is not None:
                self._check_model(req.model)
            self.engine.encode(req.tokens)  # the range check (400 naming the bound)
            if self.engine.tokenizer is None:
                raise ApiError(400, "tokens: this model has no tokenizer", param="tokens", code="invalid_value")
            return web.json_response({"prompt": self.engine.tokenizer.decode(req.tokens)})
        except RequestRejected as exc:
            return self._refused("detokenize", ApiError(400, f"tokens: {exc}", param="tokens", code="invalid_value"))
        except ApiError as exc:
            return self._refused("detokenize", exc)

    def _refused(self, rid: str, exc: ApiError) -> web.Response:
        self.rejected += 1
        log.info("event=request_refused request_id=%s status=%d message=%r", rid, exc.status, exc.message)
        return exc.response()

    def _check_prompt_logprobs(self, params: SamplingParams) -> None:
        """Prompt logprobs need every prompt token's logits from prefill: the cpu backend has them; a compiled
        static-shape prefill graph returns only the last token's (refused here, not failed later)."""
        if params.prompt_logprobs is None or not self.engine.settings.local_prefill:
            return  # remote prefill: the worker's backend decides (a refusal there fails the request)
        if not self.engine.capabilities.every_token_logits:
            raise ApiError(400, f"echo with logprobs (prompt logprobs): the {self.engine.settings.backend} backend's"
                           " prefill returns only the last token's logits", param="echo", code="invalid_value")

    def _check_model(self, model: str) -> None:
        if model != self.model_name:
            # OpenAI's and vLLM's answer: 404, so clients raise NotFoundError.
            raise ApiError(404, f"The model `{model}` does not exist; this server serves `{self.model_name}`.",
                           param="model", code="model_not_found", err_type="invalid_request_error")

    def _encode(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        try:
            return self.engine.encode(prompt, add_special_tokens)
        except RequestRejected as exc:
            raise ApiError(400, str(exc), param="prompt", code="invalid_prompt") from None

    @staticmethod
    def _params(build: Any) -> SamplingParams:
        try:
            return build()
        except ValueError as exc:  # SamplingParams' own bounds; its messages start with the field's name
            raise ApiError(400, str(exc), param=str(exc).split()[0], code="invalid_value") from None

    def _text_of(self, token: int) -> str:
        tok = self.engine.tokenizer
        return f"token_id:{token}" if tok is None else tok.decode([token])

    # -- serving ----------------------------------------------------------------------------------
    async def _serve(self, request: web.Request, rid: str, kind: str, req: SamplingRequest,
                     prompts: list[tuple[str | None, list[int]]], params: SamplingParams,
                     tools: ToolRequest | None = None) -> web.StreamResponse:
        arrived = time.perf_counter()
        n = req.n
        choices: list[_Choice] = []
        async with AsyncExitStack() as streams:
            try:
                for p, (text, ids) in enumerate(prompts):
                    for j in range(n):
                        index = p * n + j
                        # vLLM seeds choice j of a seeded request with seed + j: reproducible and distinct.
                        sp = params if params.seed is None or j == 0 else replace(params, seed=params.seed + j)
                        request_id = rid if len(prompts) * n == 1 else f"{rid}-{index}"
                        outputs = await self.aengine.submit(ids, sp, request_id)
                        streams.callback(outputs.close)  # cancels even if never read: a client gone at once
                        stream = await streams.enter_async_context(aclosing(self._timed(outputs, arrived)))
                        prompt_text = text if text is not None else self._decode(ids) if self._echo(req) else ""
                        choices.append(_Choice(index, request_id, ids, stream, prompt_text))
            except (RequestRejected, QueueFull, EngineDead) as exc:
                raise submit_error(exc) from None
            finally:
                if len(choices) < len(prompts) * n:  # refused part way: the choices queued go
                    for c in choices:
                        self.aengine.abandon(c.request_id)
            log.info("event=request_queued request_id=%s kind=%s prompts=%d n=%d prompt_tokens=%d max_tokens=%d"
                     " stream=%s", rid, kind, len(prompts), n, sum(len(ids) for _, ids in prompts),
                     params.max_tokens, req.stream)
            call = _Call(rid, kind, req, choices, sum(len(ids) for _, ids in prompts), tools=tools)
            if req.stream:
                return await self._sse(request, call)
            return await self._whole(call)

    @staticmethod
    def _echo(req: SamplingRequest) -> bool:
        return isinstance(req, CompletionRequest) and req.echo

    def _decode(self, ids: list[int]) -> str:
        return self.engine.tokenizer.decode(ids) if self.engine.tokenizer is not None else ""

    async def _timed(self, stream: AsyncIterator[StepOutput], arrived: float) -> AsyncIterator[StepOutput]:
        last = None
        async with aclosing(stream) as outs:
            async for out in outs:
                now = time.perf_counter()
                if out.new_tokens:
                    hist = self.metrics.ttft if last is None else self.metrics.itl
                    hist.observe(now - (arrived if last is None else last))
                    last = now
                if out.finished:
                    self.metrics.e2e.observe(now - arrived)
                yield out

    def _failure(self, call: _Call, out: StepOutput) -> ApiError:
        """A failed request's answer: 503 when the prompt's KV could not be brought (no prefill worker), a prefill
        worker's 4xx when it refused the request itself, else 500."""
        log.warning("event=request_failed request_id=%s error=%r", call.rid, out.error)
        if isinstance(out.failure, KVUnavailable):
            return ApiError(503, out.error or "the prompt's KV is unavailable", code="prefill_unavailable")
        if isinstance(out.failure, KVRefused):  # a prefill worker refused the request itself: its 4xx
            return ApiError(out.failure.status, out.error or "the request was refused", param="prompt",
                            code=out.failure.code or "invalid_request")
        return ApiError(500, out.error or "the request failed", code="internal_error")

    # -- whole responses --------------------------------------------------------------------------
    async def _whole(self, call: _Call) -> web.Response:
        async def drain(c: _Choice) -> None:
            async for out in c.stream:
                c.take(out)

        try:
            await asyncio.gather(*(drain(c) for c in call.choices))
        except EngineDead as exc:
            raise ApiError(503, str(exc), code="engine_dead") from None
        for c in call.choices:
            assert c.finish is not None and c.finish.finished
            if c.finish.finish_reason is FinishReason.ERROR:
                raise self._failure(call, c.finish)
        body = {**self._head(call), "choices": [self._final_choice(call, c) for c in call.choices],
                "usage": self._usage(call)}
        if call.req.return_token_ids and len(call.choices) == 1:
            body["prompt_token_ids"] = call.choices[0].prompt
        log.info("event=request_done request_id=%s finish_reasons=%s tokens=%d", call.rid,
                 ",".join(str(c.finish.finish_reason) for c in call.choices if c.finish is not None),
                 sum(len(c.tokens) for c in call.choices))
        return web.json_response(body)

    def _final_choice(self, call: _Call, c: _Choice) -> dict[str, Any]:
        req, end = call.req, c.finish
        assert end is not None
        choice: dict[str, Any] = {"index": c.index, "logprobs": None, "finish_reason": end.finish_reason,
                                  "stop_reason": end.stop_reason}
        text_of = token_text_fn(self.engine.tokenizer, req.return_tokens_as_token_ids)
        if isinstance(req, ChatCompletionRequest):
            choice["message"], called = chat_message(end.final_text or "", call.tools)
            if called and end.finish_reason is FinishReason.STOP:
                choice["finish_reason"] = "tool_calls"
            if req.logprobs:
                choice["logprobs"] = chat_logprobs(c.logprobs, text_of)
        else:
            assert isinstance(req, CompletionRequest)
            text, tokens, entries = end.final_text or "", list(c.tokens), list[TokenLogprob | None](c.logprobs)
            if req.echo:
                prompt_entries = c.prompt_logprobs or [None] * len(c.prompt)
                if req.echo_only:
                    text, tokens, entries = c.prompt_text, list(c.prompt), list(prompt_entries)
                else:
                    text, tokens, entries = c.prompt_text + text, c.prompt + tokens, prompt_entries + entries
            choice["text"] = text
            if req.logprobs is not None:
                choice["logprobs"], _ = completion_logprobs(tokens, entries, req.logprobs, text_of)
            if req.prompt_logprobs is not None:
                choice["prompt_logprobs"] = prompt_logprobs_vllm(c.prompt_logprobs or [], text_of)
        if req.return_token_ids:
            choice["token_ids"] = list(c.tokens)
            if len(call.choices) > 1:
                choice["prompt_token_ids"] = c.prompt
        return choice

    def _usage(self, call: _Call) -> dict[str, Any]:
        completion = sum(len(c.tokens) for c in call.choices)
        cached = sum(c.cached_tokens for c in call.choices[:: call.req.n])
        return {"prompt_tokens": call.prompt_tokens, "completion_tokens": completion,
                "total_tokens": call.prompt_tokens + completion, "prompt_tokens_details": {"cached_tokens": cached}}

    # -- streams ----------------------------------------------------------------------------------
    async def _sse(self, request: web.Request, call: _Call) -> web.StreamResponse:
        resp: web.StreamResponse | None = None
        opts = call.req.stream_options
        continuous = opts is not None and opts.continuous_usage_stats
        tool_streams = {c.index: ToolStream(call.tools.parallel) for c in call.choices} if call.tools is not None \
            else {}
        per_token = bool(getattr(call.req, "logprobs", None) or call.req.return_token_ids or continuous)

        async def send(obj: dict | str) -> None:
            nonlocal resp
            if resp is None:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
                await resp.prepare(request)
                if call.kind == "chat":
                    for c in call.choices:
                        await send(self._chunk(call, c, {"role": "assistant", "content": ""}, None, None))
            data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
            await resp.write(f"data: {data}\n\n".encode())

        try:
            try:
                # Closed on the way out, a client gone included: its pump tasks end before the choices' streams
                # are closed under them (closing a stream a pump task is reading raises "already running").
                async with aclosing(_merge(call.choices)) as merged:
                    async for c, out in merged:
                        if out.finished and out.finish_reason is FinishReason.ERROR:
                            error = self._failure(call, out)
                            if resp is None:
                                return error.response()
                            await send(error_body(error.status, error.message, code=error.code))
                            break
                        first = not c.tokens
                        c.take(out)
                        text = out.text  # the engine's detokenizer: held back where a stop string may still cut
                        finish = out.finish_reason if out.finished else None
                        delta: str | dict = text
                        if (ts := tool_streams.get(c.index)) is not None:  # tool calls leave the text as deltas
                            text, changes = ts.feed(text, out.finished)
                            calls = [d for d in (ch.openai() for ch in changes) if d is not None]
                            delta = {**({"content": text} if text else {}), "tool_calls": calls} if calls else text
                            if finish is FinishReason.STOP and ts.called:
                                finish = "tool_calls"
                        # A chat chunk that would say nothing (its tokens' text held back: a call being read, a
                        # stop string that may still match) is not sent, unless it carries what was asked per
                        # token (as vLLM skips a delta its tool parser holds).
                        if delta or out.finished or (out.new_tokens and (call.kind != "chat" or per_token)):
                            chunk = self._chunk(call, c, delta, finish, out, first=first)
                            if continuous:
                                chunk["usage"] = self._choice_usage(c)
                            await send(chunk)
                        if out.finished:
                            log.info("event=choice_done request_id=%s index=%d finish_reason=%s tokens=%d", call.rid,
                                     c.index, out.finish_reason, len(c.tokens))
                    else:
                        if opts is not None and opts.include_usage:
                            await send({**self._head(call, chunk=True), "choices": [], "usage": self._usage(call)})
            except EngineDead as exc:
                if resp is None:
                    return ApiError(503, str(exc), code="engine_dead").response()
                await send(error_body(503, str(exc), code="engine_dead"))
            await send("[DONE]")
            assert resp is not None
            await resp.write_eof()
        except ConnectionResetError:
            # The client left mid-stream: its choices are cancelled as the streams close. Not an error.
            log.info("event=client_disconnected request_id=%s", call.rid)
        assert resp is not None
        return resp

    def _head(self, call: _Call, *, chunk: bool = False) -> dict[str, Any]:
        obj = {"completion": "text_completion", "chat": "chat.completion"}[call.kind]
        if chunk and call.kind == "chat":
            obj = "chat.completion.chunk"
        return {"id": call.rid, "object": obj, "created": call.created, "model": self.model_name}

    def _chunk(self, call: _Call, c: _Choice, content: str | dict, finish: str | None, out: StepOutput | None,
               *, first: bool = False) -> dict:
        req = call.req
        choice: dict[str, Any] = {"index": c.index, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = out.stop_reason if out is not None else None
        new = list(out.new_tokens) if out is not None else []
        entries = list[TokenLogprob | None](out.logprobs if out is not None else ())  # one per new token
        text_of = token_text_fn(self.engine.tokenizer, req.return_tokens_as_token_ids)
        if call.kind == "chat":
            choice["delta"] = content if isinstance(content, dict) else ({"content": content} if content else {})
            if isinstance(req, ChatCompletionRequest) and req.logprobs and out is not None:
                choice["logprobs"] = chat_logprobs(entries, text_of)
        else:
            assert isinstance(req, CompletionRequest) and isinstance(content, str)
            if req.echo and first:  # the prompt goes first, as vLLM streams an echo
                prompt_entries = c.prompt_logprobs or [None] * len(c.prompt)
                if req.echo_only:
                    content, new, entries = c.prompt_text, list(c.prompt), list(prompt_entries)
                else:
                    content, new, entries = c.prompt_text + content, c.prompt + new, prompt_entries + entries
            elif req.echo_only:
                content, new, entries = "", [], []
            choice["text"] = content
            if req.logprobs is not None and out is not None:
                choice["logprobs"], c.text_offset = completion_logprobs(new, entries, req.logprobs, text_of,
                                                                        c.text_offset)
        if req.return_token_ids and out is not None:
            choice["token_ids"] = list(out.new_tokens)
        return {**self._head(call, chunk=True), "choices": [choice]}

    @staticmethod
    def _choice_usage(c: _Choice) -> dict[str, int]:
        prompt, done = len(c.prompt), len(c.tokens)
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}


def submit_error(exc: RequestRejected | QueueFull | EngineDead) -> ApiError:
    """A request the engine would not queue: 400 (it can never fit, or is malformed), 429 (the queue is full),
    503 (the engine is dead)."""
    if isinstance(exc, ContextTooLong):
        return ApiError(400, str(exc), param="max_tokens", code="context_length_exceeded")
    if isinstance(exc, RequestRejected):
        return ApiError(400, str(exc), param="prompt", code="invalid_prompt")
    if isinstance(exc, QueueFull):
        return ApiError(429, str(exc), code="queue_full")
    return ApiError(503, str(exc), code="engine_dead")


async def _merge(choices: list[_Choice]) -> AsyncIterator[tuple[_Choice, StepOutput]]:
    """The outputs of every choice as they come; one pump task per choice (cancelled when the caller leaves)."""
    if len(choices) == 1:
        c = choices[0]
        async for out in c.stream:
            yield c, out
        return
    queue: asyncio.Queue[tuple[_Choice, StepOutput] | BaseException | None] = asyncio.Queue()

    async def pump(c: _Choice) -> None:
        try:
            async for out in c.stream:
                queue.put_nowait((c, out))
            queue.put_nowait(None)
        except Exception as exc:  # noqa: BLE001 - handed to the consumer (EngineDead)
            queue.put_nowait(exc)

    tasks = [asyncio.create_task(pump(c)) for c in choices]
    try:
        left = len(choices)
        while left:
            item = await queue.get()
            if item is None:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _json(request: web.Request) -> Any:
    try:
        return json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:  # json's decoder recurses once per nested array or object
        raise ApiError(400, "the request body nests arrays and objects too deep to parse (about a thousand"
                       " levels at most)", code="invalid_json") from None

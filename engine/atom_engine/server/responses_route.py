"""Serving ``POST /v1/responses`` (:mod:`atom_engine.server.responses`): the request as a chat request through the
chat route's own steps (template, tools, structured output, sampling), one sequence, and the output as Responses
items, whole or as typed SSE events (``event: <type>`` with a ``sequence_number``; no ``[DONE]``)."""

from __future__ import annotations

import json
import logging
import time
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from aiohttp import web

from atom_engine.errors import QueueFull, RequestRejected
from atom_engine.sequence import FinishReason, StepOutput
from atom_engine.server.engine_loop import EngineDead
from atom_engine.server.error_responses import ApiError
from atom_engine.server.protocol import ChatCompletionRequest, parse
from atom_engine.server.responses import (
    Kept,
    ResponsesRequest,
    ResponseStore,
    assistant_message,
    call_item,
    message_item,
    new_id,
    renamed,
    response_body,
    usage_of,
)
from atom_engine.server.tool_stream import CallDelta, ToolStream
from atom_engine.server.tools import ToolRequest, chat_tools, parse_tool_calls

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from atom_engine.server.openai_routes import OpenAIRoutes

log = logging.getLogger("atom_engine.server")


class ResponsesAPI:
    def __init__(self, routes: OpenAIRoutes) -> None:
        self.routes = routes
        self.store = ResponseStore()

    async def get(self, request: web.Request) -> web.Response:
        rid = request.match_info["response_id"]
        kept = self.store.get(rid)
        if kept is None:
            return ApiError(404, f"response {rid!r} is not kept here (store: false, or not among the last"
                            f" {self.store.limit} responses of this replica)", param="response_id",
                            code="not_found").response()
        return web.json_response(kept.body)

    async def create(self, request: web.Request) -> web.StreamResponse:
        from atom_engine.server.openai_routes import _json, submit_error

        r = self.routes
        rid = new_id("resp")
        try:
            req = parse(ResponsesRequest, await _json(request))
            r._check_model(req.model)
            req.check()
            history: list[dict[str, Any]] = []
            if req.previous_response_id is not None:
                kept = self.store.get(req.previous_response_id)
                if kept is None:
                    raise ApiError(400, f"previous_response_id: {req.previous_response_id!r} is not kept here:"
                                   f" this server keeps the last {self.store.limit} responses sent with store: true,"
                                   " in memory, on the replica that answered them", param="previous_response_id",
                                   code="previous_response_not_found")
                history = kept.messages
            try:
                chat = parse(ChatCompletionRequest, req.chat_body(history))
                chat.check()
                tools = chat_tools(chat, r.chat_template.tool_format, r.engine.settings.model_source)
                ids = r._encode(r.chat_template.render(chat.messages, tools=tools.rendered), add_special_tokens=False)
                default = max(1, r.engine.settings.max_seq_len - len(ids))
                params = r._params(lambda: chat.chat_sampling(default))
                params = await r.structured.apply(tools.grammar, params)
            except ApiError as exc:
                raise renamed(exc, len(history) + (1 if req.instructions else 0)) from None
            try:
                outputs = await r.aengine.submit(ids, params, rid)
            except (RequestRejected, QueueFull, EngineDead) as exc:
                raise renamed(submit_error(exc)) from None
            log.info("event=request_queued request_id=%s kind=responses prompt_tokens=%d max_tokens=%d stream=%s",
                     rid, len(ids), params.max_tokens, req.stream)
            call = _Response(rid, req, chat, tools.parse, len(ids))
            try:  # closing the stream before its end cancels the request (a client gone, even before reading)
                async with aclosing(r._timed(outputs, time.perf_counter())) as outs:
                    if req.stream:
                        return await self._sse(request, call, outs)
                    return await self._whole(call, outs)
            finally:
                outputs.close()
        except ApiError as exc:
            return r._refused(rid, exc)

    async def _whole(self, call: _Response, outs: AsyncIterator[StepOutput]) -> web.Response:
        try:
            async for out in outs:
                call.take(out)
        except EngineDead as exc:
            raise ApiError(503, str(exc), code="engine_dead") from None
        last = call.end
        assert last is not None
        if last.finish_reason is FinishReason.ERROR:
            raise self.routes._failure(call, last)  # type: ignore[arg-type]
        text = last.final_text or ""
        content, calls = parse_tool_calls(text, call.tools.parallel) if call.tools is not None else (text, [])
        output = ([message_item(content or "")] if content or not calls else []) + [call_item(c) for c in calls]
        return web.json_response(self._finish(call, output, content, calls))

    def _finish(self, call: _Response, output: list[dict[str, Any]], content: str | None,
                calls: list[dict[str, Any]]) -> dict[str, Any]:
        assert call.end is not None
        incomplete = "max_output_tokens" if call.end.finish_reason is FinishReason.LENGTH else None
        body = response_body(call.rid, call.req, call.created, output, "incomplete" if incomplete else "completed",
                             usage_of(call.prompt_tokens, call.tokens, call.cached_tokens), incomplete)
        if call.req.store:
            conversation = [m.model_dump(exclude_none=True) for m in call.chat.messages]
            if call.req.instructions:  # instructions are not carried over to a follow-up (as OpenAI)
                conversation = conversation[1:]
            self.store.put(call.rid, Kept([*conversation, assistant_message(content, calls)], body))
        log.info("event=request_done request_id=%s finish_reason=%s tokens=%d", call.rid, call.end.finish_reason,
                 call.tokens)
        return body

    async def _sse(self, request: web.Request, call: _Response, outs: AsyncIterator[StepOutput]
                   ) -> web.StreamResponse:
        events = _Events(request)
        started = response_body(call.rid, call.req, call.created, [], "in_progress", None)
        ts = ToolStream(call.tools.parallel) if call.tools is not None else None
        output: list[dict[str, Any]] = []
        message: dict[str, Any] | None = None  # the message item being streamed
        text = ""
        calls: list[dict[str, Any]] = []
        items: dict[int, dict[str, Any]] = {}  # the function_call items by the call's index
        try:
            async for out in outs:
                call.take(out)
                if out.finished and out.finish_reason is FinishReason.ERROR:
                    error = self.routes._failure(call, out)  # type: ignore[arg-type]
                    if not events.started:
                        return error.response()
                    await events.send("error", {"code": error.code, "message": error.message, "param": None})
                    await events.send("response.failed", {"response": {**started, "status": "failed", "error": {
                        "code": error.code, "message": error.message}}})
                    return await events.end()
                if not events.started:
                    await events.send("response.created", {"response": started})
                    await events.send("response.in_progress", {"response": started})
                delta, new_calls = ts.feed(out.text, out.finished) if ts is not None else (out.text, [])
                if delta:
                    if message is None:
                        message = message_item("", "in_progress")
                        output.append(message)
                        await events.send("response.output_item.added", {"output_index": len(output) - 1,
                                                                         "item": message})
                        await events.send("response.content_part.added", {
                            **_where(message, output), "part": {"type": "output_text", "text": "",
                                                                "annotations": [], "logprobs": []}})
                    text += delta
                    await events.send("response.output_text.delta", {**_where(message, output), "delta": delta,
                                                                     "logprobs": []})
                for change in new_calls:
                    if change.id is not None:
                        message = await self._close_message(events, message, output, text)
                    await self._call_events(events, change, output, items, calls)
            if not output:  # nothing was said (an EOS at once): still one message, empty
                message = message_item("", "in_progress")
                output.append(message)
                await events.send("response.output_item.added", {"output_index": 0, "item": message})
                await events.send("response.content_part.added", {**_where(message, output), "part": {
                    "type": "output_text", "text": "", "annotations": [], "logprobs": []}})
            await self._close_message(events, message, output, text)
            body = self._finish(call, output, text or None, calls)
            await events.send("response.incomplete" if body["status"] == "incomplete" else "response.completed",
                              {"response": body})
            return await events.end()
        except EngineDead as exc:
            if not events.started:
                return ApiError(503, str(exc), code="engine_dead").response()
            await events.send("error", {"code": "engine_dead", "message": str(exc), "param": None})
            return await events.end()
        except ConnectionResetError:
            log.info("event=client_disconnected request_id=%s", call.rid)
            return events.resp or web.Response(status=499)

    @staticmethod
    async def _call_events(events: _Events, change: CallDelta, output: list[dict[str, Any]],
                           items: dict[int, dict[str, Any]], calls: list[dict[str, Any]]) -> None:
        """A streamed call's events: its item added when its name is known, each piece of its arguments as a
        ``function_call_arguments.delta``, then its ``.done`` and the item's."""
        if change.id is not None:
            item = call_item({"id": change.id, "function": {"name": change.name, "arguments": ""}}, "in_progress")
            items[change.index] = item
            output.append(item)
            await events.send("response.output_item.added", {"output_index": len(output) - 1, "item": item})
        item = items[change.index]
        where = {"item_id": item["id"], "output_index": output.index(item)}
        if change.arguments:
            item["arguments"] += change.arguments
            await events.send("response.function_call_arguments.delta", {**where, "delta": change.arguments})
        if change.done:
            item["status"] = "incomplete" if change.cut else "completed"
            calls.append({"id": item["call_id"], "type": "function",
                          "function": {"name": item["name"], "arguments": item["arguments"]}})
            await events.send("response.function_call_arguments.done", {
                **where, "name": item["name"], "arguments": item["arguments"]})
            await events.send("response.output_item.done", {"output_index": where["output_index"], "item": item})

    @staticmethod
    async def _close_message(events: _Events, message: dict[str, Any] | None, output: list[dict[str, Any]],
                             text: str) -> None:
        """The streamed message item's done events (once, before a call or at the end)."""
        if message is None or message["status"] == "completed":
            return None
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        await events.send("response.output_text.done", {**_where(message, output), "text": text, "logprobs": []})
        await events.send("response.content_part.done", {**_where(message, output), "part": part})
        message.update(status="completed", content=[part])
        await events.send("response.output_item.done", {"output_index": output.index(message), "item": message})
        return None


def _where(message: dict[str, Any], output: list[dict[str, Any]]) -> dict[str, Any]:
    return {"item_id": message["id"], "output_index": output.index(message), "content_index": 0}


class _Response:
    """One Responses request being served, and what its outputs delivered (the chat route's failure mapping
    reads ``rid``)."""

    def __init__(self, rid: str, req: ResponsesRequest, chat: ChatCompletionRequest, tools: ToolRequest | None,
                 prompt_tokens: int) -> None:
        self.rid, self.req, self.chat, self.tools, self.prompt_tokens = rid, req, chat, tools, prompt_tokens
        self.created = int(time.time())
        self.tokens = 0
        self.cached_tokens = 0
        self.end: StepOutput | None = None

    def take(self, out: StepOutput) -> None:
        self.tokens += len(out.new_tokens)
        self.cached_tokens = out.cached_tokens
        if out.finished:
            self.end = out


class _Events:
    """Typed SSE events, numbered; the headers go with the first."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.resp: web.StreamResponse | None = None
        self.sequence = 0

    @property
    def started(self) -> bool:
        return self.resp is not None

    async def send(self, kind: str, data: dict[str, Any]) -> None:
        if self.resp is None:
            self.resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await self.resp.prepare(self.request)
        payload = json.dumps({"type": kind, "sequence_number": self.sequence, **data}, separators=(",", ":"))
        self.sequence += 1
        await self.resp.write(f"event: {kind}\ndata: {payload}\n\n".encode())

    async def end(self) -> web.StreamResponse:
        assert self.resp is not None
        await self.resp.write_eof()
        return self.resp

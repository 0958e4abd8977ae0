"""Why the engine refuses or fails a request, as types: a server maps each to its HTTP answer (400, 429, 503),
never by reading the message. Pure Python."""

from __future__ import annotations


class RequestRejected(ValueError):
    """The request can never be served as asked (an HTTP 400)."""


class ContextTooLong(RequestRejected):
    """The prompt plus max_tokens exceed maxSeqLen (OpenAI's ``context_length_exceeded``)."""


class QueueFull(RuntimeError):
    """The waiting queue is at maxWaiting (an HTTP 429)."""


class KVUnavailable(RuntimeError):
    """The connector could not bring a prompt's KV (PD: no prefill worker produced it); the request fails,
    and a server answers it as unavailable (503), not as its own error."""

"""Why the engine refuses or fails a request, as types: a server maps each to its HTTP answer (400, 429, 503),
never by reading the message (:mod:`atom_engine.server.error_responses` builds the OpenAI error body). Pure
Python."""

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


class KVRefused(RuntimeError):
    """The producer of a prompt's KV refused the request itself (PD: a prefill worker's 4xx): a server answers it
    with that ``status`` and ``code``, as the request's own error, not as unavailable."""

    def __init__(self, message: str, *, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code = status, code

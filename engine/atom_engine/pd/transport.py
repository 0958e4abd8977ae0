"""The KV transport seam: how one prompt's KV moves from a prefill worker into a decode pod's source slot.

Shaped as vLLM's KV connectors are (``vllm/distributed/kv_transfer/kv_connector/v1/``): the scheduler-side
connector (:mod:`atom_engine.pd.remote`) decides what to fetch and where it lands; the pool client
(:mod:`atom_engine.pd.client`: discovery, spreading, retries, the circuit breaker) picks a worker; a
:class:`KVTransport` moves the bytes of one request between one decode pod and one worker. The frame format
(:mod:`atom_engine.pd.wire`) is the transport's contract with the worker: whatever moves the bytes, the decode
side checks every frame before it imports anything.

The default transport is plain TCP (:mod:`atom_engine.pd.tcp`): without RDMA no library the field uses moved KV
faster than a plain socket on the machines measured (docs/pd.md). A transport for RDMA NICs (NIXL, Mooncake)
would implement :class:`KVTransport` on the decode side (a one-sided read into the registered slot buffer) and
serve the same requests on the worker's side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from atom_engine.pd.wire import Expect, Shipment


class WorkerFailed(RuntimeError):
    """One attempt on one worker failed; the message says how. ``unanswered``: the worker never answered (not
    there, refused, or closed the connection before any response), as a worker that is going or coming does."""

    def __init__(self, message: str, *, unanswered: bool = False) -> None:
        super().__init__(message)
        self.unanswered = unanswered


class WorkerRefused(Exception):
    """The worker refused the request itself (its status is a 4xx): the request is bad, the worker is fine.
    Not a :class:`WorkerFailed`, so no retry and no breaker failure can come of it by mistake."""

    def __init__(self, message: str, *, status: int, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def refuses_the_request(status: object) -> bool:
    """A worker's error status that is about the request, not the worker: a 4xx other than a timeout (408) or
    being too busy (429), which another worker or a later try may not meet."""
    return type(status) is int and 400 <= status < 500 and status not in (408, 429)


@dataclass(frozen=True)
class Timeouts:
    connect: float = 3.0
    response: float = 60.0  # until the frame starts: the worker's queue plus the prefill itself
    read: float = 10.0  # between two pieces of the frame
    total: float = 120.0
    # The worker drops a request it has not heard about for this long (heartbeats renew it), and a worker silent
    # for this long before its answer (it acknowledges each heartbeat) is failed.
    lease: float = 10.0


@dataclass(frozen=True)
class PrefillRequest:
    """What a decode pod asks a worker for: the KV of ``prompt_token_ids[start:]``."""

    request_id: str
    prompt_token_ids: list[int]
    start: int
    prompt_logprobs: int | None = None  # top-N per prompt token (echo with logprobs)

    def header(self, lease_seconds: float) -> dict[str, Any]:
        return {"request_id": self.request_id, "prompt_token_ids": self.prompt_token_ids, "start": self.start,
                "prompt_logprobs": self.prompt_logprobs, "lease_seconds": lease_seconds}


@dataclass
class TransferStats:
    """What the transport moved (read by the client's figures)."""

    bytes_received: int = 0
    transfer_seconds: float = 0.0  # from the first byte of a frame to its last


class KVTransport(Protocol):
    """The decode side of one way of moving KV."""

    stats: TransferStats

    async def fetch(self, address: str, request: PrefillRequest, expect: Expect,
                    buffer: bytearray | memoryview | None) -> Shipment:
        """The frame for ``request`` from the worker at ``address``, checked against ``expect``, its payload in
        ``buffer``. Raises :class:`WorkerFailed` (``unanswered`` when the worker never answered), or
        :class:`WorkerRefused` when the worker refused the request itself. Cancelling it
        ends the transfer and tells the worker, which stops working on the request."""

    async def ping(self, address: str) -> bool:
        """Whether the worker at ``address`` answers (the circuit breaker's half-open probe)."""

    async def close(self) -> None:
        """Release what the transport holds."""

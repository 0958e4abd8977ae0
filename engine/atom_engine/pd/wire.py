"""The KV wire format: versioned, checksummed messages on a KV transport's byte stream (:mod:`atom_engine.pd.tcp`).

Every message starts with one prefix and a JSON header:

    prefix   18 bytes   kind 4 bytes | version u8 | flags u8 (0) | header_len u32 LE | header_xxh3 u64 LE
    header   JSON       header_len bytes

Kinds: ``ATKQ`` a prefill request (decoder to worker: request_id, prompt_token_ids, start, prompt_logprobs,
lease_seconds), ``ATKP`` a ping (either way: "are you ready"), ``ATKE`` an error (worker to decoder: status,
message, code), ``ATKV`` a KV frame (worker to decoder), whose header is

    request_id, start, tokens (n), tokens_xxh3 (of the token ids as int64 LE), dtype, kv_layout, k_shape, v_shape,
    logits_dtype, logits_shape, payload_bytes, payload_xxh3; prompt_logprobs when the decode side asked for them

and which is followed by its payload: K [layers, kv_heads, n, head_dim] | V (same shape) | logits [vocab], raw
bytes, C order, little endian. After a request the decoder sends one heartbeat byte (:data:`HEARTBEAT`) every
so often until the frame starts: the worker's lease on the request. The worker sends one acknowledgement byte
(:data:`ACK`) when it has taken the request and one for each heartbeat until its answer starts: the decoder's
proof that the worker still runs (see :mod:`atom_engine.pd.tcp`).

``n``: the KV of the prompt's tokens ``start .. start+n-1`` (the suffix the decode side has not cached), named
by their count and checksum rather than listed (the decoder knows what it asked for; a 16K-token list cost
milliseconds of JSON on the frame's critical path). The logits are those of the prompt's last token, so the
decode side samples the first output token with the request's own generator (seeded sampling stays exact under
PD). The receiver checks every field against what it asked for before it reads the payload, and the checksum
after: a frame that fails is refused whole.
Checksums are xxh3-64 (``xxhash``), fast enough not to bound the transfer as zlib's CRC32 did (docs/pd.md).

A request with prompt logprobs (echo) gets them in the header, one per shipped token (``null`` for the
prompt's first), each ``[token, logprob, rank, [[token, logprob], ...]]``; JSON floats round-trip exactly, so
they equal the ones a local prefill computes.

Prefill and decode may run on different NPUs, images and torch versions (an rngd prefill worker feeding an atom
or cpu decode pod): the header names the KV's dtype and axis order (``kv_layout``), and a frame whose dtype or
layout is not the decode side's is refused with both named, never converted (a silent cast would change the
tokens). Version 2 moved the payload off HTTP onto the KV transport and the checksums to xxh3-64; version 3
(this one) added the worker's acknowledgements. A message of another version is refused, naming both versions.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Awaitable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

import torch
import xxhash

from atom_engine.dtypes import dtype_name
from atom_engine.sequence import TokenLogprob
from atom_engine.settings import EngineSettings

VERSION = 3
PREFIX = struct.Struct("<4sBBIQ")
FRAME, REQUEST, PING, ERROR = b"ATKV", b"ATKQ", b"ATKP", b"ATKE"
KINDS = (FRAME, REQUEST, PING, ERROR)
HEADER_MAX = 4 << 20  # token ids of a 32k prompt as JSON fit easily
HEARTBEAT = b"h"
ACK = b"a"  # never a message's first byte (every kind starts with "A")

KV_LAYOUT = "layers,kv_heads,tokens,head_dim"  # the axis order of K and V in the payload


class CorruptTransfer(ValueError):
    """A frame that is not what the receiver asked for: refused, never imported."""


# What an HTTP peer's first four bytes are: a response's status line, or a request's method (RFC 9110's methods,
# cut to four bytes, and HTTP/2's connection preface).
HTTP_RESPONSE = b"HTTP"
HTTP_REQUESTS = (b"GET ", b"HEAD", b"POST", b"PUT ", b"DELE", b"CONN", b"OPTI", b"TRAC", b"PATC", b"PRI ")
KV_PORT_DEFAULT = EngineSettings.model_fields["pd_kv_port"].default
MISWIRED = (f"prefillWorkers must name the worker's KV port (pdKvPort, {KV_PORT_DEFAULT} by default),"
            " not its HTTP port")


class SpeaksHttp(ValueError):
    """The peer spoke HTTP on the KV transport: an address that names the wrong port, not a corrupt transfer.
    ``request``: the peer sent an HTTP request (a client on the KV port) rather than answered with HTTP (a decoder
    dialing a worker's HTTP port)."""

    def __init__(self, request: bool) -> None:
        super().__init__("an HTTP request on the KV port" if request else "an HTTP answer on the KV transport")
        self.request = request


@dataclass(frozen=True)
class Shipment:
    """The KV of ``token_ids`` (positions ``start..``) and the last prompt token's logits."""

    request_id: str
    start: int
    token_ids: list[int]
    k: torch.Tensor
    v: torch.Tensor
    logits: torch.Tensor
    prompt_logprobs: list[TokenLogprob | None] | None = None  # one per token of token_ids, when asked

    @property
    def payload_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.logits))


@dataclass(frozen=True)
class Expect:
    """What the receiver asked for; a frame must match it field by field."""

    request_id: str
    start: int
    token_ids: list[int]
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    dtype: torch.dtype
    prompt_logprobs: int | None = None  # top-N asked per prompt token (echo with logprobs)

    @property
    def kv_shape(self) -> list[int]:
        return [self.layers, self.kv_heads, len(self.token_ids), self.head_dim]

    @property
    def kv_bytes(self) -> int:
        return self.layers * self.kv_heads * len(self.token_ids) * self.head_dim * self.dtype.itemsize

    @property
    def payload_bytes(self) -> int:
        """K, V and the float32 logits: what the frame's payload must hold."""
        return 2 * self.kv_bytes + 4 * self.vocab

    @cached_property
    def header_fields(self) -> dict[str, Any]:
        """What a frame's header must say, field by field. Computed once: a transport asks for it before the frame
        arrives, so hashing the token ids falls while the worker prefills, not between a frame's bytes."""
        return {
            "request_id": self.request_id, "start": self.start, "tokens": len(self.token_ids),
            "tokens_xxh3": tokens_xxh3(self.token_ids),
            "k_shape": self.kv_shape, "v_shape": self.kv_shape,
            "logits_dtype": "float32", "logits_shape": [self.vocab],
        }


class Reader(Protocol):
    """The receiving end of a KV transport's stream."""

    def read_exactly(self, n: int) -> Awaitable[bytes]:
        """``n`` bytes (small: a prefix, a header); raises on a stream that ends first."""

    def read_into(self, view: memoryview, hasher: Any) -> Awaitable[None]:
        """Fill ``view`` whole from the stream (no intermediate copy), feeding every piece to ``hasher``."""


def _raw(t: torch.Tensor) -> memoryview:
    if sys.byteorder != "little":  # pragma: no cover - every supported host is little endian
        raise RuntimeError("the KV wire format is little endian")
    return memoryview(t.detach().contiguous().view(torch.uint8).numpy()).cast("B")


def tokens_xxh3(token_ids: list[int]) -> int:
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(token_ids)}q", *token_ids))


def message(kind: bytes, header: dict[str, Any]) -> bytes:
    """A message's prefix and header."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    return PREFIX.pack(kind, VERSION, 0, len(raw), xxhash.xxh3_64_intdigest(raw)) + raw


def encode(ship: Shipment) -> tuple[bytes, list[memoryview]]:
    """The frame's prefix + header bytes, and the payload parts to write after them (no copy of the tensors)."""
    parts = [_raw(ship.k), _raw(ship.v), _raw(ship.logits.to(torch.float32))]
    hasher = xxhash.xxh3_64()
    for p in parts:
        hasher.update(p)
    header = {
        "request_id": ship.request_id, "start": ship.start, "tokens": len(ship.token_ids),
        "tokens_xxh3": tokens_xxh3(ship.token_ids),
        "dtype": dtype_name(ship.k.dtype), "kv_layout": KV_LAYOUT, "k_shape": list(ship.k.shape),
        "v_shape": list(ship.v.shape),
        "logits_dtype": "float32", "logits_shape": list(ship.logits.shape),
        "payload_bytes": sum(p.nbytes for p in parts), "payload_xxh3": hasher.intdigest(),
        **({} if ship.prompt_logprobs is None else {"prompt_logprobs": [_lp_out(e) for e in ship.prompt_logprobs]}),
    }
    return message(FRAME, header), parts


def frame_bytes(ship: Shipment) -> bytes:
    head, parts = encode(ship)
    return head + b"".join(bytes(p) for p in parts)


async def read_message(reader: Reader, kinds: tuple[bytes, ...]) -> tuple[bytes, dict[str, Any]]:
    """One message's kind and header, checked: its kind one of ``kinds``, its version this one, its header whole.
    The kind is read alone first, so a peer that speaks HTTP is named (:class:`SpeaksHttp`) even when what it sent
    is shorter than a prefix."""
    kind = await reader.read_exactly(4)
    if kind == HTTP_RESPONSE or kind in HTTP_REQUESTS:
        raise SpeaksHttp(request=kind != HTTP_RESPONSE)
    _, version, _flags, header_len, header_sum = PREFIX.unpack(kind + await reader.read_exactly(PREFIX.size - 4))
    if kind not in kinds:
        want = " or ".join(repr(k) for k in kinds)
        raise CorruptTransfer(f"not a KV transport message (kind {kind!r}, want {want})")
    if version != VERSION:
        raise CorruptTransfer(f"KV message version {version}; this engine speaks version {VERSION}")
    if header_len > HEADER_MAX:
        raise CorruptTransfer(f"KV message header of {header_len} bytes exceeds {HEADER_MAX}")
    raw = await reader.read_exactly(header_len)
    if xxhash.xxh3_64_intdigest(raw) != header_sum:
        raise CorruptTransfer("KV message header checksum mismatch")
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise CorruptTransfer(f"KV message header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise CorruptTransfer("KV message header is not a JSON object")
    return kind, header


async def read_frame(reader: Reader, expect: Expect, buffer: bytearray | memoryview | None = None,
                     header: dict[str, Any] | None = None) -> Shipment:
    """Read one frame (or its payload, when its ``header`` was read already), checking it against ``expect``;
    the payload lands in ``buffer`` (a source slot's staging memory, never resized: earlier shipments' tensors
    may still view it) and the returned tensors are views of it."""
    h = header if header is not None else (await read_message(reader, (FRAME,)))[1]
    n = len(expect.token_ids)
    dtype = dtype_name(expect.dtype)
    if h.get("dtype") != dtype:
        raise CorruptTransfer(f"KV frame dtype is {h.get('dtype')!r} but this decode engine runs {dtype!r}: prefill"
                              " and decode must run the same model dtype (spec.model.dtype)")
    if h.get("kv_layout") != KV_LAYOUT:
        raise CorruptTransfer(f"KV frame kv_layout is {h.get('kv_layout')!r} but this decode engine reads"
                              f" {KV_LAYOUT!r}")
    for key, value in expect.header_fields.items():
        if h.get(key) != value:
            if key == "tokens_xxh3":
                raise CorruptTransfer("KV frame field tokens_xxh3 does not match: the KV of other tokens")
            raise CorruptTransfer(f"KV frame field {key} is {h.get(key)!r}; expected {value!r}")
    prompt_logprobs = _lp_in(h.get("prompt_logprobs"), n) if expect.prompt_logprobs is not None else None
    kv_bytes, kv_shape = expect.kv_bytes, expect.kv_shape
    total = expect.payload_bytes
    if h.get("payload_bytes") != total:
        raise CorruptTransfer(f"KV frame payload_bytes is {h.get('payload_bytes')}; the shapes need {total}")
    if buffer is None:
        buffer = bytearray(total)
    elif len(buffer) < total:  # a slot's buffer is sized to the shipment asked: a caller's mistake, refused whole
        raise CorruptTransfer(f"KV frame payload of {total} bytes exceeds the source slot ({len(buffer)} bytes)")
    view = memoryview(buffer)
    hasher = xxhash.xxh3_64()
    await reader.read_into(view[:total], hasher)
    if hasher.intdigest() != h.get("payload_xxh3"):
        raise CorruptTransfer("KV frame payload checksum mismatch")

    def tensor(offset: int, nbytes: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
        return torch.frombuffer(view[offset : offset + nbytes], dtype=dtype).view(shape)

    return Shipment(
        expect.request_id, expect.start, list(expect.token_ids),
        tensor(0, kv_bytes, expect.dtype, kv_shape), tensor(kv_bytes, kv_bytes, expect.dtype, kv_shape),
        tensor(2 * kv_bytes, 4 * expect.vocab, torch.float32, [expect.vocab]), prompt_logprobs,
    )


def _lp_out(e: TokenLogprob | None) -> list | None:
    return None if e is None else [e.token, e.logprob, e.rank, [list(t) for t in e.top]]


def _lp_in(raw: object, n: int) -> list[TokenLogprob | None]:
    """The header's prompt logprobs, one per shipped token; anything else is a corrupt frame."""
    if not isinstance(raw, list) or len(raw) != n:
        shown = len(raw) if isinstance(raw, list) else type(raw).__name__
        raise CorruptTransfer(f"KV frame field prompt_logprobs has {shown} entries; expected {n}")
    try:
        return [None if e is None else TokenLogprob(int(e[0]), float(e[1]), int(e[2]),
                                                     tuple((int(t), float(lp)) for t, lp in e[3]))
                for e in raw]
    except (TypeError, ValueError, IndexError) as exc:
        raise CorruptTransfer(f"KV frame field prompt_logprobs is malformed: {exc}") from exc

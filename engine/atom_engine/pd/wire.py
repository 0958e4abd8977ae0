"""The KV wire format: one frame per shipment, streamed as an HTTP response body.

    prefix   14 bytes   b"ATKV" | version u8 | flags u8 (0) | header_len u32 LE | header_crc32 u32 LE
    header   JSON       request_id, start, token_ids, dtype, kv_layout, k_shape, v_shape, logits_dtype,
                        logits_shape, payload_bytes, payload_crc32; prompt_logprobs when the decode side asked for them
    payload  raw bytes  K [layers, kv_heads, n, head_dim] | V (same shape) | logits [vocab], C order, little endian

``n == len(token_ids)``: the KV of the prompt's tokens ``start .. start+n-1`` (the suffix the decode side has not
cached). The logits are those of the prompt's last token, so the decode side samples the first output token with
the request's own generator (seeded sampling stays exact under PD). The receiver checks every field against
what it asked for before it reads the payload, and the checksum after: a frame that fails is refused whole.

A request with prompt logprobs (echo) gets them in the header, one per token of ``token_ids`` (``null`` for the
prompt's first), each ``[token, logprob, rank, [[token, logprob], ...]]``; JSON floats round-trip exactly, so
they equal the ones a local prefill computes.

Prefill and decode may run on different NPUs, images and torch versions (an rngd prefill worker feeding an atom
or cpu decode pod): the header names the KV's dtype and axis order (``kv_layout``), and a frame whose dtype or
layout is not the decode side's is refused with both named, never converted (a silent cast would change the
tokens). A frame without ``kv_layout`` (an older sender) has the only layout there was, :data:`KV_LAYOUT`.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import torch

from atom_engine.dtypes import dtype_name
from atom_engine.sequence import TokenLogprob

MAGIC = b"ATKV"
VERSION = 1
PREFIX = struct.Struct("<4sBBII")
HEADER_MAX = 4 << 20  # token ids of a 32k prompt as JSON fit easily
READ_PIECE = 1 << 20

KV_LAYOUT = "layers,kv_heads,tokens,head_dim"  # the axis order of K and V in the payload


class CorruptTransfer(ValueError):
    """A frame that is not what the receiver asked for: refused, never imported."""


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


def _raw(t: torch.Tensor) -> memoryview:
    if sys.byteorder != "little":  # pragma: no cover - every supported host is little endian
        raise RuntimeError("the KV wire format is little endian")
    return memoryview(t.detach().contiguous().view(torch.uint8).numpy())


def encode(ship: Shipment) -> tuple[bytes, list[memoryview]]:
    """The prefix + header bytes, and the payload parts to write after them (no copy of the tensors)."""
    parts = [_raw(ship.k), _raw(ship.v), _raw(ship.logits.to(torch.float32))]
    crc = 0
    for p in parts:
        crc = zlib.crc32(p, crc)
    header = json.dumps({
        "request_id": ship.request_id, "start": ship.start, "token_ids": ship.token_ids,
        "dtype": dtype_name(ship.k.dtype), "kv_layout": KV_LAYOUT, "k_shape": list(ship.k.shape),
        "v_shape": list(ship.v.shape),
        "logits_dtype": "float32", "logits_shape": list(ship.logits.shape),
        "payload_bytes": sum(p.nbytes for p in parts), "payload_crc32": crc,
        **({} if ship.prompt_logprobs is None else {"prompt_logprobs": [_lp_out(e) for e in ship.prompt_logprobs]}),
    }, separators=(",", ":")).encode()
    return PREFIX.pack(MAGIC, VERSION, 0, len(header), zlib.crc32(header)) + header, parts


def frame_bytes(ship: Shipment) -> bytes:
    head, parts = encode(ship)
    return head + b"".join(bytes(p) for p in parts)


async def read_frame(read_exactly: Callable[[int], Awaitable[bytes]], expect: Expect,
                     buffer: bytearray | None = None) -> Shipment:
    """Read one frame, checking it against ``expect``; the payload lands in ``buffer`` (a source slot's
    staging memory, never resized: earlier shipments' tensors may still view it) and the returned tensors are
    views of it."""
    magic, version, _flags, header_len, header_crc = PREFIX.unpack(await read_exactly(PREFIX.size))
    if magic != MAGIC:
        raise CorruptTransfer(f"not a KV frame (magic {magic!r}, want {MAGIC!r})")
    if version != VERSION:
        raise CorruptTransfer(f"KV frame version {version}; this engine reads version {VERSION}")
    if header_len > HEADER_MAX:
        raise CorruptTransfer(f"KV frame header of {header_len} bytes exceeds {HEADER_MAX}")
    raw = await read_exactly(header_len)
    if zlib.crc32(raw) != header_crc:
        raise CorruptTransfer("KV frame header checksum mismatch")
    try:
        h = json.loads(raw)
    except ValueError as exc:
        raise CorruptTransfer(f"KV frame header is not JSON: {exc}") from exc
    n = len(expect.token_ids)
    dtype = dtype_name(expect.dtype)
    if h.get("dtype") != dtype:
        raise CorruptTransfer(f"KV frame dtype is {h.get('dtype')!r} but this decode engine runs {dtype!r}: prefill"
                              " and decode must run the same model dtype (spec.model.dtype)")
    if h.get("kv_layout", KV_LAYOUT) != KV_LAYOUT:
        raise CorruptTransfer(f"KV frame kv_layout is {h.get('kv_layout')!r} but this decode engine reads"
                              f" {KV_LAYOUT!r}")
    kv_shape = [expect.layers, expect.kv_heads, n, expect.head_dim]
    want = {
        "request_id": expect.request_id, "start": expect.start, "token_ids": expect.token_ids,
        "k_shape": kv_shape, "v_shape": kv_shape,
        "logits_dtype": "float32", "logits_shape": [expect.vocab],
    }
    for key, value in want.items():
        if h.get(key) != value:
            shown = h.get(key) if key != "token_ids" else f"{len(h.get(key) or [])} ids"
            raise CorruptTransfer(f"KV frame field {key} is {shown!r}; expected {value if key != 'token_ids' else n}")
    prompt_logprobs = _lp_in(h.get("prompt_logprobs"), n) if expect.prompt_logprobs is not None else None
    kv_bytes = expect.layers * expect.kv_heads * n * expect.head_dim * expect.dtype.itemsize
    total = 2 * kv_bytes + 4 * expect.vocab
    if h.get("payload_bytes") != total:
        raise CorruptTransfer(f"KV frame payload_bytes is {h.get('payload_bytes')}; the shapes need {total}")
    if buffer is None:
        buffer = bytearray(total)
    elif len(buffer) < total:  # slots are sized for maxSeqLen tokens, so a frame this big cannot be right
        raise CorruptTransfer(f"KV frame payload of {total} bytes exceeds the source slot ({len(buffer)} bytes)")
    view = memoryview(buffer)
    crc, done = 0, 0
    while done < total:
        piece = await read_exactly(min(READ_PIECE, total - done))
        view[done : done + len(piece)] = piece
        crc = zlib.crc32(piece, crc)
        done += len(piece)
    if crc != h.get("payload_crc32"):
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

"""Backends declare what they can do; the engine exposes it, and a step a backend cannot run is refused by the
capability's name (MissingCapability), never by an AttributeError from inside the step."""

from __future__ import annotations

import pytest
from atom_engine.capabilities import Capabilities, MissingCapability
from atom_engine.engine import LLMEngine
from atom_engine.sequence import SamplingParams, Sequence
from atom_engine.settings import EngineSettings

SETTINGS = dict(lanes=2, kv_blocks=4, max_seq_len=128, prefill_chunk=64, prefix_cache=False)


def test_the_cpu_backend_declares_every_optional_forward() -> None:
    caps = LLMEngine(EngineSettings(**SETTINGS)).capabilities
    assert caps == Capabilities(every_token_logits=True, verify=True, mixed=True, decode=True, kv_transfer=True,
                                devices=0)


def test_a_backend_without_verify_or_mixed_is_refused_by_name(rebel) -> None:  # noqa: ANN001
    engine = LLMEngine(EngineSettings(backend="atom", speculative_tokens=3, **SETTINGS))
    caps = engine.capabilities
    assert (caps.verify, caps.mixed, caps.every_token_logits, caps.devices) == (False, False, True, 1)
    assert engine.speculative_tokens == 0 and not engine.batcher.mixes_prefill  # so the batcher never asks
    seq = Sequence("r", [1, 2], SamplingParams(max_tokens=2), block=1, computed=1)
    with pytest.raises(MissingCapability, match="the atom backend lacks the 'verify' capability") as err:
        engine.runner.verify([seq, None], [[3], []])
    assert (err.value.backend, err.value.capability) == ("atom", "verify")
    with pytest.raises(MissingCapability, match="'mixed'"):
        engine.runner.mixed([seq, None], [[], []], [])


def test_a_prefill_only_backend_is_refused_a_decode_step_by_name() -> None:
    caps = Capabilities(decode=False)
    with pytest.raises(MissingCapability, match="the rngd backend lacks the 'decode' capability"):
        caps.require("rngd", "decode", "a decode step")
    with pytest.raises(ValueError, match="no capability named 'teleport'"):
        caps.require("cpu", "teleport", "a typo")

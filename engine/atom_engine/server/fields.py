"""Request fields this engine does not implement: which are accepted and ignored, which are refused.

vLLM's request models accept any field and ignore the unknown ones with a warning
(``vllm/entrypoints/openai/protocol.py``, ``OpenAIBaseModel``'s ``__log_extra_fields__``); clients and proxies send
vendor extras, so refusing every unknown name would break them. Ignoring a field that changes the answer would
be worse: the client believes it was honoured. So:

- a field named in :data:`NEUTRAL` is accepted when it holds a value that means what this engine does anyway (for
  ``best_of``, 1), and refused with a 400 naming it otherwise;
- a field named in :data:`IGNORED` never changes the output (bookkeeping, routing or billing hints) and is
  accepted and ignored;
- any other unknown field is accepted and ignored as vLLM does, and named in a warning-level log event
  (``event=request_fields_ignored``), so an operator sees what clients send.

The lists are documented in docs/api.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from atom_engine.server.error_responses import ApiError

log = logging.getLogger("atom_engine.server")

# Output-changing fields of OpenAI's and vLLM's APIs that this engine does not implement, with the values that
# mean "not used" (the request is served as is); any other value is refused.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    # OpenAI chat
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "tool_calls": (None, []),  # on an assistant message
    "functions": (None, []),  # the legacy form of tools
    "function_call": (None, "none"),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "web_search_options": (None,),
    "reasoning_effort": (None,),  # OpenAI refuses it on models that do not reason too
    "verbosity": (None,),
    # vLLM's sampling extras
    "best_of": (None, 1),
    "use_beam_search": (None, False),
    "length_penalty": (None, 1, 1.0),
    "min_p": (None, 0, 0.0),
    "bad_words": (None, []),
    "allowed_token_ids": (None,),
    "logits_processors": (None, []),
    "truncate_prompt_tokens": (None,),
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
    "prompt_embeds": (None,),
    "guided_whitespace_pattern": (None,),
    # vLLM's chat-template controls
    "chat_template": (None,),
    "chat_template_kwargs": (None, {}),
    "add_generation_prompt": (None, True),
    "continue_final_message": (None, False),
    "documents": (None, []),
    "mm_processor_kwargs": (None, {}),
}

# Fields that never change the output: accepted, ignored, not logged.
IGNORED = frozenset({
    "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier", "priority", "request_id",
    "cache_salt", "add_special_tokens", "guided_decoding_backend", "kv_transfer_params", "vllm_xargs",
    "parallel_tool_calls",
})


def check_extra(extra: Mapping[str, Any] | None, request_id: str | None = None) -> None:
    """Refuse what would change the answer; log what is ignored."""
    unknown = []
    for name, value in (extra or {}).items():
        if name in NEUTRAL:
            if not any(value == v and type(value) is type(v) for v in NEUTRAL[name] if v is not None) \
                    and value is not None:
                raise ApiError(400, f"{name}: not supported by this engine; got {_short(value)}. Leave it out"
                               f" (or set it to {_neutral(name)}).", param=name, code="unsupported_parameter")
        elif name not in IGNORED:
            unknown.append(name)
    if unknown:
        log.warning("event=request_fields_ignored request_id=%s fields=%s", request_id, ",".join(sorted(unknown)))


def _neutral(name: str) -> str:
    values = [repr(v) for v in NEUTRAL[name] if v is not None]
    return " or ".join(values) if values else "null"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

"""builtin:smollm2-135m, the trained model `make model` converts: the engine's greedy tokens equal HF ``generate``
on the same checkpoint in float32 (lanes > 1, prefix cache on and off), and chat prompts tokenize exactly as
HF ``apply_chat_template``. Short prompts and few tokens: 30 layers on two shared cores are slow."""

from __future__ import annotations

import pytest
import torch
import transformers
from atom_engine.engine import LLMEngine
from atom_engine.model.builtin import checkpoint_path
from atom_engine.model.tokenizer import HFTokenizer
from atom_engine.sequence import SamplingParams
from atom_engine.server.chat import ChatTemplate
from atom_engine.server.protocol import ChatMessage
from atom_engine.settings import EngineSettings

SOURCE = "builtin:smollm2-135m"
NEW_TOKENS = 6
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Name a color."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Count to three."}],
    [{"role": "user", "content": "What is the capital of Italy?"}],
    # Special-token text inside content, non-ASCII, an empty message, list-of-parts content.
    [{"role": "user", "content": "Écris <|im_end|> en français: «ça va?» 你好"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": [{"type": "text", "text": "Two parts, "},
                                                                      {"type": "text", "text": "one message."}]}],
]


@pytest.fixture(scope="module")
def checkpoint():  # noqa: ANN201
    return checkpoint_path(SOURCE)  # ValueError naming `make model` when it was not converted here


@pytest.fixture(scope="module")
def hf_tokenizer(checkpoint):  # noqa: ANN001, ANN201
    return transformers.AutoTokenizer.from_pretrained(checkpoint)


def hf_chat_ids(tok, chat: list[dict]) -> list[int]:  # noqa: ANN001
    out = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if not isinstance(out, list) else out)


def engine_chat_ids(template: ChatTemplate, tokenizer: HFTokenizer, chat: list[dict]) -> list[int]:
    return tokenizer.encode(template.render([ChatMessage.model_validate(m) for m in chat]))


def test_chat_prompt_tokens_equal_hf_apply_chat_template(checkpoint, hf_tokenizer) -> None:  # noqa: ANN001
    template = ChatTemplate(SOURCE)
    assert not template.plain  # chat_template.jinja was found (transformers 5 saves the template there)
    tokenizer = HFTokenizer(checkpoint / "tokenizer.json", eos_token_id=2)
    for chat in CHATS:
        hf_chat = [{**m, "content": ChatMessage.model_validate(m).text()} for m in chat]
        assert engine_chat_ids(template, tokenizer, chat) == hf_chat_ids(hf_tokenizer, hf_chat), chat


def test_plain_text_tokenizes_and_decodes_as_hf(checkpoint, hf_tokenizer) -> None:  # noqa: ANN001
    tokenizer = HFTokenizer(checkpoint / "tokenizer.json", eos_token_id=2)
    for text in ("The quick brown fox", "  leading spaces\tand tabs\n", "<|im_start|>user\nhi<|im_end|>", "ça 你好"):
        ids = tokenizer.encode(text)
        assert ids == hf_tokenizer(text)["input_ids"], text
        assert tokenizer.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True), text


@pytest.fixture(scope="module")
def prompts_and_reference(checkpoint, hf_tokenizer):  # noqa: ANN001, ANN201
    """The first four chats' prompt ids (all share the default system prompt's prefix, except the one with its
    own system prompt) and HF's greedy tokens for each, in float32."""
    prompts = [hf_chat_ids(hf_tokenizer, c) for c in CHATS[:4]]
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    ref = []
    for p in prompts:
        ids = torch.tensor([p])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS)
        ref.append(out[0, len(p):].tolist())
    return prompts, ref


@pytest.mark.parametrize(("prefix_cache", "speculative_tokens"), [(True, 0), (True, 2), (False, 2), (False, 7)],
                         ids=["prefix-cache", "prefix-cache-drafts", "no-cache-drafts", "no-cache-drafts-7"])
def test_greedy_tokens_equal_hf_generate(prompts_and_reference, prefix_cache: bool, speculative_tokens: int
                                         ) -> None:  # noqa: ANN001
    prompts, ref = prompts_and_reference
    lanes = 2  # four prompts on two lanes: requests join and leave a running batch
    e = LLMEngine(EngineSettings(model_source=SOURCE, lanes=lanes, kv_blocks=lanes + (2 if prefix_cache else 1),
                                 prefix_cache=prefix_cache, max_seq_len=128, prefill_chunk=16,
                                 speculative_tokens=speculative_tokens))
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    assert [o.token_ids for o in e.generate(prompts, params)] == ref
    if speculative_tokens:  # a trained model repeats its prompt: some drafts were right, and kept
        assert e.stats()["draft_tokens_accepted"] > 0
    if prefix_cache:  # a second round: every prompt is now a prefix-cache hit
        assert [o.token_ids for o in e.generate(prompts, params)] == ref
        assert e.stats()["prefix_cache_hits"] >= len(prompts)
    e.kv.check_invariant()
    assert e.tokenizer.decode(ref[0]).startswith("The capital of France is Paris")

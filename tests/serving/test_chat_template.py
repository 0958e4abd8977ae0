"""Chat templates render as transformers renders them, from ``chat_template.jinja`` or ``tokenizer_config.json``.

The oracle is transformers' own ``render_jinja_template`` (what ``apply_chat_template`` calls)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from atom_engine.server.chat import ChatTemplate, plain_template
from atom_engine.server.protocol import ChatMessage
from transformers.utils.chat_template_utils import render_jinja_template

# Whitespace control (trim_blocks/lstrip_blocks), loop controls, tojson, the special tokens as variables.
TEMPLATE = """{{ bos_token }}
{% for m in messages %}
    {% if m['role'] == 'system' %}{% continue %}{% endif %}
    <{{ m['role'] }}>{{ m['content'] | tojson }}{{ eos_token }}
{% endfor %}
{% if add_generation_prompt %}<assistant>{% endif %}"""
SPECIALS = {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}}
MESSAGES = [{"role": "system", "content": "ignored"}, {"role": "user", "content": "héllo <b>&</b>"},
            {"role": "assistant", "content": "hi"}, {"role": "user", "content": "again"}]


def expected() -> str:
    rendered, _ = render_jinja_template(conversations=[MESSAGES], chat_template=TEMPLATE, add_generation_prompt=True,
                                        bos_token="<s>", eos_token="</s>")
    return rendered[0]


def render(path: Path) -> str:
    return ChatTemplate(str(path)).render([ChatMessage.model_validate(m) for m in MESSAGES])


@pytest.mark.parametrize("where", ["jinja-file", "config-string", "config-list"])
def test_template_renders_as_transformers_does(tmp_path: Path, where: str) -> None:
    config: dict = dict(SPECIALS)
    if where == "jinja-file":
        (tmp_path / "chat_template.jinja").write_text(TEMPLATE)
        config["chat_template"] = "{{ 'the .jinja file wins over this' }}"
    elif where == "config-string":
        config["chat_template"] = TEMPLATE
    else:
        config["chat_template"] = [{"name": "tool_use", "template": "{{ 'not the default' }}"},
                                   {"name": "default", "template": TEMPLATE}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert render(tmp_path) == expected()
    # The oracle differs from jinja's defaults (whitespace control, tojson without HTML escapes), so an
    # environment set up otherwise would fail above.
    import jinja2

    assert jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).from_string(TEMPLATE).render(
        messages=MESSAGES, add_generation_prompt=True, bos_token="<s>", eos_token="</s>") != expected()


def test_without_a_template_the_plain_one_is_used(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(SPECIALS))
    template = ChatTemplate(str(tmp_path))
    assert template.plain
    messages = [ChatMessage.model_validate(m) for m in MESSAGES]
    assert template.render(messages) == plain_template(messages)
    assert ChatTemplate("builtin:tiny").plain


def test_unknown_builtin_is_refused_with_the_known_names() -> None:
    with pytest.raises(ValueError, match="not a built-in model; the built-in models are: builtin:smollm2-135m, b"):
        ChatTemplate("builtin:llama")


WORDS = ["<s>", "</s>", "<unk>", "user", "assistant", "system", ":", "hello", "world", "how", "are", "you"]
BOS_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {{ eos_token }} "
                "{% endfor %}{% if add_generation_prompt %}assistant :{% endif %}")


@pytest.fixture(scope="module")
def bos_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """A tiny Llama whose tokenizer adds a BOS itself (its post-processor, as Llama 3's does) and whose chat
    template writes one too: a chat prompt must get the template's BOS only, as apply_chat_template gives."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    path = tmp_path_factory.mktemp("bos-checkpoint")
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                  unk_token="<unk>")
    hf_tok.chat_template = BOS_TEMPLATE
    hf_tok.save_pretrained(path)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, bos_token_id=0, eos_token_id=1, pad_token_id=None)).save_pretrained(path)
    return path, hf_tok


@pytest.mark.asyncio(loop_scope="session")
async def test_chat_prompts_are_encoded_without_the_tokenizers_own_specials(bos_checkpoint) -> None:  # noqa: ANN001
    import aiohttp

    from tests.serving.conftest import client, in_process

    path, hf_tok = bos_checkpoint
    chat = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "how are you"},
            {"role": "user", "content": "hello"}]
    expected = hf_tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    expected = list(expected["input_ids"] if not isinstance(expected, list) else expected)
    assert expected[0] == 0 and expected[1] != 0  # one BOS, the template's
    async with in_process(model_source=str(path), model_name="bos") as (_server, url):
        r = await client(url).chat.completions.create(model="bos", messages=chat, max_tokens=2, temperature=0,
                                                      extra_body={"return_token_ids": True})
        assert r.prompt_token_ids == expected
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{url}/tokenize", json={"messages": chat}) as resp:
                assert (await resp.json())["tokens"] == expected
            async with s.post(f"{url}/tokenize", json={"prompt": "hello world"}) as resp:  # a plain prompt: BOS added
                assert (await resp.json())["tokens"] == hf_tok("hello world")["input_ids"] == [0, 7, 8]

"""builtin:smollm2-135m through PD: a prefill worker subprocess and a remote-only decode server answer chat
requests with HF's greedy tokens for the same checkpoint (float32), prefix cache off and on, and the chat route's
prompt tokens are HF ``apply_chat_template``'s."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import transformers
from atom_engine.model.builtin import checkpoint_path

from tests.serving.conftest import (
    Proc,
    assert_no_block_leaked,
    client,
    idle,
    in_process,
    spawn,
    wait_metrics,
    wait_ready_sync,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

SOURCE = "builtin:smollm2-135m"
NAME = "smollm2"
TRAINED = dict(model_name=NAME, model_source=SOURCE, max_seq_len=128, prefill_chunk=16)
NEW_TOKENS = 6
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "What is the capital of Germany?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say yes."}],
]


@pytest.fixture(scope="module")
def hf_reference() -> tuple[list[list[int]], list[list[int]]]:
    """Each chat's prompt ids by apply_chat_template and HF's greedy tokens after it."""
    path = checkpoint_path(SOURCE)  # ValueError naming `make model` when it was not converted here
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts, ref = [], []
    for chat in CHATS:
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if not isinstance(ids, list) else ids)
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS)
        prompts.append(ids)
        ref.append(out[0, len(ids):].tolist())
    return prompts, ref


@pytest.fixture(scope="module")
def trained_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """Started, not yet ready: it loads the model while the HF reference is computed (the test waits for it)."""
    tmp: Path = tmp_path_factory.mktemp("prefill-trained")
    proc = spawn(tmp, "prefill-smollm2", "prefill", {**TRAINED, "lanes": 1, "kv_blocks": 3, "prefix_cache": False})
    try:
        yield proc
    finally:
        proc.kill()


@pytest.mark.parametrize("prefix_cache", [False, True], ids=["cache-off", "cache-on"])
async def test_pd_chat_equals_hf_generate(trained_worker: Proc, hf_reference, prefix_cache: bool) -> None:  # noqa: ANN001
    prompts, ref = hf_reference
    wait_ready_sync(trained_worker)
    async with in_process("decode", **TRAINED, lanes=2, kv_blocks=4 if prefix_cache else 3, prefix_cache=prefix_cache,
                          local_prefill=False, prefill_workers=trained_worker.address) as (_server, url):
        c = client(url)

        async def ask(chat: list[dict]) -> tuple[list[int], list[int], str]:
            r = await c.chat.completions.create(model=NAME, messages=chat, max_tokens=NEW_TOKENS, temperature=0,
                                                extra_body={"ignore_eos": True, "return_token_ids": True})
            assert r.usage.prompt_tokens == len(r.prompt_token_ids)
            return r.prompt_token_ids, r.choices[0].token_ids, r.choices[0].message.content

        rounds = 2 if prefix_cache else 1  # the second round's prompts are prefix-cache hits
        for _ in range(rounds):
            answers = await asyncio.gather(*(ask(chat) for chat in CHATS))
            assert [a[0] for a in answers] == prompts
            assert [a[1] for a in answers] == ref
        assert answers[0][2].startswith("The capital of France is Paris")
        m = await wait_metrics(url, idle, "idle")
        assert_no_block_leaked(m)
        assert m["atom:prefill_tokens_computed_total"] == 0  # remote-only: every prompt was prefilled by the worker
        assert m["atom:pd_remote_prefills_total"] == rounds * len(CHATS)
        if prefix_cache:
            assert m["vllm:prefix_cache_hits_total"] >= len(CHATS)

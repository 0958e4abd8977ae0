"""vLLM/OpenAI API parity that real clients rely on, through the ``openai`` client and raw HTTP: prompt forms,
``n``, logprobs (completions and chat), echo with prompt logprobs, ``stop_token_ids``, ``min_tokens``, penalties,
``stream_options``, /tokenize and /detokenize, ``max_model_len``, 404 for an unknown model, and a client leaving
mid-stream. Logprobs and penalties are checked against Hugging Face transformers on the same checkpoint."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

import aiohttp
import openai
import pytest
import pytest_asyncio
import torch
import transformers

from tests.serving.conftest import MODEL, assert_no_block_leaked, client, idle, in_process, wait_metrics
from tests.serving.hf_checkpoint import save_checkpoint

pytestmark = pytest.mark.asyncio(loop_scope="session")
PROMPT = "The quick brown fox"
GREEDY = dict(temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True})


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tiny():  # noqa: ANN201
    async with in_process("standalone", lanes=2, kv_blocks=4, prefix_cache=True) as (_server, url):
        yield url


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, transformers.LlamaForCausalLM]:
    path = tmp_path_factory.mktemp("hf-llama")
    return path, save_checkpoint(path)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def hf_server(hf: tuple[Path, transformers.LlamaForCausalLM]):  # noqa: ANN201
    async with in_process("standalone", model_source=str(hf[0]), lanes=2, kv_blocks=4, prefix_cache=True) as (
            _server, url):
        yield url


async def post(url: str, path: str, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.post(f"{url}{path}", json=body) as r:
        return r.status, await r.json()


async def sse(url: str, path: str, body: dict) -> list[dict]:
    import json

    async with aiohttp.ClientSession() as s, s.post(f"{url}{path}", json={**body, "stream": True}) as r:
        assert r.status == 200, await r.text()
        text = await r.text()
    events = [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


# -- models, 404 ------------------------------------------------------------------------------------------------
async def test_unknown_model_is_404_model_not_found_on_every_route(tiny: str) -> None:
    c = client(tiny)
    with pytest.raises(openai.NotFoundError) as info:
        await c.completions.create(model="nope", prompt="x", max_tokens=1)
    assert info.value.body["code"] == "model_not_found" and info.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        await c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    for path, body in (("/tokenize", {"model": "nope", "prompt": "x"}), ("/detokenize", {"model": "nope",
                                                                                          "tokens": [1]})):
        status, err = await post(tiny, path, body)
        assert status == 404 and err["error"]["code"] == "model_not_found", path


async def test_models_card_has_max_model_len(tiny: str) -> None:
    async with aiohttp.ClientSession() as s, s.get(f"{tiny}/v1/models") as r:
        body = await r.json()
    assert r.status == 200 and body["data"][0]["max_model_len"] == 512 and body["data"][0]["id"] == MODEL


# -- prompt forms and n ------------------------------------------------------------------------------------------
async def test_every_prompt_form_gives_one_choice_per_prompt(tiny: str) -> None:
    c = client(tiny)
    one = await c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, **GREEDY)
    ids = list(PROMPT.encode())
    other = "Jumps over"
    two = (await c.completions.create(model=MODEL, prompt=other, max_tokens=6, **GREEDY)).choices[0]
    as_ids = await c.completions.create(model=MODEL, prompt=ids, max_tokens=6, **GREEDY)
    assert as_ids.choices[0].token_ids == one.choices[0].token_ids
    assert as_ids.usage.prompt_tokens == len(ids)
    for prompt in ([PROMPT, other], [ids, list(other.encode())]):
        out = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=6, **GREEDY)
        assert [ch.index for ch in out.choices] == [0, 1]
        assert [ch.token_ids for ch in out.choices] == [one.choices[0].token_ids, two.token_ids]
        assert [ch.text for ch in out.choices] == [one.choices[0].text, two.text]
        assert out.usage.prompt_tokens == len(ids) + len(other) and out.usage.completion_tokens == 12


async def test_n_choices_are_seeded_per_choice(tiny: str) -> None:
    c = client(tiny)
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, extra_body={"ignore_eos": True,
                                                                                        "return_token_ids": True})
    out = await c.completions.create(**args, n=3, seed=11)
    assert [ch.index for ch in out.choices] == [0, 1, 2]
    singles = [await c.completions.create(**args, seed=11 + j) for j in range(3)]
    # vLLM's rule: choice j of a request seeded s samples as a request seeded s + j.
    assert [ch.token_ids for ch in out.choices] == [s.choices[0].token_ids for s in singles]
    assert len({tuple(ch.token_ids) for ch in out.choices}) > 1
    assert out.usage.prompt_tokens == len(PROMPT) and out.usage.completion_tokens == 24
    # Two prompts x n=2: indexes prompt-major, as vLLM numbers them.
    both = await c.completions.create(**{**args, "prompt": [PROMPT, "Hi"]}, n=2, seed=11)
    assert [ch.index for ch in both.choices] == [0, 1, 2, 3]
    assert [both.choices[i].token_ids for i in (0, 1)] == [s.choices[0].token_ids for s in singles[:2]]
    streamed = await sse(tiny, "/v1/completions", {**args, **args["extra_body"], "n": 3, "seed": 11})
    per_index: dict[int, list[int]] = {}
    for ch in streamed:
        for choice in ch["choices"]:
            per_index.setdefault(choice["index"], []).extend(choice.get("token_ids") or [])
    assert [per_index[i] for i in range(3)] == [ch.token_ids for ch in out.choices]
    chat = await c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2,
                                           max_tokens=5, seed=3, extra_body={"ignore_eos": True})
    assert [ch.index for ch in chat.choices] == [0, 1] and chat.usage.completion_tokens == 10


async def test_a_refused_choice_leaves_nothing_queued(tiny: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client(tiny).completions.create(model=MODEL, prompt=["ok", "a" * 510], max_tokens=8)
    assert info.value.body["code"] == "context_length_exceeded"
    assert_no_block_leaked(await wait_metrics(tiny, idle, "an idle engine"))


# -- logprobs and echo, against transformers ---------------------------------------------------------------------
def hf_logprobs(model: transformers.LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    """Log-probabilities after each token of ``ids`` ([len(ids), vocab]), from transformers."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)


async def test_completion_logprobs_match_transformers_and_leave_greedy_unchanged(hf, hf_server: str) -> None:
    _path, model = hf
    c = client(hf_server)
    plain = await c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, **GREEDY)
    # Tokens as "token_id:<id>" (vLLM's return_tokens_as_token_ids): byte tokens >= 128 all read "\ufffd"
    out = await c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, logprobs=3, temperature=0,
                                     extra_body={**GREEDY["extra_body"], "return_tokens_as_token_ids": True})
    choice = out.choices[0]
    assert choice.token_ids == plain.choices[0].token_ids  # asking for logprobs never changes the tokens
    ids = list(PROMPT.encode())
    ref = hf_logprobs(model, ids + choice.token_ids)
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    for i, token in enumerate(choice.token_ids):
        row = ref[len(ids) + i - 1]
        assert lp.token_logprobs[i] == pytest.approx(float(row[token]), abs=1e-4)
        top = torch.topk(row, 3)
        assert len(lp.top_logprobs[i]) == 3  # greedy: the chosen token is the top one, so N entries
        assert sorted(lp.top_logprobs[i].values(), reverse=True) == pytest.approx(top.values.tolist(), abs=1e-4)
        assert lp.tokens[i] == f"token_id:{token}" and list(lp.top_logprobs[i]) == [f"token_id:{t}" for t in
                                                                                     top.indices.tolist()]
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    streamed = await sse(hf_server, "/v1/completions", dict(model=MODEL, prompt=PROMPT, max_tokens=6, logprobs=3,
                                                            temperature=0, ignore_eos=True,
                                                            return_tokens_as_token_ids=True))
    assert [x for ch in streamed for choice in ch["choices"] if choice["logprobs"]
            for x in choice["logprobs"]["text_offset"]] == lp.text_offset
    flat = [x for ch in streamed for choice in ch["choices"] if choice["logprobs"]
            for x in choice["logprobs"]["token_logprobs"]]
    assert flat == pytest.approx(lp.token_logprobs)


async def test_echo_scores_the_prompt_as_lm_eval_needs(hf, hf_server: str) -> None:
    """lm-eval's loglikelihood request: token ids, echo, logprobs=1, max_tokens=1, temperature 0."""
    _path, model = hf
    ids = [list(b"Paris is the capital of France"), list(b"2 + 2 = 4")]
    status, body = await post(hf_server, "/v1/completions", {"model": MODEL, "prompt": ids, "echo": True,
                                                             "logprobs": 1, "max_tokens": 1, "temperature": 0})
    assert status == 200, body
    for prompt, choice in zip(ids, body["choices"], strict=True):
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(prompt) + 1
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        ref = hf_logprobs(model, prompt)
        for i in range(1, len(prompt)):
            assert lp["token_logprobs"][i] == pytest.approx(float(ref[i - 1, prompt[i]]), abs=1e-4)
            best = float(ref[i - 1].max())
            assert max(lp["top_logprobs"][i].values()) == pytest.approx(best, abs=1e-4)
            assert 1 <= len(lp["top_logprobs"][i]) <= 2
        assert choice["text"].startswith(bytes(prompt).decode())
    # max_tokens 0: the prompt alone, scored (vLLM's echo without generation)
    status, body = await post(hf_server, "/v1/completions", {"model": MODEL, "prompt": "abc", "echo": True,
                                                             "logprobs": 0, "max_tokens": 0})
    choice = body["choices"][0]
    assert status == 200 and choice["text"] == "abc" and len(choice["logprobs"]["tokens"]) == 3
    # Prompt logprobs bypass the prefix cache: a second identical request scores the same.
    again = (await post(hf_server, "/v1/completions", {"model": MODEL, "prompt": "abc", "echo": True,
                                                       "logprobs": 0, "max_tokens": 0}))[1]["choices"][0]
    assert again["logprobs"] == choice["logprobs"]
    streamed = await sse(hf_server, "/v1/completions", {"model": MODEL, "prompt": "abc", "echo": True,
                                                        "logprobs": 0, "max_tokens": 0})
    assert "".join(ch["choices"][0]["text"] for ch in streamed) == "abc"


async def test_chat_logprobs_and_top_logprobs(hf, hf_server: str) -> None:
    c = client(hf_server)
    messages = [{"role": "user", "content": "Hello"}]
    plain = await c.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=0,
                                            extra_body={"ignore_eos": True})
    out = await c.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=0,
                                          logprobs=True, top_logprobs=4, extra_body={"ignore_eos": True})
    assert out.choices[0].message.content == plain.choices[0].message.content
    content = out.choices[0].logprobs.content
    assert len(content) == 5
    for item in content:
        assert len(item.top_logprobs) == 4 and item.top_logprobs[0].token == item.token
        assert item.top_logprobs[0].logprob == pytest.approx(item.logprob)
        assert [t.logprob for t in item.top_logprobs] == sorted((t.logprob for t in item.top_logprobs),
                                                                reverse=True)
        assert item.bytes == list(item.token.encode())
    status, err = await post(hf_server, "/v1/chat/completions", {"model": MODEL, "messages": messages,
                                                                 "top_logprobs": 2})
    assert status == 400 and err["error"]["param"] == "top_logprobs"
    streamed = await sse(hf_server, "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 5,
                                                             "temperature": 0, "logprobs": True, "ignore_eos": True})
    tokens = [x["token"] for ch in streamed for choice in ch["choices"] if choice.get("logprobs")
              for x in choice["logprobs"]["content"]]
    assert tokens == [item.token for item in content]


async def test_prompt_logprobs_on_a_backend_without_every_tokens_logits_are_refused() -> None:
    async with in_process("standalone", lanes=1, kv_blocks=2, prefix_cache=False) as (server, url):
        runner = server.engine.runner  # as a compiled prefill graph without every token's logits
        runner.capabilities = replace(runner.capabilities, every_token_logits=False)
        status, err = await post(url, "/v1/completions", {"model": MODEL, "prompt": "ab", "echo": True,
                                                          "logprobs": 1, "max_tokens": 1})
        assert status == 400 and err["error"]["param"] == "echo" and "last token's logits" in err["error"]["message"]
        status, _ = await post(url, "/v1/completions", {"model": MODEL, "prompt": "ab", "logprobs": 1,
                                                        "max_tokens": 1})
        assert status == 200  # logprobs of generated tokens need only the decode step's logits


# -- stop tokens, min_tokens, penalties --------------------------------------------------------------------------
async def test_stop_token_ids_end_without_the_stop_tokens_text(tiny: str) -> None:
    c = client(tiny)
    full = (await c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, **GREEDY)).choices[0]
    i, stop = next((i, t) for i, t in enumerate(full.token_ids) if i >= 2 and t < 128 and chr(t).isprintable())
    i = full.token_ids.index(stop)
    cut = (await c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True, "return_token_ids": True,
                                                  "stop_token_ids": [stop]})).choices[0]
    assert cut.token_ids == full.token_ids[: i + 1]  # the stop token is generated ...
    assert cut.text == bytes(full.token_ids[:i]).decode("utf-8", errors="replace")  # ... but not in the text
    assert cut.finish_reason == "stop" and cut.model_extra["stop_reason"] == stop
    streamed = await sse(tiny, "/v1/completions", dict(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                                       ignore_eos=True, stop_token_ids=[stop]))
    assert "".join(ch["choices"][0]["text"] for ch in streamed) == cut.text
    # min_tokens: no stop before that many tokens (the stop token is masked, as vLLM's sampler does).
    longer = (await c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                         extra_body={"ignore_eos": True, "return_token_ids": True,
                                                     "stop_token_ids": [stop], "min_tokens": i + 2})).choices[0]
    assert len(longer.token_ids) >= i + 2 and stop not in longer.token_ids[: i + 2]
    kept = (await c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                       extra_body={"ignore_eos": True, "stop_token_ids": [stop],
                                                   "include_stop_str_in_output": True})).choices[0]
    assert kept.text == bytes(full.token_ids[: i + 1]).decode("utf-8", errors="replace")


async def test_logit_bias_moves_greedy_choices(tiny: str) -> None:
    c = client(tiny)
    full = (await c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, **GREEDY)).choices[0].token_ids
    forced = (await c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
                                         logit_bias={"65": 100}, extra_body=GREEDY["extra_body"])).choices[0]
    assert forced.token_ids == [65] * 4 and forced.text == "AAAA"
    banned = (await c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
                                         logit_bias={str(full[0]): -100}, extra_body=GREEDY["extra_body"])).choices[0]
    assert banned.token_ids[0] != full[0]


def hf_penalized_greedy(model: transformers.LlamaForCausalLM, prompt: list[int], steps: int, rep: float,
                        presence: float, frequency: float) -> list[int]:
    """Greedy decoding with vLLM's penalty rules on transformers' logits: repetition (HF's own processor, over
    prompt and output), then presence and frequency over the output tokens."""
    rep_proc = transformers.RepetitionPenaltyLogitsProcessor(rep)
    ids = list(prompt)
    for _ in range(steps):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[:, -1].float()
        logits = rep_proc(torch.tensor([ids]), logits)[0]
        out = ids[len(prompt):]
        if out:
            counts = torch.bincount(torch.tensor(out), minlength=logits.numel()).float()
            logits = logits - frequency * counts - presence * (counts > 0).float()
        ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):]


@pytest.mark.parametrize(("rep", "presence", "frequency"), [(1.3, 0.0, 0.0), (1.0, 1.5, 0.0), (1.0, 0.0, 1.2),
                                                            (0.8, -0.5, 0.7)])
async def test_penalties_match_transformers(hf, hf_server: str, rep: float, presence: float,
                                            frequency: float) -> None:
    _path, model = hf
    prompt = list(b"abcabcabc")
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, "repetition_penalty": rep, "presence_penalty": presence,
            "frequency_penalty": frequency}
    status, out = await post(hf_server, "/v1/completions", body)
    assert status == 200, out
    want = hf_penalized_greedy(model, prompt, 10, rep, presence, frequency)
    assert out["choices"][0]["token_ids"] == want
    plain = (await post(hf_server, "/v1/completions", {**body, "repetition_penalty": 1.0, "presence_penalty": 0,
                                                       "frequency_penalty": 0}))[1]["choices"][0]["token_ids"]
    assert plain == hf_penalized_greedy(model, prompt, 10, 1.0, 0.0, 0.0)


# -- streaming usage -----------------------------------------------------------------------------------------------
async def test_stream_options_usage_last_and_continuous(tiny: str) -> None:
    body = dict(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, ignore_eos=True,
                stream_options={"include_usage": True, "continuous_usage_stats": True})
    chunks = await sse(tiny, "/v1/completions", body)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    counts = [ch["usage"]["completion_tokens"] for ch in chunks[:-1]]
    assert counts == list(range(1, 6)) and all(ch["usage"]["prompt_tokens"] == len(PROMPT) for ch in chunks)
    chat = await sse(tiny, "/v1/chat/completions", dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                        max_tokens=3, ignore_eos=True,
                                                        stream_options={"include_usage": True}))
    assert chat[-1]["usage"]["completion_tokens"] == 3 and "usage" not in chat[-2]


# -- tokenize / detokenize -----------------------------------------------------------------------------------------
async def test_tokenize_and_detokenize_as_vllm(tiny: str) -> None:
    status, body = await post(tiny, "/tokenize", {"model": MODEL, "prompt": "héllo"})
    assert status == 200 and body == {"count": 6, "max_model_len": 512, "tokens": list("héllo".encode()),
                                      "token_strs": None}
    status, back = await post(tiny, "/detokenize", {"model": MODEL, "tokens": body["tokens"]})
    assert status == 200 and back == {"prompt": "héllo"}
    messages = [{"role": "user", "content": "Hi"}]
    _, chat_tokens = await post(tiny, "/tokenize", {"messages": messages})
    out = await client(tiny).chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert chat_tokens["count"] == out.usage.prompt_tokens
    for path, body, param in (("/tokenize", {"prompt": 5}, "prompt"), ("/tokenize", {}, "prompt"),
                              ("/detokenize", {"tokens": [999]}, "tokens"), ("/detokenize", {"tokens": "x"},
                                                                              "tokens")):
        status, err = await post(tiny, path, body)
        assert status == 400 and err["error"]["param"] == param, (path, body, err)


async def test_tokenizer_info_serves_lm_evals_remote_tokenizer(hf_server: str, hf) -> None:
    """lm-eval's RemoteTokenizer (tokenizer_backend=auto) needs /tokenizer_info with eos_token, then tokenizes
    through /tokenize without special tokens and decodes through /detokenize."""
    async with aiohttp.ClientSession() as s, s.get(f"{hf_server}/tokenizer_info") as r:
        info = await r.json()
    assert r.status == 200 and info["eos_token"] == "<|endoftext|>" and info["model_max_length"] == 512
    tok = transformers.AutoTokenizer.from_pretrained(hf[0])
    _, body = await post(hf_server, "/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False})
    assert body["tokens"] == [tok.eos_token_id]
    _, body = await post(hf_server, "/tokenize", {"prompt": "héllo wörld", "add_special_tokens": False})
    assert body["tokens"] == tok("héllo wörld", add_special_tokens=False)["input_ids"]


# -- a client leaving --------------------------------------------------------------------------------------------
async def test_client_leaving_mid_stream_is_an_info_event(tiny: str, caplog: pytest.LogCaptureFixture) -> None:
    before = await wait_metrics(tiny, idle, "an idle engine")
    caplog.set_level(logging.INFO)
    for _ in range(3):
        async with aiohttp.ClientSession() as s:
            r = await s.post(f"{tiny}/v1/completions", json=dict(model=MODEL, prompt=PROMPT, max_tokens=400, n=2,
                                                                 stream=True, ignore_eos=True, temperature=0))
            await r.content.readline()  # the first event: both choices hold lanes
            r.close()
    m = await wait_metrics(tiny, lambda m: m["atom:requests_cancelled_total"]
                           == before["atom:requests_cancelled_total"] + 6 and idle(m), "the cancels",
                           timeout=90)
    assert_no_block_leaked(m)
    await asyncio.sleep(0.2)
    bad = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not bad, [(r.name, r.getMessage()) for r in bad]
    assert any("request_cancelled" in r.getMessage() for r in caplog.records)


# -- through PD: the decode side samples, the prefill worker scores the prompt ---------------------------------
PD_REQUESTS = [
    ("/v1/completions", {"prompt": [list(b"Paris is the capital"), list(b"of France")], "echo": True,
                         "logprobs": 2, "max_tokens": 1, "temperature": 0}),
    ("/v1/completions", {"prompt": "abc", "echo": True, "logprobs": 0, "max_tokens": 0}),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "logprobs": 3,
                         "repetition_penalty": 1.4, "frequency_penalty": 0.5, "return_token_ids": True}),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0.8, "seed": 5, "n": 2,
                         "ignore_eos": True, "presence_penalty": 1.0, "return_token_ids": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0,
                              "ignore_eos": True, "logprobs": True, "top_logprobs": 2, "min_tokens": 3}),
]


async def test_pd_gives_the_same_logprobs_echo_and_penalised_tokens(prefill_pair) -> None:  # noqa: ANN001
    async def run(url: str) -> list[list]:
        out = []
        for path, body in PD_REQUESTS:
            status, resp = await post(url, path, {"model": MODEL, **body})
            assert status == 200, resp
            out.append(resp["choices"])
        return out

    async with in_process("standalone", lanes=2, kv_blocks=5, prefix_cache=True) as (_s, url):
        direct = await run(url)
    workers = prefill_pair[:1]
    for prefetch in (False, True):
        settings = dict(lanes=1 if prefetch else 2, kv_blocks=4 if prefetch else 5, prefix_cache=True,
                        local_prefill=False, prefill_workers=workers[0].address, prefetch_next=prefetch)
        async with in_process("decode", **settings) as (_s, url):
            assert await run(url) == direct, f"prefetch={prefetch}"
            assert await run(url) == direct  # again, with the prefix cache warm
            assert_no_block_leaked(await wait_metrics(url, idle, "idle"))
    assert direct[0][0]["logprobs"]["token_logprobs"][0] is None and direct[1][0]["text"] == "abc"

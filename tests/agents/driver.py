"""One agent framework's normal call path against a running engine, run in the frameworks' own venv
(hack/agents-venv.sh): ``python driver.py CASE BASE_URL TEMPERATURE SEED CALL_BIAS`` prints one JSON line, the
case's outcome. ``CALL_BIAS`` (0: none) is a logit bias on the first token of a call (``<tool_call>``), sent as the
OpenAI field ``logit_bias`` through each framework's own settings.

Each case is what a user of that framework writes first: an output type, a tool, or both, through the framework's
own client. The outcome says whether the framework's call completed, what it parsed (validated by the framework
against ``Weather``, and again here), and how often the tool ran: the test decides what a pass is. Only the
framework and pydantic are imported at the top: the cases import their framework, so one driver serves the agents
venv and the instructor venv.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
import urllib.request
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

MODEL = "smollm2"
QUESTION = "What is the weather in Paris?"
INSTRUCTIONS = ("You are a weather assistant. Call get_weather to learn the weather, then answer with the city"
                " and its temperature in degrees Celsius.")
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # no exporter: the tests run offline


class Weather(BaseModel):
    city: str
    temperature_c: int


tool_runs: list[str] = []  # the cities get_weather was called with, in order


def get_weather(city: str) -> str:
    """The current weather in a city."""
    tool_runs.append(city)
    return json.dumps({"city": city, "temperature_c": 18, "sky": "sunny"})


SAMPLING: dict[str, Any] = {"temperature": 0.0, "seed": 0}  # set from the command line, with "logit_bias"


def call_start_bias(base_url: str, bias: float) -> dict[str, float]:
    """``logit_bias`` for the first token of ``<tool_call>`` in the served tokenizer (the engine's /tokenize)."""
    request = urllib.request.Request(f"{base_url}/tokenize", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"model": MODEL, "prompt": "<tool_call>",
                                                      "add_special_tokens": False}).encode())
    with urllib.request.urlopen(request, timeout=30) as r:
        return {str(json.load(r)["tokens"][0]): bias}


# --- openai-agents ---------------------------------------------------------------------------------------------

async def _openai_agents(base_url: str, api: str, tool_choice: str) -> Any:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused")
    model = (OpenAIResponsesModel(model=MODEL, openai_client=client) if api == "responses"
             else OpenAIChatCompletionsModel(model=MODEL, openai_client=client))
    extra = {k: v for k, v in SAMPLING.items() if k != "temperature"}  # seed, logit_bias: not ModelSettings'
    agent = Agent(name="weather", instructions=INSTRUCTIONS, model=model, tools=[function_tool(get_weather)],
                  output_type=Weather,
                  model_settings=ModelSettings(tool_choice=tool_choice, temperature=SAMPLING["temperature"],
                                               max_tokens=96, extra_body=extra))
    result = await Runner.run(agent, QUESTION, max_turns=12)
    return result.final_output


def openai_agents_responses_required(base_url: str) -> Any:
    return asyncio.run(_openai_agents(base_url, "responses", "required"))


def openai_agents_responses_auto(base_url: str) -> Any:
    return asyncio.run(_openai_agents(base_url, "responses", "auto"))


def openai_agents_chat_required(base_url: str) -> Any:
    return asyncio.run(_openai_agents(base_url, "chat", "required"))


def openai_agents_chat_auto(base_url: str) -> Any:
    return asyncio.run(_openai_agents(base_url, "chat", "auto"))


# --- pydantic-ai -----------------------------------------------------------------------------------------------

def _pydantic_ai_agent(base_url: str, output_type: Any) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=f"{base_url}/v1", api_key="unused"))
    agent = Agent(model, output_type=output_type, instructions=INSTRUCTIONS)
    agent.tool_plain(get_weather)
    return agent


def _pydantic_ai_run(agent: Any) -> Any:
    from pydantic_ai.usage import UsageLimits

    result = agent.run_sync(QUESTION, model_settings={**SAMPLING, "max_tokens": 96},
                            usage_limits=UsageLimits(request_limit=12))
    return result.output


def pydantic_ai_tool_output(base_url: str) -> Any:
    """The default: the output is a tool (``final_result``) beside get_weather."""
    from pydantic_ai import ToolOutput

    return _pydantic_ai_run(_pydantic_ai_agent(base_url, ToolOutput(Weather)))


def pydantic_ai_native_output(base_url: str) -> Any:
    """``NativeOutput``: the output is the response format, with get_weather offered under ``auto``."""
    from pydantic_ai import NativeOutput

    return _pydantic_ai_run(_pydantic_ai_agent(base_url, NativeOutput(Weather)))


# --- langchain-openai ------------------------------------------------------------------------------------------

def _chat_openai(base_url: str) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=MODEL, base_url=f"{base_url}/v1", api_key="unused", max_tokens=96, **SAMPLING)


def langchain_structured_output(base_url: str) -> Any:
    """``with_structured_output``'s default method (a JSON schema response format)."""
    return _chat_openai(base_url).with_structured_output(Weather).invoke(QUESTION)


def langchain_structured_output_function_calling(base_url: str) -> Any:
    """``with_structured_output(method="function_calling")``: the schema as a forced tool."""
    return _chat_openai(base_url).with_structured_output(Weather, method="function_calling").invoke(QUESTION)


def langchain_bind_tools(base_url: str) -> Any:
    """A ``bind_tools`` round trip as langchain's guide writes one: the first turn must call the tool
    (``tool_choice`` naming it), the tool runs, its ToolMessage goes back, and the model, the tool still bound
    (``auto``), answers in text. The answer is returned as is (a string)."""
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_core.tools import tool

    weather_tool = tool(get_weather)
    llm = _chat_openai(base_url)
    messages: list[Any] = [SystemMessage(INSTRUCTIONS), HumanMessage(QUESTION)]
    reply = llm.bind_tools([weather_tool], tool_choice="get_weather").invoke(messages)
    messages.append(reply)
    for call in reply.tool_calls:
        messages.append(weather_tool.invoke(call))  # a ToolMessage with the call's id
    answer = llm.bind_tools([weather_tool]).invoke(messages)
    if answer.tool_calls:
        raise RuntimeError(f"the answering turn called again: {answer.tool_calls!r}")
    return answer.content


# --- instructor (its own venv) ---------------------------------------------------------------------------------

def _instructor(base_url: str, mode_name: str) -> Any:
    import instructor
    from openai import OpenAI

    return instructor.from_openai(OpenAI(base_url=f"{base_url}/v1", api_key="unused"),
                                  mode=getattr(instructor.Mode, mode_name))


def _instructor_chat(base_url: str, mode_name: str) -> Any:
    client = _instructor(base_url, mode_name)
    return client.chat.completions.create(model=MODEL, response_model=Weather, max_retries=0, max_tokens=96,
                                          messages=[{"role": "user", "content": QUESTION}], **SAMPLING)


def instructor_tools(base_url: str) -> Any:
    return _instructor_chat(base_url, "TOOLS")


def instructor_json_schema(base_url: str) -> Any:
    return _instructor_chat(base_url, "JSON_SCHEMA")


def instructor_responses_tools(base_url: str) -> Any:
    client = _instructor(base_url, "RESPONSES_TOOLS")
    return client.responses.create(model=MODEL, response_model=Weather, max_retries=0, max_output_tokens=96,
                                   input=QUESTION, temperature=SAMPLING["temperature"])


partials: list[dict[str, Any]] = []  # what create_partial yielded, in order


def instructor_create_partial(base_url: str) -> Any:
    """Partial objects streamed in TOOLS mode: the call's arguments must arrive in fragments to yield more than
    one partial."""
    client = _instructor(base_url, "TOOLS")
    last = None
    for last in client.chat.completions.create_partial(
            model=MODEL, response_model=Weather, max_retries=0, max_tokens=96,
            messages=[{"role": "user", "content": QUESTION}], **SAMPLING):
        partials.append(last.model_dump())
    return None if last is None else Weather.model_validate(last.model_dump())


CASES: dict[str, Callable[[str], Any]] = {fn.__name__: fn for fn in (
    openai_agents_responses_required, openai_agents_responses_auto, openai_agents_chat_required,
    openai_agents_chat_auto, pydantic_ai_tool_output, pydantic_ai_native_output, langchain_structured_output,
    langchain_structured_output_function_calling, langchain_bind_tools, instructor_tools, instructor_json_schema,
    instructor_responses_tools, instructor_create_partial)}


def run(case: str, base_url: str) -> dict[str, Any]:
    outcome: dict[str, Any] = {"case": case, **SAMPLING}
    try:
        output = CASES[case](base_url)
    except Exception as exc:  # noqa: BLE001 - the outcome carries it: the test shows the framework's own error
        outcome.update(completed=False, error=f"{type(exc).__name__}: {exc}",
                       traceback=traceback.format_exc()[-3000:])
    else:
        outcome["completed"] = True
        if isinstance(output, BaseModel):
            outcome["output"] = output.model_dump()
            outcome["valid"] = Weather.model_validate(output.model_dump()) is not None
        else:
            outcome["output"] = output
            outcome["valid"] = False
    outcome.update(tool_runs=list(tool_runs), partials=len(partials))
    return outcome


if __name__ == "__main__":
    name, url, temperature, seed, bias = sys.argv[1:6]
    SAMPLING.update(temperature=float(temperature), seed=int(seed))
    if float(bias):
        SAMPLING["logit_bias"] = call_start_bias(url, float(bias))
    print(json.dumps(run(name, url)))

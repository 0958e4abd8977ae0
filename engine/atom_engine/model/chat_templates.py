"""Chat templates the engine ships, for checkpoints whose own template cannot do what agents ask (tools).

Torch-free: the settings name them (``EngineSettings.chat_template``). A template here renders as a checkpoint's
does (:mod:`atom_engine.server.chat`): Jinja in transformers' sandbox, the messages as the chat route hands them
over (a call's ``arguments`` an object), ``tools`` as ``apply_chat_template(tools=...)`` passes them.

``smollm2-hermes``: SmolLM2-135M-Instruct's ChatML with tools in the Hermes format, laid out as Qwen2.5's template
lays them: the tools as JSON signatures inside ``<tools></tools>`` at the end of the system turn, each call an
assistant's ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, and each result a ``tool`` turn holding
the result as it is (not Qwen2.5's ``<tool_response>`` user turn: SmolLM2-135M repeats such a turn's tags back
rather than answering from it). Without tools and tool messages it renders exactly as SmolLM2's own template (the
same default system prompt, the same turns), so plain chats keep their prompt tokens. A call in the history is
written as the engine's tool grammar writes one (:mod:`atom_engine.server.tools`), so a conversation carried back
reads as the model wrote it.
"""

from __future__ import annotations

SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

SMOLLM2_HERMES = r"""
{%- macro tools_block() -%}
{{- '\n\n# Tools\n\nYou can call functions to answer the user.' }}
{{- ' Their signatures, as JSON, are inside <tools></tools>:\n<tools>' }}
{%- for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}
{{- '\n</tools>\n\nTo call a function, answer with its name and arguments as a JSON object inside' }}
{{- ' <tool_call></tool_call>:\n<tool_call>\n{"name": <function-name>, "arguments": <arguments-json-object>}' }}
{{- '\n</tool_call>' }}
{%- endmacro -%}
{%- for message in messages %}
{%- if loop.first and message.role != 'system' %}
{{- '<|im_start|>system\n' + '""" + SMOLLM2_SYSTEM + r"""' }}
{%- if tools %}{{ tools_block() }}{% endif %}{{ '<|im_end|>\n' }}
{%- endif %}
{%- if loop.first and message.role == 'system' %}
{{- '<|im_start|>system\n' + message.content }}{% if tools %}{{ tools_block() }}{% endif %}{{ '<|im_end|>\n' }}
{%- elif message.role == 'assistant' and message.tool_calls %}
{{- '<|im_start|>assistant\n' }}{% if message.content %}{{ message.content + '\n' }}{% endif %}
{%- for call in message.tool_calls %}
{{- ('\n' if not loop.first else '') + '<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' }}
{{- (call.function.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>tool\n' + message.content + '<|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
"""
# name -> template source; EngineSettings.chat_template takes these names besides "auto" and "checkpoint".
CHAT_TEMPLATES: dict[str, str] = {"smollm2-hermes": SMOLLM2_HERMES}

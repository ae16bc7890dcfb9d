#!/usr/bin/env python3
"""Checks our chat prompts (chat_dump) against jinja2 rendering the same
templates as Hugging Face's apply_chat_template does (a sandboxed jinja2
environment with trim_blocks and lstrip_blocks, raise_exception and
strftime_now, add_generation_prompt=True).

  check_chat_template.py --tool build/tests/reference/chat_dump \\
      --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf --workdir /tmp/chat

Templates: SmolLM2's own, read from the GGUF (ChatML with a default system
prompt, real newlines in its literals); and, written here to the published
formats of each family (escaped newlines in their literals): Llama 3
Instruct, Llama 3.1 (dated system block), Llama 3.2 (dated with today via
strftime_now), Qwen2 and Qwen2.5 (their default system prompts), Mistral
v0.2 and v0.1 ([INST] turns; the roles they refuse with raise_exception we
must refuse too), Llama 2 chat (<<SYS>> in the first turn) and Mistral
v0.3 (the system message in the last turn), Gemma 3 (<start_of_turn>
turns, the system message in front of the first), gpt-oss's harmony (its
plain-conversation branches; tools are refused), DeepSeek R1's (its
prompt opens <think>), V3's, the first R1-Distill models' and V3.1's
(enable_thinking), GLM-4.5's (reasoning, /nothink). Every conversation must
render identically. Templates of other formats (another <<SYS>> layout, an
unknown one) must be refused, not rendered wrongly.

Tools: Qwen2.5's and Qwen3's full templates (their tools, tool-call and
tool-result branches; Qwen3's <think> handling) and Llama 3.1's and 3.2's
(JSON calls, tools in the first user message, ipython results) render conversations with `tools`, assistant messages carrying
`tool_calls` and `tool` messages, compared with jinja2 given the same
messages as transformers passes them (arguments as dicts, tojson as
transformers defines it: json.dumps, ensure_ascii=False, keys unsorted).
Every other template must refuse the same conversations (tools, the tool
role or tool calls), naming the field, not drop the tools silently.

Exit 0: all match; 1: a mismatch; 2: a tool or usage error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

NOW = datetime.datetime(2026, 12, 1, 9, 30, tzinfo=datetime.timezone.utc)

LLAMA3 = r"""{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"""

LLAMA31_DATE = r"""{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}"""

LLAMA32_DATE = r"""{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}"""

LLAMA31_BODY = r"""
{#- The leading system message, if any, goes into the dated block. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

# Llama 3.1-Instruct's template as published (tokenizer_config.json),
# after its date block: JSON tool calls, tools in the first user message
# by default, tool results in ipython turns. Llama 3.2's is the same with
# its own date block.
LLAMA31_TOOLS_BODY = r"""
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

LLAMA31_TOOLS_HEAD = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
"""
LLAMA31_TOOLS = LLAMA31_TOOLS_HEAD + LLAMA31_DATE + LLAMA31_TOOLS_BODY
LLAMA32_TOOLS = LLAMA31_TOOLS_HEAD + LLAMA32_DATE + LLAMA31_TOOLS_BODY

LLAMA31 = "{{- bos_token }}\n" + LLAMA31_DATE + LLAMA31_BODY
LLAMA32 = "{{- bos_token }}\n" + LLAMA32_DATE + LLAMA31_BODY

QWEN2 = r"""{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"""

QWEN25 = r"""{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant") %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

MISTRAL = r"""{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"""

# Mistral v0.1's variant: a space after each answer's </s>.
MISTRAL01 = MISTRAL.replace("message['content'] + eos_token }}",
                            "message['content'] + eos_token + ' ' }}")

# Llama 2 chat (Llama-2-*-chat-hf): the system message in <<SYS>> at the
# front of the first user turn, every turn stripped, BOS before each [INST].
LLAMA2 = r"""{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"""

# Mistral v0.3's format (its tool-call branches left out: the API takes no
# tools): the system message in front of the last user turn, "[/INST]"
# with no space before it.
MISTRAL03 = r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- set ns = namespace(index=0) %}
{%- for message in loop_messages %}
    {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
        {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif %}
    {%- set ns.index = ns.index + 1 %}
{%- endfor %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

# Qwen2.5-Instruct's template as published, tool branches included.
QWEN25_TOOLS = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# Qwen3's template as published (Qwen3-0.6B's tokenizer_config.json, the
# revision whose checks read "message.content is string"): Hermes calls
# and results as Qwen2.5's, no default system prompt, <think> blocks kept
# on the assistant's turns after the last user query.
QWEN3 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""

# Gemma 3 (google/gemma-3-*-it's chat_template; Gemma's <start_of_turn>
# turns, a system message folded into the first turn).
GEMMA3 = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

# Gemma 2 (google/gemma-2-*-it's chat_template): Gemma 3's turns, but a
# system message is refused.
GEMMA2 = r"""{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"""

# An [INST] format of no family we know (<<SYS>> blocks as messages of
# their own): must be refused, not rendered as Llama 2.
# gpt-oss's harmony template, its plain-conversation branches as published
# (the system block with strftime_now and the default reasoning effort, the
# leading system or developer message as the developer block, user turns
# and final answers; later system messages fall through every branch).
HARMONY = r"""{#- gpt-oss (harmony) -#}
{%- macro build_system_message() -%}
    {%- if model_identity is not defined %}
        {%- set model_identity = "You are ChatGPT, a large language model trained by OpenAI." %}
    {%- endif %}
    {{- model_identity + "\n" }}
    {{- "Knowledge cutoff: 2024-06\n" }}
    {{- "Current date: " + strftime_now("%Y-%m-%d") + "\n\n" }}
    {%- if reasoning_effort is not defined %}
        {%- set reasoning_effort = "medium" %}
    {%- endif %}
    {{- "Reasoning: " + reasoning_effort + "\n\n" }}
    {{- "# Valid channels: analysis, commentary, final. Channel must be included for every message." }}
{%- endmacro -%}
{{- "<|start|>system<|message|>" }}
{{- build_system_message() }}
{{- "<|end|>" }}
{%- if messages[0].role == "developer" or messages[0].role == "system" %}
    {%- set developer_message = messages[0].content %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set developer_message = "" %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if developer_message or tools %}
    {{- "<|start|>developer<|message|>" }}
    {%- if developer_message %}
        {{- "# Instructions\n\n" }}
        {{- developer_message }}
        {{- "\n\n" }}
    {%- endif %}
    {{- "<|end|>" }}
{%- endif %}
{%- for message in loop_messages -%}
    {%- if message.role == 'assistant' -%}
        {%- if "content" in message %}
            {%- if "<|channel|>analysis<|message|>" in message.content or "<|channel|>final<|message|>" in message.content %}
                {{- raise_exception("You have passed a message containing <|channel|> tags in the content field.") }}
            {%- endif %}
        {%- endif %}
        {{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|end|>" }}
    {%- elif message.role == 'user' -%}
        {{- "<|start|>user<|message|>" + message.content + "<|end|>" }}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|start|>assistant
{%- endif -%}"""

# gpt-oss's template whole as published (chat_template.jinja of
# openai/gpt-oss-20b), less its comments, its built-in browser and python
# tools (the builtin_tools variable, which no request sets) and the wording
# of its errors: the functions namespace (JSON Schemas as TypeScript types),
# calls on the commentary channel and tool results.
HARMONY_TOOLS = r"""{#- gpt-oss (harmony) -#}
{%- macro render_typescript_type(param_spec, required_params, is_nullable=false) -%}
    {%- if param_spec.type == "array" -%}
        {%- if 'items' in param_spec -%}
            {%- if param_spec['items']['type'] == "string" -%}
                {{- "string[]" }}
            {%- elif param_spec['items']['type'] == "number" -%}
                {{- "number[]" }}
            {%- elif param_spec['items']['type'] == "integer" -%}
                {{- "number[]" }}
            {%- elif param_spec['items']['type'] == "boolean" -%}
                {{- "boolean[]" }}
            {%- else -%}
                {%- set inner_type = render_typescript_type(param_spec['items'], required_params) -%}
                {%- if inner_type == "object | object" or inner_type|length > 50 -%}
                    {{- "any[]" }}
                {%- else -%}
                    {{- inner_type + "[]" }}
                {%- endif -%}
            {%- endif -%}
            {%- if param_spec.nullable -%}
                {{- " | null" }}
            {%- endif -%}
        {%- else -%}
            {{- "any[]" }}
            {%- if param_spec.nullable -%}
                {{- " | null" }}
            {%- endif -%}
        {%- endif -%}
    {%- elif param_spec.type is defined and param_spec.type is iterable and param_spec.type is not string and param_spec.type is not mapping and param_spec.type[0] is defined -%}
        {#- Handle array of types like ["object", "object"] from Union[dict, list] #}
        {%- if param_spec.type | length > 1 -%}
            {{- param_spec.type | join(" | ") }}
        {%- else -%}
            {{- param_spec.type[0] }}
        {%- endif -%}
    {%- elif param_spec.oneOf -%}
        {#- Handle oneOf schemas - check for complex unions and fallback to any #}
        {%- set has_object_variants = false -%}
        {%- for variant in param_spec.oneOf -%}
            {%- if variant.type == "object" -%}
                {%- set has_object_variants = true -%}
            {%- endif -%}
        {%- endfor -%}
        {%- if has_object_variants and param_spec.oneOf|length > 1 -%}
            {{- "any" }}
        {%- else -%}
            {%- for variant in param_spec.oneOf -%}
                {{- render_typescript_type(variant, required_params) -}}
                {%- if variant.description %}
                    {{- "// " + variant.description }}
                {%- endif -%}
                {%- if variant.default is defined %}
                    {{ "// default: " + variant.default|tojson }}
                {%- endif -%}
                {%- if not loop.last %}
                    {{- " | " }}
                {% endif -%}
            {%- endfor -%}
        {%- endif -%}
    {%- elif param_spec.type == "string" -%}
        {%- if param_spec.enum -%}
            {{- '"' + param_spec.enum|join('" | "') + '"' -}}
        {%- else -%}
            {{- "string" }}
            {%- if param_spec.nullable %}
                {{- " | null" }}
            {%- endif -%}
        {%- endif -%}
    {%- elif param_spec.type == "number" -%}
        {{- "number" }}
    {%- elif param_spec.type == "integer" -%}
        {{- "number" }}
    {%- elif param_spec.type == "boolean" -%}
        {{- "boolean" }}

    {%- elif param_spec.type == "object" -%}
        {%- if param_spec.properties -%}
            {{- "{\n" }}
            {%- for prop_name, prop_spec in param_spec.properties.items() -%}
                {{- prop_name -}}
                {%- if prop_name not in (param_spec.required or []) -%}
                    {{- "?" }}
                {%- endif -%}
                {{- ": " }}
                {{ render_typescript_type(prop_spec, param_spec.required or []) }}
                {%- if not loop.last -%}
                    {{-", " }}
                {%- endif -%}
            {%- endfor -%}
            {{- "}" }}
        {%- else -%}
            {{- "object" }}
        {%- endif -%}
    {%- else -%}
        {{- "any" }}
    {%- endif -%}
{%- endmacro -%}

{%- macro render_tool_namespace(namespace_name, tools) -%}
    {{- "## " + namespace_name + "\n\n" }}
    {{- "namespace " + namespace_name + " {\n\n" }}
    {%- for tool in tools %}
        {%- set tool = tool.function %}
        {{- "// " + tool.description + "\n" }}
        {{- "type "+ tool.name + " = " }}
        {%- if tool.parameters and tool.parameters.properties %}
            {{- "(_: {\n" }}
            {%- for param_name, param_spec in tool.parameters.properties.items() %}
                {%- if param_spec.description %}
                    {{- "// " + param_spec.description + "\n" }}
                {%- endif %}
                {{- param_name }}
                {%- if param_name not in (tool.parameters.required or []) -%}
                    {{- "?" }}
                {%- endif -%}
                {{- ": " }}
                {{- render_typescript_type(param_spec, tool.parameters.required or []) }}
                {%- if param_spec.default is defined -%}
                    {%- if param_spec.enum %}
                        {{- ", // default: " + param_spec.default }}
                    {%- elif param_spec.oneOf %}
                        {{- "// default: " + param_spec.default }}
                    {%- else %}
                        {{- ", // default: " + param_spec.default|tojson }}
                    {%- endif -%}
                {%- endif -%}
                {%- if not loop.last %}
                    {{- ",\n" }}
                {%- else %}
                    {{- ",\n" }}
                {%- endif -%}
            {%- endfor %}
            {{- "}) => any;\n\n" }}
        {%- else -%}
            {{- "() => any;\n\n" }}
        {%- endif -%}
    {%- endfor %}
    {{- "} // namespace " + namespace_name }}
{%- endmacro -%}

{%- macro build_system_message() -%}
    {%- if model_identity is not defined %}
        {%- set model_identity = "You are ChatGPT, a large language model trained by OpenAI." %}
    {%- endif %}
    {{- model_identity + "\n" }}
    {{- "Knowledge cutoff: 2024-06\n" }}
    {{- "Current date: " + strftime_now("%Y-%m-%d") + "\n\n" }}
    {%- if reasoning_effort is not defined %}
        {%- set reasoning_effort = "medium" %}
    {%- endif %}
    {{- "Reasoning: " + reasoning_effort + "\n\n" }}
    {{- "# Valid channels: analysis, commentary, final. Channel must be included for every message." }}
    {%- if tools -%}
        {{- "\nCalls to these tools must go to the commentary channel: 'functions'." }}
    {%- endif -%}
{%- endmacro -%}

{{- "<|start|>system<|message|>" }}
{{- build_system_message() }}
{{- "<|end|>" }}

{%- if messages[0].role == "developer" or messages[0].role == "system" %}
    {%- set developer_message = messages[0].content %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set developer_message = "" %}
    {%- set loop_messages = messages %}
{%- endif %}

{%- if developer_message or tools %}
    {{- "<|start|>developer<|message|>" }}
    {%- if developer_message %}
        {{- "# Instructions\n\n" }}
        {{- developer_message }}
        {{- "\n\n" }}
    {%- endif %}
    {%- if tools -%}
        {{- "# Tools\n\n" }}
        {{- render_tool_namespace("functions", tools) }}
    {%- endif -%}
    {{- "<|end|>" }}
{%- endif %}

{%- set last_tool_call = namespace(name=none) %}
{%- for message in loop_messages -%}
    {%- if message.role == 'assistant' -%}
        {%- if "content" in message %}
            {%- if "<|channel|>analysis<|message|>" in message.content or "<|channel|>final<|message|>" in message.content %}
                {{- raise_exception("You have passed a message containing <|channel|> tags in the content field.") }}
            {%- endif %}
        {%- endif %}
        {%- if "thinking" in message %}
            {%- if "<|channel|>analysis<|message|>" in message.thinking or "<|channel|>final<|message|>" in message.thinking %}
                {{- raise_exception("You have passed a message containing <|channel|> tags in the thinking field.") }}
            {%- endif %}
        {%- endif %}
        {%- if "tool_calls" in message %}
            {%- set future_final_message = namespace(found=false) %}
            {%- for future_message in loop_messages[loop.index:] %}
                {%- if future_message.role == 'assistant' and "tool_calls" not in future_message %}
                    {%- set future_final_message.found = true %}
                {%- endif %}
            {%- endfor %}
            {%- set tool_call = message.tool_calls[0] %}
            {%- if tool_call.function %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {%- if message.content and message.thinking %}
                {{- raise_exception("Cannot pass both content and thinking in an assistant message with tool calls!") }}
            {%- elif message.content and not future_final_message.found %}
                {{- "<|start|>assistant<|channel|>analysis<|message|>" + message.content + "<|end|>" }}
            {%- elif message.thinking and not future_final_message.found %}
                {{- "<|start|>assistant<|channel|>analysis<|message|>" + message.thinking + "<|end|>" }}
            {%- endif %}
            {{- "<|start|>assistant to=" }}
            {{- "functions." + tool_call.name + "<|channel|>commentary " }}
            {{- (tool_call.content_type if tool_call.content_type is defined else "json") + "<|message|>" }}
            {{- tool_call.arguments|tojson }}
            {{- "<|call|>" }}
            {%- set last_tool_call.name = tool_call.name %}
        {%- elif loop.last and not add_generation_prompt %}
            {%- if "thinking" in message %}
                {{- "<|start|>assistant<|channel|>analysis<|message|>" + message.thinking + "<|end|>" }}
            {%- endif %}
            {{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|return|>" }}
        {%- else %}
            {{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|end|>" }}
            {%- set last_tool_call.name = none %}
        {%- endif %}
    {%- elif message.role == 'tool' -%}
        {%- if last_tool_call.name is none %}
            {{- raise_exception("Message has tool role, but there was no previous assistant message with a tool call!") }}
        {%- endif %}
        {{- "<|start|>functions." + last_tool_call.name }}
        {{- " to=assistant<|channel|>commentary<|message|>" + message.content|tojson + "<|end|>" }}
    {%- elif message.role == 'user' -%}
        {{- "<|start|>user<|message|>" + message.content + "<|end|>" }}
    {%- endif -%}
{%- endfor -%}

{%- if add_generation_prompt -%}
<|start|>assistant
{%- endif -%}"""

# DeepSeek R1's template as its tokenizer_config.json publishes it (the
# version whose generation prompt opens <think>): system messages joined by
# a blank line, an answer past its last </think>, its tool branches.
DEEPSEEK_R1 = r"""{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) %}{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}{%- else %}{% set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] %}{%- endif %}{%- endif %}{%- endfor %}{{ bos_token }}{{ ns.system_prompt }}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and 'tool_calls' in message %}{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls'] %}{%- if not ns.is_first %}{%- if message['content'] is none %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}{%- else %}{{'<｜Assistant｜>' + message['content'] + '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}{%- set ns.is_first = true -%}{%- else %}{{'\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}{%- endfor %}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- if message['role'] == 'assistant' and 'tool_calls' not in message %}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}{{'<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\n'}}{% endif %}"""

# The same layout with a generation prompt that opens no <think> block,
# as DeepSeek V3's template ends.
DEEPSEEK_V3 = DEEPSEEK_R1.replace(r"{{'<｜Assistant｜><think>\n'}}",
                                  "{{'<｜Assistant｜>'}}")
assert DEEPSEEK_V3 != DEEPSEEK_R1

# The first R1-Distill models' template (January 2025): the last system
# message alone, list contents joined, no <think> in the prompt.
DEEPSEEK_R1_DISTILL = r"""{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{% set content = message['content'] %}{% if content is not string %}{% set content = content|join('') %}{% endif %}{{'<｜User｜>' + content}}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls']%}{%- if not ns.is_first %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}{%- set ns.is_first = true -%}{%- else %}{{'\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is not none %}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}{{'\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}"""

# DeepSeek V3.1's, as llama.cpp keeps it (models/templates/
# deepseek-ai-DeepSeek-V3.1.jinja): </think> after each user turn's
# <｜Assistant｜> (or <think>, with thinking / enable_thinking, in the
# generation prompt), an answer past its first </think>.
DEEPSEEK_V31 = r"""{% if not add_generation_prompt is defined -%}
  {%- set add_generation_prompt = false -%}
{%- endif -%}
{%- if not thinking is defined -%}
  {%- if enable_thinking is defined -%}
    {%- set thinking = enable_thinking -%}
    {%- else -%}
    {%- set thinking = false -%}
  {%- endif -%}
{%- endif -%}
{%- set ns = namespace(is_first=false, is_tool=false, system_prompt='', is_first_sp=true, is_last_user=false) -%}
{%- for message in messages -%}
  {%- if message['role'] == 'system' -%}
    {%- if ns.is_first_sp -%}
      {%- set ns.system_prompt = ns.system_prompt + message['content'] -%}
      {%- set ns.is_first_sp = false -%}
      {%- else -%}
      {%- set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] -%}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}{{ bos_token }}{{ ns.system_prompt }}
{%- for message in messages -%}
  {%- if message['role'] == 'user' -%}
    {%- set ns.is_tool = false -%}
    {%- set ns.is_first = false -%}
    {%- set ns.is_last_user = true -%}{{'<｜User｜>' + message['content']}}
  {%- endif -%}
  {%- if message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] is not none -%}
    {%- if ns.is_last_user -%}{{'<｜Assistant｜></think>'}}
    {%- endif -%}
    {%- set ns.is_last_user = false -%}
    {%- set ns.is_first = false -%}
    {%- set ns.is_tool = false -%}
    {%- for tool in message['tool_calls'] -%}
      {%- if not ns.is_first -%}
        {%- if message['content'] is none -%}{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>' + tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}
          {%- else -%}{{message['content'] + '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['function']['name'] + '<｜tool▁sep｜>' + tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}
        {%- endif -%}
        {%- set ns.is_first = true -%}
        {%- else -%}{{'<｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>' + tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}
      {%- endif -%}
    {%- endfor -%}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}
  {%- endif -%}
  {%- if message['role'] == 'assistant' and (message['tool_calls'] is not defined or message['tool_calls'] is none) -%}
    {%- if ns.is_last_user -%}{{'<｜Assistant｜>'}}
      {%- if message['prefix'] is defined and message['prefix'] and thinking -%}{{'<think>'}}
        {%- else -%}{{'</think>'}}
      {%- endif -%}
    {%- endif -%}
    {%- set ns.is_last_user = false -%}
    {%- if ns.is_tool -%}{{message['content'] + '<｜end▁of▁sentence｜>'}}
      {%- set ns.is_tool = false -%}
      {%- else -%}
      {%- set content = message['content'] -%}
      {%- if '</think>' in content -%}
        {%- set content = content.split('</think>', 1)[1] -%}
      {%- endif -%}{{content + '<｜end▁of▁sentence｜>'}}
    {%- endif -%}
  {%- endif -%}
  {%- if message['role'] == 'tool' -%}
    {%- set ns.is_last_user = false -%}
    {%- set ns.is_tool = true -%}{{'<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt and ns.is_last_user and not ns.is_tool -%}{{'<｜Assistant｜>'}}
  {%- if not thinking -%}{{'</think>'}}
    {%- else -%}{{'<think>'}}
  {%- endif -%}
{%- endif %}"""

# A DeepSeek variant with the user's turn and <｜Assistant｜> in one
# expression (and the answer without it): refused, not rendered wrongly.
DEEPSEEK_USER_ASSISTANT = DEEPSEEK_V3.replace(
    "{{'<｜User｜>' + message['content']}}",
    "{{'<｜User｜>' + message['content'] + '<｜Assistant｜>'}}").replace(
    "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}",
    "{{content + '<｜end▁of▁sentence｜>'}}")

# GLM-4.5's template, as the llama.cpp discussion of PR 15186 carries it
# (GLM-4.5 and 4.5-Air): turn markers as template text, reasoning kept
# after the last user turn, /nothink and an empty block without thinking.
GLM45 = r"""[gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}
<arg_key>{arg-key-1}</arg_key>
<arg_value>{arg-value-1}</arg_value>
<arg_key>{arg-key-2}</arg_key>
<arg_value>{arg-value-2}</arg_value>
...
</tool_call>{%- endif -%}
{%- macro visible_text(content) -%}
    {%- if content is string -%}
        {{- content }}
    {%- elif content is iterable and content is not mapping -%}
        {%- for item in content -%}
            {%- if item is mapping and item.type == 'text' -%}
                {{- item.text }}
            {%- elif item is string -%}
                {{- item }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content }}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user_index=-1) %}
{%- for m in messages %}
    {%- if m.role == 'user' %}
        {% set ns.last_user_index = loop.index0 -%}
    {%- endif %}
{%- endfor %}
{% for m in messages %}
{%- if m.role == 'user' -%}<|user|>
{%- set user_content = visible_text(m.content) -%}
{{ user_content }}
{%- if enable_thinking is defined and not enable_thinking -%}
{%- if not user_content.endswith("/nothink") -%}
{{- '/nothink' -}}
{%- endif -%}
{%- endif -%}
{%- elif m.role == 'assistant' -%}
<|assistant|>
{%- set reasoning_content = '' %}
{%- set content = visible_text(m.content) %}
{%- if m.reasoning_content is string %}
    {%- set reasoning_content = m.reasoning_content %}
{%- else %}
    {%- if '</think>' in content %}
        {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
        {%- set content = content.split('</think>')[-1].lstrip('\n') %}
    {%- endif %}
{%- endif %}
{%- if loop.index0 > ns.last_user_index and reasoning_content -%}
{{ '\n<think>' + reasoning_content.strip() +  '</think>'}}
{%- else -%}
{{ '\n<think></think>' }}
{%- endif -%}
{%- if content.strip() -%}
{{ '\n' + content.strip() }}
{%- endif -%}
{% if m.tool_calls %}
{% for tc in m.tool_calls %}
{%- if tc.function %}
    {%- set tc = tc.function %}
{%- endif %}
{{ '\n<tool_call>' + tc.name }}
{% set _args = tc.arguments %}
{% for k, v in _args.items() %}
<arg_key>{{ k }}</arg_key>
<arg_value>{{ v | tojson if v is not string else v }}</arg_value>
{% endfor %}
</tool_call>{% endfor %}
{% endif %}
{%- elif m.role == 'tool' -%}
{%- if m.content is string -%}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
    {{- '<|observation|>' }}
{%- endif %}
{{- '\n<tool_response>\n' }}
{{- m.content }}
{{- '\n</tool_response>' }}
{%- else -%}
<|observation|>{% for tr in m.content %}

<tool_response>
{{ tr.output if tr.output is defined else tr }}
</tool_response>{% endfor -%}
{% endif -%}
{%- elif m.role == 'system' -%}
<|system|>
{{ visible_text(m.content) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    <|assistant|>{{- '\n<think></think>' if (enable_thinking is defined and not enable_thinking) else '' -}}
{%- endif -%}"""

SYS_VARIANT = r"""{% for message in messages %}{% if message['role'] == 'system' %}{{ '<<SYS>>\n' + message['content'] + '\n<</SYS>>\n\n' }}{% elif message['role'] == 'user' %}{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ ' ' + message['content'] + ' ' + eos_token }}{% endif %}{% endfor %}"""

UNKNOWN = r"""{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\n' }}{% endfor %}"""

DS_BOS = "<｜begin▁of▁sentence｜>"

# (name, source or None for the GGUF's own, BOS text, expect refusal)
TEMPLATES = [
    ("smollm2 (GGUF)", None, "<|im_start|>", False),
    ("llama3", LLAMA3, "<|begin_of_text|>", False),
    ("llama3.1", LLAMA31, "<|begin_of_text|>", False),
    ("llama3.2", LLAMA32, "<|begin_of_text|>", False),
    ("qwen2", QWEN2, "<|endoftext|>", False),
    ("qwen2.5", QWEN25, "<|endoftext|>", False),
    ("qwen2.5 with tools", QWEN25_TOOLS, "<|endoftext|>", False),
    ("qwen3", QWEN3, "<|endoftext|>", False),
    ("llama3.1 with tools", LLAMA31_TOOLS, "<|begin_of_text|>", False),
    ("llama3.2 with tools", LLAMA32_TOOLS, "<|begin_of_text|>", False),
    ("mistral v0.2", MISTRAL, "<s>", False),
    ("mistral v0.1", MISTRAL01, "<s>", False),
    ("llama2", LLAMA2, "<s>", False),
    ("mistral v0.3", MISTRAL03, "<s>", False),
    ("gemma3", GEMMA3, "<bos>", False),
    ("gemma2", GEMMA2, "<bos>", False),
    ("harmony (gpt-oss)", HARMONY, "<|startoftext|>", False),
    ("harmony with tools (gpt-oss)", HARMONY_TOOLS, "<|startoftext|>", False),
    ("deepseek r1", DEEPSEEK_R1, DS_BOS, False),
    ("deepseek v3", DEEPSEEK_V3, DS_BOS, False),
    ("deepseek r1 distill", DEEPSEEK_R1_DISTILL, DS_BOS, False),
    ("deepseek v3.1", DEEPSEEK_V31, DS_BOS, False),
    ("deepseek user+assistant variant", DEEPSEEK_USER_ASSISTANT, DS_BOS, True),
    ("glm-4.5", GLM45, "[gMASK]", False),
    ("[INST] <<SYS>> variant", SYS_VARIANT, "<s>", True),
    ("unknown", UNKNOWN, "<s>", True),
]


TOOL_TEMPLATES = (QWEN25_TOOLS, QWEN3, LLAMA31_TOOLS, LLAMA32_TOOLS,
                  HARMONY_TOOLS)


def m(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = [
    [m("user", "What is the capital of France?")],
    [m("system", "You are terse."), m("user", "Hi")],
    [m("system", "Be kind.\n"), m("user", "Hello"),
     m("assistant", "Hi! How can I help?"), m("user", "Tell me a joke.")],
    [m("user", "  padded with spaces and newlines \n\n")],
    [m("user", "\u00a0\u3000non-ASCII whitespace\u2003 "), m("assistant", "\t"),
     m("user", "")],
    [m("user", "Quotes ' \" and braces {{ x }} {% y %} stay as text")],
    [m("user", "東京は日本の首都です。"), m("assistant", "はい。 "),
     m("user", "Ünïcödé?")],
    [m("assistant", "I start."), m("user", "Then I answer.")],
    [m("user", "first"), m("system", "a system message later on"),
     m("user", "second")],
    # Reasoning in the assistant's turns (Qwen3 keeps or drops it by where
    # the turn is; the others render it as text).
    [m("user", "2+2?"), m("assistant", "<think>\nadd\n</think>\n\n4"),
     m("user", "3+3?")],
    [m("system", "S"), m("user", "2+2?"),
     m("assistant", "\n<think>\n\nadd them\n\n</think>\n\n\n4\n")],
    [m("user", "q"), m("assistant", "no think block here")],
    [m("user", "q"), m("assistant", "a</think>b</think>\nc")],
    # An answer holding harmony's channel tags (gpt-oss's template refuses
    # it; the others render it as text).
    [m("user", "q"), m("assistant", "<|channel|>final<|message|>a")],
]
# Conversations only some templates take: harmony's developer role (the
# others have none, and render it in ways of their own or refuse it).
HARMONY_CONVERSATIONS = [
    [m("developer", "Answer in French."), m("user", "Hi")],
    [m("developer", ""), m("user", "Hi"), m("developer", "dropped")],
    # The template's reasoning_effort variable (the request's field).
    {"messages": [m("user", "Think hard.")], "reasoning_effort": "high"},
    {"messages": [m("user", "Quick.")], "reasoning_effort": "low"},
]
EXTRA_CONVERSATIONS = {
    # Qwen3's enable_thinking (chat_template_kwargs).
    "qwen3": [
        {"messages": [m("user", "2+2?")], "enable_thinking": False},
        {"messages": [m("user", "2+2?")], "enable_thinking": True},
        {"messages": [m("system", "S"), m("user", "q"),
                      m("assistant", "<think>\nx\n</think>\n\na"),
                      m("user", "again")], "enable_thinking": False},
    ],
    # DeepSeek V3.1's enable_thinking (chat_template_kwargs).
    "deepseek v3.1": [
        {"messages": [m("user", "2+2?")], "enable_thinking": True},
        {"messages": [m("user", "2+2?")], "enable_thinking": False},
        {"messages": [m("system", "S"), m("user", "q"),
                      m("assistant", "x</think>a"), m("user", "again")],
         "enable_thinking": True},
    ],
    # GLM-4.5's enable_thinking: /nothink and an empty block.
    "glm-4.5": [
        {"messages": [m("user", "2+2?")], "enable_thinking": False},
        {"messages": [m("user", "2+2? /nothink")], "enable_thinking": False},
        {"messages": [m("user", "2+2?")], "enable_thinking": True},
        {"messages": [m("system", "S"), m("user", "q"),
                      m("assistant", "<think>x</think>a"), m("user", "b"),
                      m("assistant", "\n<think>\ny\n</think>\n\nc ")],
         "enable_thinking": False},
    ],
    "harmony (gpt-oss)": HARMONY_CONVERSATIONS,
    "harmony with tools (gpt-oss)": HARMONY_CONVERSATIONS,
}


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Today's weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "Name, e.g. \"Paris\""},
        "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}
# No description; non-ASCII and escapes in the schema; numbers.
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "number", "minimum": -1.5, "title": "été\tß"},
        "b": {"type": "integer", "maximum": 100}}}}}
# Neither description nor parameters.
NOW_FN = {"type": "function", "function": {"name": "now"}}


def call(name, args, id_="call_1"):
    return {"id": id_, "type": "function",
            "function": {"name": name, "arguments": args}}


def with_tool_calls(content, *calls):
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


# (messages, tools); arguments as dicts, as transformers takes them.
TOOL_CONVERSATIONS = [
    ([m("user", "Weather in Paris?")], [WEATHER]),
    ([m("system", "You are terse."), m("user", "Add 2 and 3")],
     [WEATHER, ADD, NOW_FN]),
    ([m("user", "Weather in Paris and Oslo?"),
      with_tool_calls("", call("get_weather", {"city": "Paris"}),
                      call("get_weather", {"city": "Oslo", "unit": "c"},
                           "call_2")),
      {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
      {"role": "tool", "tool_call_id": "call_2", "content": "{\"t\": 4}"},
      m("assistant", "Paris 18, Oslo 4."), m("user", "Thanks")], [WEATHER]),
    ([m("user", "Add"),
      with_tool_calls("Sure, adding.", call("add", {"b": 2, "a": 1.25})),
      {"role": "tool", "content": "3.25"}], [ADD]),
    # A history with calls and results but no tools offered now.
    ([m("system", "S"), m("user", "u"),
      with_tool_calls("", call("now", {})),
      {"role": "tool", "content": "9:30"}, m("user", "ünï")], []),
    # Reasoning before a call, after the last query (kept by Qwen3), and
    # a tool result that reads as a query's <tool_response> block.
    ([m("user", "Weather?"),
      with_tool_calls("<think>\nneed the tool\n</think>\n\nChecking.",
                      call("get_weather", {"city": "Oslo"})),
      {"role": "tool", "content": "4 C"},
      m("user", "<tool_response>\nmore\n</tool_response>")], [WEATHER]),
]


# Schemas for harmony's TypeScript rendering: every branch of its
# render_typescript_type macro, defaults of each kind, nesting.
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the catalogue.\nReturns items.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "description": "Words to find"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "scores": {"type": "array", "items": {"type": "integer"},
                   "nullable": True},
        "flags": {"type": "array", "items": {"type": "boolean"}},
        "anything": {"type": "array"},
        "points": {"type": "array", "items": {
            "type": "object", "properties": {
                "x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["x"]}},
        "pairs": {"type": "array", "items": {
            "type": "object", "properties": {"a": {"type": "string"}}}},
        "union": {"type": "array", "items": {"type": ["object", "object"]}},
        "matrix": {"type": "array",
                   "items": {"type": "array", "items": {"type": "number"}}},
        "long": {"type": "array", "items": {"type": "object", "properties": {
            "a_long_property_name": {"type": "string"},
            "another_long_one": {"type": "boolean"}}}},
        "sort": {"type": "string", "enum": ["asc", "desc"], "default": "asc"},
        "limit": {"type": "integer", "default": 10},
        "ratio": {"type": "number", "default": 0.5},
        "exact": {"type": "boolean", "default": False},
        "note": {"type": "string", "nullable": True, "default": None},
        "when": {"type": ["string", "null"]},
        "single": {"type": ["integer"]},
        "id": {"oneOf": [{"type": "string", "description": "a name"},
                         {"type": "integer", "default": -1}],
               "default": "x"},
        "shape": {"oneOf": [{"type": "object"}, {"type": "string"}]},
        "filter": {"type": "object", "properties": {
            "field": {"type": "string"}, "value": {}}, "required": ["field"]},
        "opts": {"type": "object"},
        "unknown": {},
    }, "required": ["query", "sort"]}}}
NO_PROPERTIES = {"type": "function", "function": {
    "name": "ping", "description": "Ping.",
    "parameters": {"type": "object", "properties": {}}}}
EXTRA_TOOL_CONVERSATIONS = {
    "harmony with tools (gpt-oss)": [
        ([m("user", "Find red shoes")], [SEARCH, NO_PROPERTIES]),
        # The reasoning beside a call is dropped once an answer follows; a
        # result's text is written as a JSON string.
        ([m("system", "Be brief."), m("user", "Shoes?"),
          with_tool_calls("Let me look.",
                          call("search", {"query": "shoes", "sort": "asc"})),
          {"role": "tool", "tool_call_id": "call_1",
           "content": "{\"items\": [\"été\"]}\n\ttab \\ \"q\""},
          m("assistant", "One pair."), m("user", "More?")],
         [SEARCH]),
        # A result with no call before it: the template raises.
        ([m("user", "u"), {"role": "tool", "content": "x"}], [NO_PROPERTIES]),
    ],
}


def harmony_one_call_each(messages):
    """Messages with several calls as that many messages of one call each:
    what shardlm renders for them (gpt-oss's template writes only the
    first), so that jinja2 renders the reference."""
    out = []
    for msg in messages:
        for k, c in enumerate(msg.get("tool_calls", [])):
            out.append({**msg, "content": msg["content"] if k == 0 else "",
                        "tool_calls": [c]})
        if not msg.get("tool_calls"):
            out.append(msg)
    return out


def openai_messages(messages):
    """The messages as an OpenAI client sends them: arguments as JSON text."""
    out = []
    for msg in messages:
        msg = dict(msg)
        if "tool_calls" in msg:
            msg["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments":
                                   json.dumps(c["function"]["arguments"])}}
                for c in msg["tool_calls"]]
        out.append(msg)
    return out


def jinja_render(source, bos, messages, tools=None, **kwargs):
    import jinja2
    import jinja2.ext
    import jinja2.sandbox

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)

    # transformers' tojson (chat_template_utils.py), not jinja2's (which
    # sorts keys and escapes HTML).
    def tojson(x, ensure_ascii=False, indent=None, separators=None,
               sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    return env.from_string(source).render(
        messages=messages, tools=tools or None, bos_token=bos,
        eos_token="</s>", add_generation_prompt=True, **kwargs)


def run_tool(tool, args, conversations):
    p = subprocess.run([tool, *args, "--now", str(int(NOW.timestamp()))],
                       input="".join(json.dumps(c) + "\n" for c in conversations),
                       capture_output=True, text=True, timeout=60)
    return p.returncode, [json.loads(line) for line in p.stdout.splitlines()], \
        p.stderr.strip()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--gguf", required=True, help="SmolLM2's GGUF")
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args(argv)
    os.makedirs(a.workdir, exist_ok=True)
    import gguf
    smollm = gguf.GGUFReader(a.gguf).fields["tokenizer.chat_template"].contents()

    failures = 0
    for name, source, bos, refuse in TEMPLATES:
        if source is None:
            args, source = ["--model", a.gguf], smollm
        else:
            path = os.path.join(a.workdir, name.replace(" ", "_") + ".jinja")
            with open(path, "w", encoding="utf-8") as f:
                f.write(source)
            chatml = "<|im_start|>" in source
            args = ["--template", path, "--bos", bos] + \
                (["--chatml-vocab"] if chatml else [])
        conversations = CONVERSATIONS + EXTRA_CONVERSATIONS.get(name, [])
        rc, outs, err = run_tool(a.tool, args, conversations)
        if refuse:
            ok = rc == 3 and "not one shardlm renders" in err
            failures += not ok
            print(f"[{name}] {'refused' if ok else 'FAIL: not refused'}: {err}")
            continue
        if rc != 0 or len(outs) != len(conversations):
            print(f"[{name}] TOOL ERROR (exit {rc}): {err}")
            return 2
        same = 0
        for conv, out in zip(conversations, outs):
            try:
                if isinstance(conv, dict):  # With template variables.
                    kwargs = {k: v for k, v in conv.items() if k != "messages"}
                    want = jinja_render(source, bos, conv["messages"],
                                        **kwargs)
                else:
                    want = jinja_render(source, bos, conv)
            except Exception as e:  # raise_exception: we must refuse too.
                want = f"refused ({e})"
            got = out.get("prompt", f"refused ({out.get('error')})")
            if got == want or (got.startswith("refused") and
                               want.startswith("refused")):
                same += 1
                continue
            failures += 1
            print(f"[{name}] FAIL on {json.dumps(conv, ensure_ascii=False)}\n"
                  f"  jinja2: {want!r}\n  ours:   {got!r}")
        print(f"[{name}] {same} of {len(conversations)} conversations "
              f"identical ({err.removeprefix('chat_dump: ')})")
        # Tools: rendered exactly by the tool-capable template, refused by
        # every other.
        tool_conversations = TOOL_CONVERSATIONS + \
            EXTRA_TOOL_CONVERSATIONS.get(name, [])
        tool_inputs = [{"messages": openai_messages(msgs), "tools": tools}
                       for msgs, tools in tool_conversations]
        rc, outs, err = run_tool(a.tool, args, tool_inputs)
        if rc != 0 or len(outs) != len(tool_conversations):
            print(f"[{name}] TOOL ERROR on tools (exit {rc}): {err}")
            return 2
        tool_capable = any(source is t for t in TOOL_TEMPLATES)
        harmony = source is HARMONY_TOOLS
        same = 0
        for (msgs, tools), out in zip(tool_conversations, outs):
            if tool_capable:
                try:
                    want = jinja_render(
                        source, bos,
                        harmony_one_call_each(msgs) if harmony else msgs,
                        tools)
                    ok = out.get("prompt") == want
                except Exception as e:  # raise_exception: refused too.
                    want = f"refused ({e})"
                    ok = "error" in out
                    # Harmony's template fails on a tool without a
                    # description, which shardlm renders without its
                    # comment line (model/chat_harmony.cc).
                    if harmony and "has no attribute 'description'" in str(e):
                        ok = "prompt" in out
                        want = "rendered (jinja2 raises: no description)"
            else:
                want = "refused, naming tools, the tool role or tool_calls"
                e = out.get("error", "")
                ok = "needs a chat template that renders tools" in e and \
                    any(f in e for f in ("tools", "role 'tool'", "tool_calls"))
            same += ok
            if not ok:
                failures += 1
                print(f"[{name}] FAIL with tools on "
                      f"{json.dumps(msgs, ensure_ascii=False)}\n"
                      f"  want: {want!r}\n  ours: {out!r}")
        print(f"[{name}] tools: {same} of {len(tool_conversations)} "
              f"{'identical' if tool_capable else 'refused'}")
    print("PASSED" if failures == 0 else f"FAILED: {failures}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

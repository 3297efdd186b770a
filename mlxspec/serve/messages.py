"""The prompt of a request, checked: chat messages (roles, text parts, an assistant's tool calls,
a tool's answers) and completions' prompts (a string, token ids, or a batch of either)."""

from __future__ import annotations

import json
from typing import List

from ..errors import shown as _show
from ..prompts import check_text
from .errors import checked, invalid, unsupported

ROLES = ("system", "user", "assistant", "tool")  # what a chat template renders; "developer" is read as "system"


def chat_messages(messages) -> List[dict]:
    if messages is None:
        raise invalid("messages is required: a list of {\"role\", \"content\"} objects", "messages",
                      code="missing_required_parameter")
    if not isinstance(messages, list):
        raise invalid(f"messages must be a list of {{\"role\", \"content\"}} objects, got {_show(messages)}",
                      "messages")
    if not messages:
        raise invalid("messages is empty: give at least one message", "messages")
    out = []
    for i, m in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid(f"{param} must be an object with 'role' and 'content', got {_show(m)}", param)
        role = m.get("role")
        if role == "function" or m.get("function_call"):
            raise unsupported(f"{param}: function messages (OpenAI's deprecated function calling) are not "
                              "supported by this server; send tool messages", param)
        if role == "developer":
            role = "system"
        if role not in ROLES:
            raise invalid(f"{param}.role must be one of {', '.join(ROLES)} (or developer, read as system), "
                          f"got {_show(role)}", f"{param}.role")
        calls = m.get("tool_calls")
        if calls is not None and role != "assistant":
            raise invalid(f"{param}: only assistant messages carry tool_calls, this one is {role}",
                          f"{param}.tool_calls")
        message = {"role": role}
        if calls:
            message["tool_calls"] = tool_calls(calls, f"{param}.tool_calls")
            content = m.get("content")
            message["content"] = None if content is None else message_content(content, f"{param}.content",
                                                                                  assistant=True)
        else:
            content = m.get("content")
            if role == "assistant" and content is None and isinstance(m.get("refusal"), str):
                content = m["refusal"]  # an answer OpenAI's model refused: the refusal is what it said
            message["content"] = message_content(content, f"{param}.content", assistant=role == "assistant")
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str):
                raise invalid(f"{param}.tool_call_id must be the id of the call this message answers, got "
                              f"{_show(call_id)}", f"{param}.tool_call_id")
            message["tool_call_id"] = call_id
            if isinstance(m.get("name"), str):
                message["name"] = m["name"]
        out.append(message)
    return out


def tool_calls(calls, param: str) -> List[dict]:
    """An assistant message's tool_calls, with each call's `arguments` as an object: chat templates
    write them back with `tojson`, and OpenAI sends them as a JSON string."""
    if not isinstance(calls, list):
        raise invalid(f"{param} must be a list of tool calls, got {_show(calls)}", param)
    out = []
    for j, call in enumerate(calls):
        where = f"{param}[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid(f"{where} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                          f"\"arguments\"}}}}, got {_show(call)}", where)
        if call.get("type", "function") != "function":
            raise invalid(f"{where}.type must be \"function\", got {_show(call.get('type'))}", f"{where}.type")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as e:
                raise invalid(f"{where}.function.arguments must be JSON (an object as a string), got "
                              f"{_show(args)} ({e})", f"{where}.function.arguments") from None
        if not isinstance(args, dict):
            raise invalid(f"{where}.function.arguments must be a JSON object (as a string), got {_show(args)}",
                          f"{where}.function.arguments")
        out.append({"id": call.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def message_content(content, param: str, assistant: bool) -> str:
    """A string, or a list of {"type": "text", "text": ...} parts (joined with newlines); an
    assistant's {"type": "refusal", "refusal": ...} parts are its text too (OpenAI's history holds them)."""
    if isinstance(content, str):
        return checked(lambda text: check_text(text, param), content, param)
    if isinstance(content, list):
        kinds = ("text", "refusal") if assistant else ("text",)
        return "\n".join(_part_text(part, f"{param}[{j}]", kinds) for j, part in enumerate(content))
    raise invalid(f"{param} must be a string or a list of text parts, got {_show(content)}", param)


def _part_text(part, param: str, kinds: tuple) -> str:
    """A content part's text: the string under its type's key ("text", or an assistant's "refusal")."""
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    if not isinstance(part, dict) or kind not in kinds:
        raise invalid(f"{param} must be a text part {{\"type\": \"text\", \"text\": \"...\"}}; "
                      f"only text is supported, got {_show(kind)}", param)
    where = f"{param}.{kind}"
    if not isinstance(part.get(kind), str):
        raise invalid(f"{where} must be a string, got {_show(part.get(kind))}", where)
    return checked(lambda text: check_text(text, where), part[kind], where)


def completion_prompts(prompt) -> list:
    """OpenAI's four shapes: a string, a list of token ids, or a batch (a list) of either; each
    prompt of a batch gets its own choices, in order."""
    if prompt is None:
        raise invalid("prompt is required: a string or a list of token ids (or a list of those)", "prompt",
                      code="missing_required_parameter")
    if _is_ids(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return [_one_prompt(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
    return [_one_prompt(prompt, "prompt")]


def _one_prompt(prompt, param: str):
    if isinstance(prompt, str):
        if not prompt:
            raise invalid(f"{param} is empty: give a non-empty string", param)
        return checked(check_text, prompt, param)
    if _is_ids(prompt):
        return prompt
    raise invalid(f"{param} must be a non-empty string or list of token ids, got {_show(prompt)}", param)


def _is_ids(prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(t, int) and not isinstance(t, bool)
                                                             for t in prompt)

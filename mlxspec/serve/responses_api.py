"""OpenAI's Responses API (POST /v1/responses), served by the chat machinery.

A request is translated into a chat request (`to_chat`): `instructions` becomes the system
message, `input` items become messages (a string is one user message; `function_call` and
`function_call_output` items become the assistant's tool calls and the tool messages that
answer them), `tools` in the Responses' flat shape become chat tools, `text.format` becomes
`response_format`, `max_output_tokens` becomes `max_tokens`, `reasoning.effort` becomes
`reasoning_effort`. `previous_response_id` puts a stored response's conversation
(`response_store`) before the input. `include: ["message.output_text.logprobs"]` asks for
logprobs (with `top_logprobs` alternatives per token), as chat's `logprobs: true`.

The answer's output items and stream events are `responses_output.ResponseBuilder`'s.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Dict, List, Optional

from ..errors import shown
from .errors import APIError, invalid, unsupported
from .schema import check_top_logprobs

log = logging.getLogger("mlxspec.serve")

# Fields passed to the chat request as they are (OpenAI's and this server's own).
PASSED = ("model", "temperature", "top_p", "parallel_tool_calls", "stream", "seed", "top_k", "min_p", "stop",
          "speculative", "num_draft", "drafter", "tree", "lookup", "logit_bias", "presence_penalty",
          "frequency_penalty", "repetition_penalty", "repetition_context_size", "chat_template_kwargs",
          "stop_token_ids", "ignore_eos", "min_tokens")
LOGPROBS = "message.output_text.logprobs"  # what `include` names to have them (OpenAI's)
ROLES = ("user", "assistant", "system", "developer")  # an input message's (the chat path reads developer as system)


def wants_logprobs(body: dict) -> bool:
    """Whether the request's `include` asks for the output text's logprobs."""
    include = body.get("include")
    return isinstance(include, list) and LOGPROBS in include


def to_chat(body: dict, history: List[dict] = ()) -> tuple:
    """A Responses request body -> (the chat completions body that answers it, its conversation
    without the instructions: what a later request continues). `history`: the conversation of
    the response it continues (`previous_response_id`). 400s name the Responses' own fields."""
    if body.get("conversation") is not None:
        raise unsupported("conversation objects are not supported by this server: send previous_response_id, or "
                          "the whole conversation as input", "conversation")
    if body.get("background"):
        raise unsupported("background responses are not supported by this server: send the request and wait, or "
                          "stream it", "background")
    chat: Dict[str, Any] = {key: body[key] for key in PASSED if key in body}
    include = body.get("include")
    if include is not None and not (isinstance(include, list) and all(isinstance(x, str) for x in include)):
        raise invalid(f"include must be a list of strings like [\"{LOGPROBS}\"], got {shown(include)}", "include")
    top = body.get("top_logprobs")
    if wants_logprobs(body):
        chat["logprobs"] = True
        if top is not None:
            chat["top_logprobs"] = top
    elif top is not None:
        check_top_logprobs(top)
        # OpenAI's API answers such a request without logprobs too (an empty list): say why here
        log.info("top_logprobs=%s without include [\"%s\"]: the answer has no logprobs, as OpenAI's", top, LOGPROBS)
    messages: List[dict] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid(f"instructions must be a string, got {shown(instructions)}", "instructions")
        messages.append({"role": "system", "content": instructions})
    conversation = list(history) + _input_messages(body.get("input"))
    chat["messages"] = messages + conversation
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise invalid(f"reasoning must be an object like {{\"effort\": \"low\"}}, got {shown(reasoning)}",
                          "reasoning")
        if reasoning.get("effort") is not None:
            chat["reasoning_effort"] = reasoning["effort"]
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if body.get("text") is not None and not isinstance(body.get("text"), dict):
        raise invalid(f"text must be an object like {{\"format\": {{\"type\": \"text\"}}}}, got {shown(body['text'])}",
                      "text")
    if fmt is not None:
        chat["response_format"] = _format(fmt)
    return chat, conversation


def param_of(chat_param: Optional[str]) -> Optional[str]:
    """A chat field's name in the Responses' terms, for errors."""
    if chat_param is None:
        return None
    if chat_param.startswith("messages"):
        return "input"
    return {"max_tokens": "max_output_tokens", "response_format": "text.format",
            "reasoning_effort": "reasoning.effort"}.get(chat_param, chat_param)


def _input_messages(given) -> List[dict]:
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise invalid(f"input must be a string or a non-empty list of items (messages, function_call, "
                      f"function_call_output), got {shown(given)}", "input")
    out: List[dict] = []
    for i, item in enumerate(given):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(f"{where} must be an item object, got {shown(item)}", where)
        kind = item.get("type", "message")
        if kind == "message":
            if item.get("role") not in ROLES:
                raise invalid(f"{where}.role must be one of {', '.join(ROLES)}, got {shown(item.get('role'))}",
                              f"{where}.role")
            out.append({"role": item.get("role"), "content": _content(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
                out[-1]["tool_calls"].append(call)  # the calls of one turn, in one message
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                output = _content(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        elif kind == "reasoning":
            continue  # a thinking model's earlier reasoning: chat templates drop it too
        else:
            raise unsupported(f"{where}: items of type {shown(kind)} are not supported by this server (only "
                              f"message, function_call, function_call_output and reasoning)", where)
    return out


def _content(content, field: str):
    """A message's content or a call's output (`field` names it): a string, or text parts
    (input_text, output_text, text)."""
    if isinstance(content, str) or content is None:
        return content
    if not isinstance(content, list):
        raise invalid(f"{field} must be a string or a list of text parts, got {shown(content)}", field)
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text") \
                or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise invalid(f"{field}[{j}] must be a text part {{\"type\": \"input_text\", \"text\": ...}}; "
                          f"only text is supported, got {shown(kind)}", f"{field}[{j}]")
        texts.append(part["text"])
    return "\n".join(texts)


def _tools(tools) -> list:
    """Function tools, and those of `namespace` tools (a group of functions), as chat tools. Tools
    OpenAI itself would run (web_search, file_search, code_interpreter...) and free-form `custom`
    tools are left out, and logged: the model is not shown them, so it cannot call them, and
    the agent that sent them still works with the rest (Codex sends web_search)."""
    if not isinstance(tools, list):
        raise invalid(f"tools must be a list of function tools, got {shown(tools)}", "tools")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise invalid(f"tools[{i}] must be a tool object, got {shown(tool)}", f"tools[{i}]")
        if tool.get("type") == "namespace" and not isinstance(tool.get("tools"), list):
            raise invalid(f"tools[{i}].tools must be a list of function tools, got {shown(tool.get('tools'))}",
                          f"tools[{i}]")
    out = [{"type": "function", "function": {key: fn[key] for key in ("name", "description", "parameters", "strict")
                                             if key in fn}}
           for _, fn, _ in _members(tools) if fn.get("type") == "function"]
    skipped = left_out(tools)
    if skipped:
        log.info("tools the model cannot call here were left out of the prompt: %s", ", ".join(skipped))
    return out


def _members(tools):
    """(the namespace's name or None, tool, where it is: "tools[2]", "tools[1].tools[0]") for each
    tool object of a request, a namespace's members in its place; anything that is not an object
    is passed over (`_tools` refuses it)."""
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        if isinstance(tool, dict) and tool.get("type") == "namespace":
            members = tool.get("tools") if isinstance(tool.get("tools"), list) else []
            yield from ((tool.get("name"), fn, f"tools[{i}].tools[{j}]") for j, fn in enumerate(members)
                        if isinstance(fn, dict))
        elif isinstance(tool, dict):
            yield None, tool, f"tools[{i}]"


def left_out(tools) -> List[str]:
    """The tools of a request the model is not shown (`_tools`), by name (or type)."""
    return [str(fn.get("name") or fn.get("type")) for _, fn, _ in _members(tools) if fn.get("type") != "function"]


def namespaces(tools) -> Dict[str, str]:
    """Function name -> the namespace tool it came in (its calls say so)."""
    return {fn.get("name"): name for name, fn, _ in _members(tools) if name is not None}


def tool_places(tools) -> List[str]:
    """Where each chat tool (`_tools`, in its order) was in the request's `tools` (`renamed`)."""
    return [place for _, fn, place in _members(tools) if fn.get("type") == "function"]


def _tool_choice(choice):
    """The Responses' shapes (names at the top) -> chat's."""
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        return {"type": "function", "function": {"name": choice.get("name")}}
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools" and "allowed_tools" not in choice:
        tools = choice.get("tools")
        return {"type": "allowed_tools", "allowed_tools": {
            "mode": choice.get("mode"),
            "tools": [_tool_choice(t) for t in tools] if isinstance(tools, list) else tools}}
    return choice


def _format(fmt) -> dict:
    """text.format -> response_format (the Responses put json_schema's fields at the top)."""
    if not isinstance(fmt, dict):
        raise invalid(f"text.format must be an object like {{\"type\": \"json_schema\", \"name\": ..., "
                      f"\"schema\": {{...}}}}, got {shown(fmt)}", "text.format")
    if fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise invalid(f"text.format of type json_schema needs a schema (a JSON schema object), got "
                          f"{shown(fmt.get('schema'))}", "text.format")
        inner = {key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt}
        return {"type": "json_schema", "json_schema": inner}
    return fmt


def renamed(error: APIError, places: List[str] = ()) -> APIError:
    """A chat request's error in the Responses' terms (`messages[2]` -> `input`...); a chat tool's
    `tools[i].function.` is where that function was in the request (`places`, `tool_places`): the
    Responses' tools are flat, and tools the model is not shown take places too."""
    param = param_of(error.param)
    tool = re.match(r"tools\[(\d+)\]\.function\.", error.message) if param == "tools" else None
    if tool and int(tool[1]) < len(places):
        return error.named(param, {tool[0]: places[int(tool[1])] + "."})
    return error if param == error.param else error.named(param)

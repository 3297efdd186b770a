"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens), served by the chat path,
for clients and agents that speak it (Claude Code with a custom base URL, the `anthropic` SDK).

A request is translated into a chat request (`to_chat`): `system` becomes the system message,
`text` blocks (and a user's plain-text `document` blocks, under their titles) become content, an
assistant's `tool_use` blocks its tool calls and a user's
`tool_result` blocks the tool messages that answer them, `tools` (`input_schema`) become
chat tools, `tool_choice` auto/any/tool/none becomes auto/required/named/none (its
`disable_parallel_tool_use`, parallel_tool_calls false), `stop_sequences` becomes `stop`.
`MessageBuilder` shapes what the model wrote into content blocks (`thinking`, `text`,
`tool_use`), whole or as Anthropic's stream events. Errors take Anthropic's shape
(`{"type": "error", "error": {"type", "message"}}`) and its field names (`renamed`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Dict, List, Optional

from starlette.responses import JSONResponse

from ..errors import shown
from ..prompts import text_of
from ..tools import arguments_object
from .errors import APIError, invalid, unsupported
from .responses import figures, sse

# Fields passed to the chat request as they are (OpenAI-style extensions of this server's included).
PASSED = ("model", "max_tokens", "temperature", "top_p", "top_k", "stream", "seed", "min_p", "speculative",
          "num_draft", "drafter", "tree", "lookup", "chat_template_kwargs")
# Anthropic's error types by status; any other 4xx is invalid_request_error, as Anthropic's own are, and 5xx api_error.
ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
               413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def to_chat(body: dict) -> dict:
    """A Messages request body -> the chat completions body that answers it."""
    _check_temperature(body.get("temperature"))
    if body.get("max_tokens") is None:  # Anthropic's API has no default: a client that leaves it out is told
        raise invalid("max_tokens is required: the most tokens the answer may have (an integer >= 1)", "max_tokens",
                      code="missing_required_parameter")
    chat: Dict[str, Any] = {key: body[key] for key in PASSED if key in body}
    messages: List[dict] = []
    system = body.get("system")
    if system is not None:
        messages.append({"role": "system", "content": _text(system, "system")})
    given = body.get("messages")
    if not isinstance(given, list) or not given:
        raise invalid(f"messages must be a non-empty list of {{\"role\", \"content\"}} objects, got {shown(given)}",
                      "messages")
    for i, message in enumerate(given):
        messages += _message(message, f"messages[{i}]")
    chat["messages"] = messages
    if messages[-1]["role"] == "assistant":  # a prefill: the answer continues it, as Anthropic's API does
        chat["continue_final_message"] = True
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        choice = _tool_choice(body["tool_choice"])
        if choice == "none":
            chat.pop("tools", None)
        else:
            if choice != "auto" and not chat.get("tools"):  # (said here: the chat path's words are OpenAI's)
                raise invalid(f"tool_choice {shown(body['tool_choice'])} needs tools to call; send tools (or no "
                              f"tool_choice)", "tool_choice")
            chat["tool_choice"] = choice
            one = body["tool_choice"].get("disable_parallel_tool_use", False)
            if not isinstance(one, bool):
                raise invalid(f"tool_choice.disable_parallel_tool_use must be true or false, got {shown(one)}",
                              "tool_choice")
            if one:  # at most one tool_use block
                chat["parallel_tool_calls"] = False
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":  # as the template names it
        chat["chat_template_kwargs"] = dict(chat.get("chat_template_kwargs") or {}, enable_thinking=False)
    return chat


def _check_temperature(value) -> None:
    """Anthropic's range is 0..1 (the chat path's own, OpenAI's 0..2, would let 1.5 through)."""
    if value is None:
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and 0 <= value <= 1):  # (NaN fails the comparison)
        raise invalid(f"temperature must be a number in 0..1 (0 = greedy), got {shown(value)}", "temperature")


def _text(content, where: str) -> str:
    """A string, or text blocks joined."""
    text = text_of(content)
    if text is None:
        raise invalid(f"{where} must be a string or a list of text blocks, got {shown(content)}", where)
    return text


def _document(block: dict, where: str) -> str:
    """A plain-text document block (its source of type "text", or "content" of text blocks) as the
    text the model reads, under its title when it has one. A PDF or a URL would need a reader."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "text" and isinstance(source.get("data"), str):
        text = source["data"]
    elif kind == "content":
        text = _text(source.get("content"), f"{where}.source.content")
    else:
        raise unsupported(f"{where}: documents whose source is of type {shown(kind)} are not supported by this "
                          f"server: its models read text (a source of type \"text\" with its data, or \"content\" "
                          f"with text blocks)", where)
    title = block.get("title")
    if title is not None and not isinstance(title, str):
        raise invalid(f"{where}.title must be a string, got {shown(title)}", f"{where}.title")
    return f"{title}\n\n{text}" if title else text


def _message(message, where: str) -> List[dict]:
    """One Messages message -> chat messages (a user's tool results become tool messages first)."""
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
        raise invalid(f"{where} must be {{\"role\": \"user\" or \"assistant\", \"content\": ...}}, got "
                      f"{shown(message)}", where)
    role, content = message["role"], message.get("content")
    if role == "system":  # not in Anthropic's API, but Claude Code sends them between turns
        return [{"role": "system", "content": _text(content, f"{where}.content")}]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}.content must be a string or a list of content blocks, got {shown(content)}",
                      f"{where}.content")
    texts, calls, results = [], [], []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            given = block.get("input")
            if given is not None and not isinstance(given, dict):
                raise invalid(f"{at}.input must be an object (the tool's arguments), got {shown(given)}", f"{at}.input")
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block.get("name"), "arguments": given or {}}})
        elif kind == "tool_result" and role == "user":
            result = block.get("content", "")
            text = result if isinstance(result, str) else _text(result, f"{at}.content")
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                            "content": ("Error: " + text) if block.get("is_error") else text})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # earlier reasoning: chat templates drop it too
        elif kind == "document" and role == "user":
            texts.append(_document(block, at))
        else:
            raise unsupported(f"{at}: {role} blocks of type {shown(kind)} are not supported by this server (text, "
                              f"an assistant's tool_use and thinking, a user's tool_result and plain-text "
                              f"document)", at)
    out = list(results)
    if role == "assistant":
        reply = {"role": "assistant", "content": "\n".join(texts) or None}
        out.append(dict(reply, tool_calls=calls) if calls else reply)
    elif texts or not results:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _tools(tools) -> list:
    if not isinstance(tools, list):
        raise invalid(f"tools must be a list of tools with name and input_schema, got {shown(tools)}", "tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise unsupported(f"tools[{i}]: only client tools (name, description, input_schema) are supported by "
                              f"this server, got type {shown(kind)}", f"tools[{i}]")
        fn = {"name": tool.get("name"), "parameters": tool.get("input_schema") or {"type": "object"}}
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice):
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise invalid(f"tool_choice must be {{\"type\": \"auto\"}}, {{\"type\": \"any\"}}, {{\"type\": \"none\"}} or "
                  f"{{\"type\": \"tool\", \"name\": ...}}, got {shown(choice)}", "tool_choice")


def renamed(error: APIError) -> APIError:
    """A chat request's error in Anthropic's terms: `stop` is `stop_sequences`, a tool's
    `function.name` and `function.parameters` are its `name` and `input_schema`, and tool_choice
    names a tool, not a function."""
    if error.param == "stop":
        return error.named("stop_sequences")
    if error.param == "tools":
        return error.named("tools", {".function.parameters": ".input_schema", ".function.": "."})
    if error.param == "tool_choice":
        return error.named("tool_choice", {"names function": "names tool"})
    return error


def error_body(error: APIError) -> dict:
    """An error in Anthropic's shape."""
    kind = ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    message = error.message
    if error.param is not None and error.param not in message:
        message = f"{error.param}: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error_body(error), status_code=error.status, headers=error.headers)


def stop_reason(finish: Optional[str], calls, stopped_by=None) -> str:
    """Anthropic's stop_reason; `stopped_by`: the engine's (a stop string, a stop token id, None)."""
    if finish == "length":
        return "max_tokens"
    if calls:
        return "tool_use"
    return "stop_sequence" if isinstance(stopped_by, str) else "end_turn"


class MessageBuilder:
    """One answer's content blocks, whole or as Anthropic's stream events."""

    def __init__(self, model: str):
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.model = model
        self.blocks = 0  # blocks started so far
        self.open: Optional[str] = None  # the type of the block being streamed
        self.called = False

    def tokens(self, events: list) -> None:
        """The engine's events behind the text fed next: Anthropic's Messages carry no logprobs."""

    def whole(self, reasoning: str, text: str, calls: list, finish: str, usage: dict, stats, stopped_by=None) -> dict:
        content = []
        if reasoning:
            content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        if text or not calls:
            content.append({"type": "text", "text": text})
        content += [self._tool_use(c) for c in calls]
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop_reason(finish, calls, stopped_by), "stop_sequence": _sequence(stopped_by, calls),
                "usage": _usage(usage),
                "mlxspec": figures(stats)}

    # -- streamed ------------------------------------------------------------------------------
    def start(self, prompt_tokens: int, cached_tokens: int = 0) -> List[bytes]:
        message = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": _usage({"prompt_tokens": prompt_tokens, "completion_tokens": 0,
                                    "prompt_tokens_details": {"cached_tokens": cached_tokens}})}
        return _sse([("message_start", {"type": "message_start", "message": message})])

    def feed(self, reasoning: str, text: str, calls: list) -> List[bytes]:
        """Events for new reasoning, text and whole tool calls (each opens its block as needed)."""
        out: List[tuple] = []
        if reasoning:
            out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
        if text:
            out += self._open("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": text}))
        for call in calls:
            block = self._tool_use(call)
            out += self._open("tool_use", dict(block, input={}))
            out.append(self._delta({"type": "input_json_delta", "partial_json": json.dumps(block["input"])}))
            out += self._close()
            self.called = True
        return _sse(out)

    def finish(self, finish: str, usage: dict, stats, stopped_by=None) -> List[bytes]:
        out = [] if self.blocks else self._open("text", {"type": "text", "text": ""})
        out += self._close()
        delta = {"type": "message_delta", "delta": {"stop_reason": stop_reason(finish, self.called, stopped_by),
                                                    "stop_sequence": _sequence(stopped_by, self.called)},
                 "usage": _usage(usage), "mlxspec": figures(stats)}
        return _sse(out + [("message_delta", delta), ("message_stop", {"type": "message_stop"})])

    @staticmethod
    def error(e: APIError) -> bytes:
        return sse(error_body(e), "error")

    def _open(self, kind: str, block: dict) -> List[tuple]:
        if self.open == kind:  # (a tool_use block is closed at once: the next call opens its own)
            return []
        out = self._close()
        self.open = kind
        self.blocks += 1
        return out + [("content_block_start", {"type": "content_block_start", "index": self.blocks - 1,
                                               "content_block": block})]

    def _delta(self, delta: dict) -> tuple:
        return "content_block_delta", {"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}

    def _close(self) -> List[tuple]:
        if self.open is None:
            return []
        self.open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.blocks - 1})]

    @staticmethod
    def _tool_use(call: dict) -> dict:
        return {"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24], "name": call["function"]["name"],
                "input": arguments_object(call["function"]["arguments"])}


def _sequence(stopped_by, calls) -> Optional[str]:
    """The stop sequence that ended the answer, as Anthropic reports it."""
    return stopped_by if isinstance(stopped_by, str) and not calls else None


def _usage(usage: dict) -> dict:
    """OpenAI's usage in Anthropic's terms: its input_tokens leave out the cache reads (the whole
    prompt is input + cache_creation + cache_read input tokens)."""
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return {"input_tokens": usage["prompt_tokens"] - cached, "output_tokens": usage["completion_tokens"],
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def _sse(events: List[tuple]) -> List[bytes]:
    return [sse(body, name) for name, body in events]

"""Tool calling: the tools a chat template renders, and the calls a model writes back.

A model trained for tools writes each call between two markers its chat template names
(Qwen's `<tool_call>` ... `</tool_call>`, Mistral's `[TOOL_CALLS]` to the end...). mlx-lm
knows these formats and their parsers (`mlx_lm.tool_parsers`) and infers a tokenizer's from
its chat template when it loads one; `tool_format` asks it the same for tokenizers it did not
load (a GGUF's). `ToolCallSplitter` splits generated text into plain text and the calls'
bodies as it streams, holding back what could still become a marker, and `parse_calls` turns
the bodies into OpenAI `tool_calls`. Nothing here changes what the model generates.
"""

from __future__ import annotations

import importlib
import re
import json
import uuid
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from .errors import InvalidArgumentError, shown
from .text import partial_marker


NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names


@dataclass(frozen=True)
class ToolFormat:
    """How a model writes a tool call: between `start` and `end` (empty: to the end of the text)."""

    start: str
    end: str
    parse: Callable[[str, Optional[list]], Any]  # a call's body -> {"name", "arguments"} (or a list of them)
    name: str = ""  # mlx-lm's name for the format ("json_tools", "mistral", ...)


def tool_format(tokenizer) -> Optional[ToolFormat]:
    """The tool-call format of `tokenizer`'s chat template, or None when it shows none."""
    from . import harmony

    if tokenizer is not None and harmony.is_harmony(tokenizer):  # gpt-oss: calls are messages to functions.*
        return harmony.tool_format()
    if getattr(tokenizer, "has_tool_calling", False) is True:  # mlx-lm loaded it and found one
        parse = tokenizer.tool_parser
        name = getattr(parse, "__module__", "").rpartition("mlx_lm.tool_parsers.")[2]
        return ToolFormat(tokenizer.tool_call_start, tokenizer.tool_call_end or "", parse, name)
    if tokenizer is None or not isinstance(getattr(tokenizer, "chat_template", None), str):
        return None
    try:  # mlx-lm's own inference (private, so a newer mlx-lm may move it: then no tools, not a crash)
        from mlx_lm.tokenizer_utils import _infer_tool_parser

        name = _infer_tool_parser(tokenizer)
        if name is None:
            return None
        module = importlib.import_module(f"mlx_lm.tool_parsers.{name}")
        return ToolFormat(module.tool_call_start, module.tool_call_end or "", module.parse_tool_call, name)
    except Exception:
        return None


def check_tools(tools) -> Optional[List[dict]]:
    """OpenAI's `tools`: a list of {"type": "function", "function": {"name", "description"?,
    "parameters"?}}. Returns it (None or [] as None); InvalidArgumentError naming what is wrong."""
    if tools is None:
        return None
    if not isinstance(tools, (list, tuple)):
        raise InvalidArgumentError(f"tools must be a list of {{\"type\": \"function\", \"function\": {{...}}}} "
                                   f"objects, got {shown(tools)}")
    names = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise InvalidArgumentError(f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                                       f"\"parameters\": {{...}}}}}} (only function tools exist), got {shown(tool)}")
        fn = tool["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise InvalidArgumentError(f"{where}.function.name must be 1-64 letters, digits, _ or -, got {shown(name)}")
        if name in names:
            raise InvalidArgumentError(f"{where}.function.name {name!r} is given twice; tool names must differ")
        names.add(name)
        for key, kind in (("description", str), ("parameters", dict)):
            if fn.get(key) is not None and not isinstance(fn[key], kind):
                raise InvalidArgumentError(f"{where}.function.{key} must be a "
                                           f"{'string' if kind is str else 'JSON Schema object'}, got {shown(fn[key])}")
    return list(tools) or None


# Formats whose calls a grammar can force (`call_grammar`): a JSON object {"name", "arguments"}
# between two text markers (Qwen2.5's and Hermes' <tool_call> ... </tool_call>), and gpt-oss's
# harmony (a message to functions.NAME after the model's analysis).
FORCEABLE = ("json_tools", "harmony")


def check_tool_choice(choice, tools: Optional[List[dict]]):
    """OpenAI's `tool_choice`: None or "auto" (the model decides), "none" (the tools are not
    shown), "required" (at least one call), {"type": "function", "function": {"name": ...}}
    (one call of that function) or {"type": "allowed_tools", "allowed_tools": {"mode": "auto" or
    "required", "tools": [{"type": "function", "function": {"name": ...}}, ...]}} (as "auto" or
    "required" over those tools alone: `narrowed`). Returns it, checked against `tools` (checked
    already)."""
    if choice is None or choice in ("auto", "none"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        named = _allowed_entries(choice)
    elif choice == "required":
        named = []
    elif _function_name(choice) is not None:
        named = [("tool_choice", choice)]
    else:
        raise InvalidArgumentError(f"tool_choice must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", "
                                   f"\"function\": {{\"name\": ...}}}}, got {shown(choice)}")
    if not tools:
        raise InvalidArgumentError(f"tool_choice {shown(choice)} needs tools to call; send tools (or no tool_choice)")
    known = [t["function"]["name"] for t in tools]
    for where, entry in named:  # each names one function, which must be among the tools
        name = _function_name(entry)
        if name is None:
            raise InvalidArgumentError(f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\": "
                                       f"...}}}} (only function tools exist), got {shown(entry)}")
        if name not in known:
            raise InvalidArgumentError(f"{where} names function {name!r}, which is not among the tools; allowed: "
                                       f"{', '.join(known)}")
    return choice


def _function_name(choice) -> Optional[str]:
    """The name in {"type": "function", "function": {"name": ...}}; None for any other shape."""
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        return name if isinstance(name, str) else None
    return None


def _allowed_entries(choice: dict) -> List[Tuple[str, object]]:
    """An allowed_tools choice's entries, each with where it is (`check_tool_choice` checks them)."""
    shape = ('{"type": "allowed_tools", "allowed_tools": {"mode": "auto" or "required", "tools": [{"type": '
             '"function", "function": {"name": ...}}, ...]}}')
    allowed = choice.get("allowed_tools")
    if not isinstance(allowed, dict) or allowed.get("mode") not in ("auto", "required") \
            or not isinstance(allowed.get("tools"), list) or not allowed["tools"]:
        raise InvalidArgumentError(f"tool_choice of type allowed_tools must be {shape}, got {shown(choice)}")
    return [(f"tool_choice.allowed_tools.tools[{i}]", tool) for i, tool in enumerate(allowed["tools"])]


def narrowed(tools: Optional[List[dict]], choice):
    """`(tools, choice)` with an allowed_tools choice made plain: the model is shown the allowed
    tools alone, under "auto" or "required" (whose grammar then calls those alone); other choices
    as they are."""
    if not (isinstance(choice, dict) and choice.get("type") == "allowed_tools"):
        return tools, choice
    names = {t["function"]["name"] for t in choice["allowed_tools"]["tools"]}  # (checked by check_tool_choice)
    return [t for t in tools if t["function"]["name"] in names], choice["allowed_tools"]["mode"]


def forced_tools(tools: List[dict], choice) -> List[dict]:
    """The tools whose calls a forced `choice` has the grammar write: all of them for "required",
    else the one it names."""
    return [t for t in tools if choice == "required" or t["function"]["name"] == choice["function"]["name"]]


def call_grammar(fmt: Optional[ToolFormat], tools: List[dict], choice, json_options: dict,
                 tokenizer=None, one: bool = False) -> dict:
    """A `response_format` (Lark, see `mlxspec.grammar`) that makes the model write tool calls in
    its own format: one or more of any tool for "required" (`one`, or harmony, whose turn ends
    with its call: one), one of the named function otherwise. Each call's arguments follow its
    tool's `parameters` schema. `tokenizer`: the model's (harmony's grammar names its special tokens)."""
    if fmt is None or fmt.name not in FORCEABLE:
        raise InvalidArgumentError(
            f"tool_choice {shown(choice)} needs a tool-call format mlxspec can force with a grammar "
            f"(json_tools: Qwen2.5's and Hermes' <tool_call> JSON; harmony: gpt-oss's); this model's is "
            f"{(fmt.name or 'unnamed') if fmt else 'unknown'}: send tool_choice \"auto\"")
    wanted = [t["function"] for t in forced_tools(tools, choice)]
    if fmt.name == "harmony":  # one call per turn, after any analysis (the grammar reads that too)
        from . import harmony

        constrain = tokenizer is not None and harmony.knows(tokenizer, [harmony.CONSTRAIN])
        return {"type": "lark", "lark": harmony.call_lark(wanted, json_options, constrain)}
    more = " (ws? call)*" if choice == "required" and not one else ""
    return {"type": "lark", "lark": f"start: call{more}\n" + _call_rules(fmt, wanted, json_options)}


def calls_or_answer(fmt: Optional[ToolFormat], tools: List[dict], answer: dict, json_options: dict,
                    one: bool = False) -> dict:
    """tool_choice "auto" with a JSON `response_format` (checked): the answer is one or more tool
    calls (`one`: one) in the model's format, or JSON that follows the format, as OpenAI's API lets
    the model choose (an agent with tools and an output type sends both)."""
    why = None
    if fmt is None or fmt.name != "json_tools":
        why = (f"this model's tool-call format is {(fmt.name or 'unnamed') if fmt else 'unknown'}, and only "
               f"json_tools' (Qwen2.5's and Hermes' <tool_call> JSON) can share a grammar with an answer")
    elif answer["type"] not in ("json_object", "json_schema"):
        why = f"a {answer['type']} format cannot share a grammar with tool calls (json_object and json_schema can)"
    if why:
        raise InvalidArgumentError(f"response_format with tools (tool_choice \"auto\"): {why}; send one or the "
                                   f"other, or tool_choice \"required\" or a named function (the calls, then)")
    # (a checked json_schema format's schema is an object: check_response_format refuses true and false)
    schema = answer["json_schema"]["schema"] if answer["type"] == "json_schema" else {"type": "object"}
    more = "" if one else " (ws? call)*"
    return {"type": "lark", "lark": f"start: answer | call{more}\n"
                                    f"answer: %json {json.dumps({**schema, 'x-guidance': json_options})}\n"
                                    + _call_rules(fmt, [t["function"] for t in tools], json_options)}


def _call_rules(fmt: ToolFormat, wanted: List[dict], json_options: dict) -> str:
    """Lark rules for `call`: one call of a `wanted` function between the format's markers, its
    arguments following the function's `parameters` schema."""
    schema = {"anyOf": [{"type": "object", "properties": {"name": {"const": f["name"]},
                                                          "arguments": f.get("parameters") or {"type": "object"}},
                         "required": ["name", "arguments"], "additionalProperties": False} for f in wanted],
              "x-guidance": json_options}
    return (f"call: {json.dumps(fmt.start)} ws? body ws? {json.dumps(fmt.end)}\n"
            f"ws: /[ \\t\\n]{{1,4}}/\n"
            f"body: %json {json.dumps(schema)}\n")


class ToolCallSplitter:
    """Streamed text -> ("text", str) and ("call", body) pieces, in order.

    Text that could still grow into the start marker is held back until it cannot; a call's
    body is handed out once its end marker has come (or, with an empty end marker or a cut
    generation, at `finish`)."""

    def __init__(self, fmt: ToolFormat):
        self.fmt = fmt
        self._buf = ""
        self._in_call = False

    def feed(self, text: str) -> List[Tuple[str, str]]:
        self._buf += text
        out = []
        while True:
            if self._in_call:
                end = self._buf.find(self.fmt.end) if self.fmt.end else -1
                if end < 0:
                    return out
                out.append(("call", self._buf[:end]))
                self._buf = self._buf[end + len(self.fmt.end):]
                self._in_call = False
            else:
                start = self._buf.find(self.fmt.start)
                if start < 0:
                    keep = partial_marker(self._buf, self.fmt.start)
                    if len(self._buf) > keep:
                        out.append(("text", self._buf[: len(self._buf) - keep]))
                        self._buf = self._buf[len(self._buf) - keep:]
                    return out
                if start:
                    out.append(("text", self._buf[:start]))
                self._buf = self._buf[start + len(self.fmt.start):]
                self._in_call = True

    def finish(self) -> List[Tuple[str, str]]:
        """What is left at the end: held-back text, or an open call ("open_call": its end never came)."""
        rest, self._buf = self._buf, ""
        if self._in_call:
            self._in_call = False
            return [("call" if not self.fmt.end else "open_call", rest)]
        return [("text", rest)] if rest else []


def parse_calls(body: str, fmt: ToolFormat, tools: Optional[list]) -> Optional[List[dict]]:
    """One call's body -> OpenAI tool calls ({"id", "type": "function", "function": {"name",
    "arguments": a JSON string}}), or None when the body is not a call the format can read."""
    try:
        parsed = fmt.parse(body, tools)
    except Exception:  # the parsers raise what their formats' readers raise (json, ast, regex misses)
        return None
    calls = []
    for call in parsed if isinstance(parsed, list) else [parsed]:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        args = call.get("arguments", {})
        if not isinstance(args, str):  # OpenAI sends arguments as a JSON string
            args = json.dumps(args, ensure_ascii=False)
        calls.append({"id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call["name"], "arguments": args}})
    return calls or None


def arguments_object(args) -> dict:
    """A tool call's arguments as an object: OpenAI's JSON string read (an object given as such
    kept), {} where they are not a JSON object (for the APIs that send objects)."""
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except ValueError:
            return {}
    return args if isinstance(args, dict) else {}


class ToolCallReader:
    """Generated text -> (plain text, OpenAI tool calls), as it streams.

    A call its format cannot read, or one cut off by `max_tokens`, stays in the text as the
    model wrote it, markers included: nothing generated is dropped, except, with `one`
    (parallel_tool_calls false), the calls after the first (a format whose calls share one body,
    as Mistral's list does, can hold several; vLLM drops them too). Whitespace that only
    separates calls (or trails them) is not text."""

    def __init__(self, fmt: ToolFormat, tools: Optional[list], one: bool = False):
        self.fmt, self.tools, self.one = fmt, tools, one
        self.calls = 0  # calls read so far
        self._splitter = ToolCallSplitter(fmt)
        self._space = ""  # whitespace held until text follows it (or the end, when no call came)
        self._after_call = False
        self._gap = ""  # whitespace around calls: text that resumes after them starts with it
        self._wrote = False  # some text came out already

    def feed(self, text: str) -> Tuple[str, List[dict]]:
        return self._read(self._splitter.feed(text))

    def finish(self) -> Tuple[str, List[dict]]:
        text, calls = self._read(self._splitter.finish())
        if not self.calls:
            text, self._space = text + self._space, ""
        return text, calls

    def _read(self, pieces) -> Tuple[str, List[dict]]:
        out, calls = [], []
        for kind, body in pieces:
            if kind != "text":
                parsed = parse_calls(body, self.fmt, self.tools) if kind == "call" else None
                if parsed is not None:
                    calls.extend(parsed[: 1 - self.calls - len(calls)] if self.one else parsed)
                    # the whitespace before it separates the text around it, if text comes after
                    self._gap = self._gap or self._space
                    self._space, self._after_call = "", True
                    continue
                body = self.fmt.start + body + (self.fmt.end if kind == "call" else "")
            if self._after_call:  # the whitespace a model writes after a call is not text either
                kept = body.lstrip()
                if not kept:
                    self._gap = self._gap or body
                    continue
                gap = self._gap or body[: len(body) - len(kept)]
                body = (gap if self._wrote else "") + kept  # one separator between texts a call parted
                self._after_call, self._gap = False, ""
            body = self._space + body
            kept = body.rstrip()  # trailing whitespace waits: it may only come before a call
            self._space = body[len(kept):]
            if kept:
                out.append(kept)
                self._wrote = True
        self.calls += len(calls)
        return "".join(out), calls

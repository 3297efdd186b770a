"""OpenAI's harmony format (gpt-oss): the assistant writes messages on channels, not plain text.

Generation starts after the template's `<|start|>assistant`. Each message is a header, then
`<|message|>`, then its content, ended by `<|end|>` (another message follows, after
`<|start|>assistant`), `<|return|>` (the answer is done) or `<|call|>` (a tool call is done;
both end generation). The header names the channel and, for a tool call, the recipient:

    <|channel|>analysis<|message|>The user wants the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>
    <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>

`HarmonySplitter` streams that into reasoning (the analysis channel) and answer text (the final
channel and commentary the user is meant to read, OpenAI's preambles), as
`reasoning.ReasoningSplitter` does for `<think>` blocks. A message to `functions.NAME` goes into the
answer as `CALL_START NAME <|message|> ARGUMENTS <|call|>`, which `tool_format()` reads back as an
OpenAI tool call (`tools.ToolCallReader`), so the server handles harmony's calls as any format's.
mlx-lm knows neither (its chat template renders the prompt; the output stays raw text there).
"""

from __future__ import annotations

import json
import re
from typing import List, Optional, Tuple

from .text import partial_marker

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
END, RETURN, CALL = "<|end|>", "<|return|>", "<|call|>"
CONSTRAIN = "<|constrain|>"  # before a call's argument format (json); gpt-oss's vocabulary has it
TOKENS = (START, CHANNEL, MESSAGE, END, RETURN, CALL)  # a harmony vocabulary has them all
ENDS = (END, RETURN, CALL)  # what ends a message's content
# The markers `reasoning.thinking_markers` gives a harmony tokenizer: what opens the reasoning
# channel and what closes a message. `HarmonySplitter` reads the whole format, not just these.
MARKERS = (CHANNEL + "analysis" + MESSAGE, END)
FINAL = CHANNEL + "final" + MESSAGE  # where the answer starts (a response_format applies after it)
CALL_START = CHANNEL + "commentary to=functions."  # how the splitter writes a call into the answer
RECIPIENT = re.compile(r"to=(\S+?)(?=\s|<\||$)")


def is_harmony(tokenizer) -> bool:
    """Whether the tokenizer's vocabulary holds harmony's tokens (gpt-oss's o200k_harmony does)."""
    return knows(tokenizer, TOKENS)


def knows(tokenizer, tokens) -> bool:
    """Whether each of `tokens` is a token of `tokenizer`'s vocabulary."""
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    if not callable(convert):
        return False
    try:  # a few lookups, not the whole vocabulary (200k entries) built into a dict
        ids = [convert(t) for t in tokens]
    except Exception:  # a tokenizer that cannot look tokens up is not harmony's
        return False
    unknown = getattr(tokenizer, "unk_token_id", None)
    return all(isinstance(i, int) and i != unknown for i in ids)


class HarmonySplitter:
    """Streamed harmony text -> (reasoning, answer) pieces, with `ReasoningSplitter`'s interface.

    Text that could still grow into a marker is held back until it cannot. Messages of one kind
    are joined by a blank line (two analysis messages, a preamble and the final answer).
    `merged`: the reasoning is answer text too (a server told to leave it in the content), the
    headers still left out and the calls still read."""

    def __init__(self, merged: bool = False):
        self.merged = merged
        self._buf = ""
        self._header: Optional[str] = ""  # "" while a header is read (it waits in _buf); None in content
        self._kind = "answer"  # where the current message's content goes: reasoning, answer or call
        self._wrote = {"reasoning": False, "answer": False}

    def feed(self, text: str) -> Tuple[str, str]:
        self._buf += text
        out = {"reasoning": [], "answer": []}
        while self._buf:
            if self._header is not None:  # reading a header, up to <|message|>
                if not _header_like(self._buf):  # plain text where a header should be: an answer
                    self._header, self._kind = None, "answer"
                    continue
                at = self._buf.find(MESSAGE)
                if at < 0:
                    break
                self._open(self._buf[:at], out)
                self._buf = self._buf[at + len(MESSAGE):]
                continue
            at, marker = _first(self._buf, ENDS + (START,))
            if at < 0:  # content: all of it but what could still become a marker
                keep = max(partial_marker(self._buf, m) for m in ENDS + (START,))
                self._put(self._buf[: len(self._buf) - keep], out)
                self._buf = self._buf[len(self._buf) - keep:]
                break
            self._put(self._buf[:at], out)
            self._close(out)
            self._buf = self._buf[at + len(marker):]  # a header follows (its <|start|> is read with it)
            self._header = ""
        return "".join(out["reasoning"]), "".join(out["answer"])

    def finish(self) -> Tuple[str, str]:
        """What is left at the end: a message cut by max_tokens, or a call ended by <|call|>
        (a stop token, so not in the text), is closed; a header that never reached its
        content is dropped (it says nothing)."""
        out = {"reasoning": [], "answer": []}
        if self._header is None:
            self._put(self._buf, out)
            self._close(out)
        self._buf, self._header = "", ""
        return "".join(out["reasoning"]), "".join(out["answer"])

    # -- messages --------------------------------------------------------------------------------
    def _open(self, header: str, out: dict) -> None:
        self._header = None
        channel = header.split(CHANNEL, 1)[1] if CHANNEL in header else ""
        channel = re.split(r"\s|<\|", channel.strip(), maxsplit=1)[0] if channel.strip() else ""
        to = RECIPIENT.search(header)
        if to and to.group(1).startswith("functions."):
            self._kind = "call"
            self._sep("answer", out)
            out["answer"].append(CALL_START + to.group(1)[len("functions."):] + MESSAGE)
        else:  # a built-in tool's message (browser, python) is not the user's to read either
            self._kind = "reasoning" if (to or channel == "analysis") and not self.merged else "answer"
            self._sep(self._kind, out)

    def _sep(self, kind: str, out: dict) -> None:
        if self._wrote[kind]:
            out[kind].append("\n\n")

    def _put(self, text: str, out: dict) -> None:
        if not text:
            return
        kind = "answer" if self._kind == "call" else self._kind
        out[kind].append(text)
        self._wrote[kind] = True

    def _close(self, out: dict) -> None:
        if self._header is None and self._kind == "call":
            out["answer"].append(CALL)
            self._wrote["answer"] = True
        self._kind = "answer"


def _header_like(text: str) -> bool:
    """Whether `text` starts (or could still start) as a header: a harmony token, or the role."""
    return any(text.startswith(p) or p.startswith(text) for p in ("<|", "assistant"))


def _first(text: str, markers) -> Tuple[int, str]:
    """(where, which) of the first of `markers` in `text`, or (-1, "")."""
    found = [(text.find(m), m) for m in markers if m in text]
    return min(found) if found else (-1, "")


def parse_call(body: str, tools: Optional[List[dict]] = None) -> dict:
    """A call the splitter wrote (`NAME<|message|>ARGUMENTS`) -> {"name", "arguments"}; raises
    where the arguments are not JSON (the call then stays text)."""
    header, _, args = body.partition(MESSAGE)
    name = re.split(r"\s|<\|", header.strip(), maxsplit=1)[0]  # a raw header may go on: " <|constrain|>json"
    return {"name": name, "arguments": json.loads(args)}


def call_lark(functions: List[dict], json_options: dict, constrain_token: bool = True) -> str:
    """A Lark grammar (llguidance's, where `<|name|>` is that special token) for one call of one
    of `functions` (OpenAI's function objects): an analysis message first if the model writes one,
    free (it reasons as it would), then a call's header and its arguments, which follow the
    function's `parameters`; the model then ends on <|call|>. `constrain_token`: <|constrain|> is
    a token of the vocabulary (gpt-oss's), else it is written as text."""
    constrain = CONSTRAIN if constrain_token else json.dumps(CONSTRAIN)
    calls = [f"call{i}: {json.dumps(f['name'] + ' ')} {constrain} \"json\" <|message|> %json "
             + json.dumps(dict(f.get("parameters") or {"type": "object"}, **{"x-guidance": json_options}))
             for i, f in enumerate(functions)]
    return "\n".join([
        'start: analysis? <|channel|> "commentary to=functions." call',
        'analysis: <|channel|> "analysis" <|message|> TEXT <|end|> <|start|> "assistant"',
        "TEXT: /(?s:.*)/",  # special tokens are no text: <|end|> ends it
        "call: " + " | ".join(f"call{i}" for i in range(len(functions))),
        *calls]) + "\n"


def tool_format():
    """harmony's calls as `tools.ToolFormat` reads them (imported late: tools imports this module)."""
    from .tools import ToolFormat

    return ToolFormat(CALL_START, CALL, parse_call, "harmony")

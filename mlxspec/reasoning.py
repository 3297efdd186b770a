"""Reasoning: the text a thinking model writes between its think markers (Qwen3's and DeepSeek-R1's
`<think>` ... `</think>`; gpt-oss's analysis channel, `harmony`), apart from its answer.

The markers are mlx-lm's, inferred from the vocabulary when it wraps a tokenizer
(`TokenizerWrapper.think_start` / `think_end`). Some chat templates open the block themselves at
the end of the prompt (the model then starts inside it), which `starts_inside` reads from the
rendered prompt, as mlx-lm's server does. Nothing here changes what the model generates.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from . import harmony
from .errors import InvalidArgumentError
from .prompts import render_chat
from .text import partial_marker

# OpenAI's reasoning_effort values; a chat template reads the variable of that name (gpt-oss's does)
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def thinking_markers(tokenizer) -> Optional[Tuple[str, str]]:
    """(start, end) of the tokenizer's thinking block, or None when it has none (harmony's
    analysis channel for gpt-oss: `harmony.MARKERS`, which `make_splitter` reads as the format)."""
    if tokenizer is not None and harmony.is_harmony(tokenizer):
        return harmony.MARKERS
    if tokenizer is None or getattr(tokenizer, "has_thinking", False) is not True:
        return None
    start, end = getattr(tokenizer, "think_start", None), getattr(tokenizer, "think_end", None)
    return (start, end) if isinstance(start, str) and isinstance(end, str) and start and end else None


def make_splitter(markers: Tuple[str, str], inside: bool = False, merged: bool = False):
    """The splitter for these markers: harmony's channels (`harmony.HarmonySplitter`; `merged`:
    its reasoning kept in the answer, its headers not) or a block's."""
    if markers == harmony.MARKERS:
        return harmony.HarmonySplitter(merged)
    return ReasoningSplitter(markers, inside)


def split_whole(splitter, text: str) -> Tuple[str, str]:
    """(reasoning, answer) of a whole text through a fresh `splitter` (`make_splitter`), held-back ends included."""
    (reasoning, answer), (r, a) = splitter.feed(text), splitter.finish()
    return reasoning + r, answer + a


def starts_inside(prompt_text: str, markers: Tuple[str, str]) -> bool:
    """Whether generation starts inside a thinking block the prompt opened and did not close."""
    return prompt_text.rfind(markers[0]) > prompt_text.rfind(markers[1])


def chat_starts_inside(messages: list, tokenizer, markers: Tuple[str, str], tools: Optional[list] = None,
                       template_kwargs: Optional[dict] = None, continue_final: bool = False) -> bool:
    """`starts_inside` for chat messages, as their template renders them (`prompts.render_chat`);
    False where the template refuses them (the request that sends them is told why)."""
    try:
        text = render_chat(messages, tokenizer, tools, template_kwargs, continue_final)
    except InvalidArgumentError:
        return False
    return starts_inside(text, markers)


class ReasoningSplitter:
    """Streamed text -> (reasoning, answer) pieces. Text that could still grow into a marker is
    held back until it cannot; the markers themselves are in neither. The answer after a block
    starts at its first non-blank character (models put a blank line after `</think>`)."""

    def __init__(self, markers: Tuple[str, str], inside: bool = False):
        self.start, self.end = markers
        self.inside = inside
        self._buf = ""
        self._after_block = False

    def feed(self, text: str) -> Tuple[str, str]:
        self._buf += text
        reasoning, answer = [], []
        while self._buf:
            marker = self.end if self.inside else self.start
            at = self._buf.find(marker)
            if at < 0:
                keep = partial_marker(self._buf, marker)
                piece, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep:]
                self._out(piece, reasoning, answer)
                break
            self._out(self._buf[:at], reasoning, answer)
            self._buf = self._buf[at + len(marker):]
            self._after_block = self.inside
            self.inside = not self.inside
        return "".join(reasoning), "".join(answer)

    def finish(self) -> Tuple[str, str]:
        """What is left at the end (a block cut by max_tokens is reasoning)."""
        rest, self._buf = self._buf, ""
        reasoning, answer = [], []
        self._out(rest, reasoning, answer)
        return "".join(reasoning), "".join(answer)

    def _out(self, piece: str, reasoning: list, answer: list) -> None:
        if self.inside:
            reasoning.append(piece)
            return
        if self._after_block:
            piece = piece.lstrip()
            if not piece:
                return
            self._after_block = False
        answer.append(piece)


def thinking_end(tokenizer, ids) -> Optional[List[int]]:
    """The tokens that close the thinking block the chat template opened at the end of the
    prompt `ids` (a grammar applies after them), or None where generation does not start inside
    one (the grammar applies from the first token: a model that would open a block itself
    answers in the grammar instead)."""
    markers = thinking_markers(tokenizer)
    if markers == harmony.MARKERS:  # gpt-oss: the answer is the final channel's message
        return tokenizer.encode(harmony.FINAL, add_special_tokens=False)
    if markers is None or not starts_inside(tokenizer.decode(ids[-64:]), markers):
        return None
    return tokenizer.encode(markers[1], add_special_tokens=False)

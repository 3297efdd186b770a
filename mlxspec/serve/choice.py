"""One choice's answer as the engine's events come: a thinking model's reasoning split off, tool
calls read back, logprobs handed out in step with the text, the prompt first when echoed; and
best_of's pick among a prompt's choices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ..prompts import text_of
from ..reasoning import ReasoningSplitter, make_splitter
from ..tools import ToolCallReader
from . import schema
from .responses import LogprobStream, Shapes, joined, prompt_logprobs, sse

if TYPE_CHECKING:
    from .app import ServerState


def tool_reader(fmt, req: schema.GenerationRequest) -> Optional[ToolCallReader]:
    """Reads the model's tool calls back when the request showed it tools and its format `fmt` is
    known (a template that renders tools in a format mlx-lm does not know: the calls stay text)."""
    return ToolCallReader(fmt, req.tools, one=req.one_call) if fmt is not None and req.tools else None


class AnswerReader:
    """An answer's events -> (reasoning, answer text, tool calls): a thinking model's reasoning
    split off first, then the calls read from the answer. It counts the reasoning's tokens
    (OpenAI's reasoning_tokens): those whose text came out as reasoning, where a token whose text
    came out later (held back: part of a word or a marker, a marker itself) counts with the text
    that let it out."""

    def __init__(self, splitter: Optional[ReasoningSplitter], reader: Optional[ToolCallReader]):
        self.splitter, self.reader = splitter, reader
        self.reasoning_tokens = 0
        self._held = 0  # tokens whose text the splitter has not let out yet

    def read(self, events=(), last: bool = False) -> tuple:
        """(reasoning, answer text, tool calls) of new events (`last`: and what either held back to the end)."""
        if self.splitter is None:
            reasoning, text = "", "".join(ev.text for ev in events)
        else:  # token by token, to count them
            pieces = [self._count(self.splitter.feed(ev.text), 0 if _stop_token(ev) else 1) for ev in events]
            if last:
                pieces.append(self._count(self.splitter.finish(), 0))
            reasoning, text = "".join(r for r, _ in pieces), "".join(a for _, a in pieces)
        if self.reader is None:
            return reasoning, text, []
        text, calls = self.reader.feed(text)
        if last:
            tail, more = self.reader.finish()
            text, calls = text + tail, calls + more
        return reasoning, text, calls

    def _count(self, piece: tuple, tokens: int) -> tuple:
        """The splitter's (reasoning, answer) after `tokens` more tokens: the held ones count with what came out."""
        self._held += tokens
        if piece[0]:
            self.reasoning_tokens += self._held
        if piece[0] or piece[1]:
            self._held = 0
        return piece


def _stop_token(ev) -> bool:
    """An event whose token ended the answer and wrote no text (the model's EOS, a stop token id):
    never a reasoning token, though an answer cut off in its thinking lets held text out after it."""
    return ev.finish_reason == "stop" and not isinstance(ev.stop_reason, str)


class Choice:
    """One choice's answer as its events come: a thinking model's reasoning split off, tool calls
    read, logprobs handed out in step with the text, the prompt first when echoed."""

    def __init__(self, index: int, prompt, req: schema.GenerationRequest, state: ServerState, shapes: Shapes,
                 thinking: Optional[tuple]):
        self.index, self.shapes, self.state = index, shapes, state
        splitter = make_splitter(*thinking, merged=state.merged) if thinking is not None else None
        self.answer = AnswerReader(splitter, tool_reader(state.tool_format, req))
        self.echo = echoed(prompt, state) if req.echo else ""
        self.drop = req.score_only  # the prompt was only scored: the token generated with it is not shown
        shown = req.logprobs and not req.ranking_logprobs
        # OpenAI's text_offset counts from the prompt's start, echoed or not (chat's logprobs have none)
        offset = len(self.echo or echoed(prompt, state)) if shown and not shapes.chat else 0
        self.logprobs = LogprobStream(shapes.chat, state.token_bytes, offset) if shown else None
        self.usage = req.include_usage
        self.prompt_lp: Optional[dict] = None
        self.events: list = []
        self.finish: Optional[str] = None
        self.stop_reason = None  # the stop string or stop token that ended it (vLLM's)
        self.stats = None
        self.started = False
        self.called = 0  # tool calls streamed so far

    def add(self, events: list) -> None:
        """A whole answer's events, batch by batch."""
        self._note(events)
        if not self.drop:
            self.events.extend(events)

    @property
    def score(self) -> float:
        """best_of's ranking: the answer's log-probability per token (OpenAI's)."""
        return sum(ev.logprob for ev in self.events) / max(1, len(self.events))

    def whole(self) -> dict:
        reasoning, text, calls = self.answer.read(self.events, last=True)
        lp = self.logprobs.whole(self.events) if self.logprobs is not None else None
        return self.shapes.choice(self.index, self.echo + text, openai_finish(self.finish, calls), calls,
                                  joined(self.prompt_lp, lp), reasoning, self.stop_reason)

    def stream(self, events: list):
        """The SSE chunks of a streamed answer's events: first the role (chat) or the echoed
        prompt, then reasoning, text and tool calls, and with its last event the finish chunk
        with the choice's figures."""
        self._note(events)
        if not self.started:
            self.started = True
            if self.shapes.chat:
                yield sse(self.shapes.chunk(first=True, include_usage=self.usage, index=self.index))
            if self.echo or self.prompt_lp:
                yield sse(self.shapes.chunk(self.echo, logprobs=self.prompt_lp, include_usage=self.usage,
                                            index=self.index))
        if not self.drop:
            yield from self._deltas(*self.answer.read(events), events)
        if self.finish is not None:
            yield from self._deltas(*self.answer.read(last=True))  # what was held back
            yield sse(self.shapes.chunk(finish_reason=openai_finish(self.finish, self.called), stats=self.stats,
                                        include_usage=self.usage, index=self.index, stop_reason=self.stop_reason))

    def _note(self, events: list) -> None:
        if self.prompt_lp is None and events[0].prompt_logprobs is not None:
            self.prompt_lp = prompt_logprobs(events[0].prompt_logprobs, self.state.token_bytes)
        if events[-1].finish_reason:
            self.finish, self.stats = ("length" if self.drop else events[-1].finish_reason), events[-1].stats
            self.stop_reason = None if self.drop else events[-1].stop_reason

    def _deltas(self, reasoning: str, text: str, calls: list, events=()):
        lp = self.logprobs.feed(events) if self.logprobs is not None and events else None
        if reasoning or text or lp:
            yield sse(self.shapes.chunk(text, include_usage=self.usage, logprobs=lp, reasoning=reasoning,
                                        index=self.index))
        if calls:
            yield sse(self.shapes.chunk(tool_calls=indexed(calls, self.called), include_usage=self.usage,
                                        index=self.index))
            self.called += len(calls)


def echoed(prompt, state: ServerState) -> str:
    """The prompt's text, as echo shows it: as sent, or its token ids decoded; for chat messages
    (vLLM's), the last one's content when it is the assistant's (a prefill the answer continues)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        last = prompt[-1]
        return (text_of(last.get("content")) or "") if last.get("role") == "assistant" else ""
    tokenizer = getattr(state.engine, "tokenizer", None)
    return tokenizer.decode(prompt) if tokenizer is not None else ""


def best(choices: list, req: schema.GenerationRequest) -> list:
    """The whole answers: each prompt's n best of its best_of by log-probability per token, best
    first, indexed in OpenAI's order (all of them, as generated, without best_of)."""
    if req.per_prompt == req.n:
        return [c.whole() for c in choices]
    out = []
    for first in range(0, len(choices), req.per_prompt):
        group = sorted(choices[first:first + req.per_prompt], key=lambda c: -c.score)[:req.n]
        for c in group:
            c.index = len(out)
            out.append(c.whole())
    return out


def openai_finish(reason: Optional[str], calls) -> Optional[str]:
    """OpenAI's "tool_calls" when the model stopped after calling tools (a cut answer stays "length")."""
    return "tool_calls" if calls and reason == "stop" else reason


def indexed(calls: list, start: int) -> list:
    """Stream deltas' calls carry their index among the answer's calls."""
    return [dict(call, index=start + i) for i, call in enumerate(calls)]

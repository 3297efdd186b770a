"""OpenAI response shapes: completions, stream chunks, `usage`, and the extra `mlxspec` figures."""

from __future__ import annotations

import json
from collections import deque
import time
import uuid
from typing import Callable, Optional

from ..stats import GenerationStats


def usage(stats: GenerationStats) -> dict:
    """OpenAI `usage`; `cached_tokens` is the part of the prompt the engine's caches already held."""
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.tokens,
            "total_tokens": stats.prompt_tokens + stats.tokens,
            "prompt_tokens_details": {"cached_tokens": stats.prompt_tokens - stats.prefilled_tokens}}


def figures(stats: GenerationStats) -> dict:
    """The `mlxspec` object: how speculation went for this request."""
    return {"drafter": stats.drafter, "acceptance_rate": stats.acceptance_rate,
            "tokens_per_target_pass": stats.tokens_per_target_pass, "tokens_per_second": stats.tokens_per_second,
            "drafted": stats.drafted, "accepted": stats.accepted, "target_passes": stats.rounds,
            "tree_rounds": stats.tree_rounds, "lookup_rounds": stats.lookup_rounds,
            "prompt_tokens_per_second": stats.prompt_tokens_per_second, "prefilled_tokens": stats.prefilled_tokens,
            "prompt_seconds": stats.prompt_seconds, "seconds": stats.seconds,
            "first_token_seconds": stats.first_token_seconds}


class Shapes:
    """Builds every body of one request's answer (same id, `created` and `model` throughout)."""

    def __init__(self, kind: str, model: str):
        self.chat = kind == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = model

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def completion(self, text: str, finish_reason: str, stats: GenerationStats,
                   tool_calls: Optional[list] = None, logprobs: Optional[dict] = None, reasoning: str = "") -> dict:
        """The whole answer of a request without `stream` (`content` null when only tools were called;
        a thinking model's reasoning in `reasoning`, mlx-lm's key)."""
        if self.chat:
            message = {"role": "assistant", "content": text or (None if tool_calls else "")}
            if reasoning:
                message["reasoning"] = reasoning
            if tool_calls:
                message["tool_calls"] = tool_calls
            choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}
            body = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
            body = self._head("text_completion")
        body.update(choices=[choice], usage=usage(stats), mlxspec=figures(stats))
        return body

    def chunk(self, text: Optional[str] = None, *, first: bool = False, finish_reason: Optional[str] = None,
              stats: Optional[GenerationStats] = None, include_usage: bool = False,
              tool_calls: Optional[list] = None, logprobs: Optional[dict] = None, reasoning: str = "") -> dict:
        """A stream chunk: the role (first), new reasoning or text or tool calls (each whole, with
        its `index` among the answer's calls), or the finish reason with the mlxspec figures."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {}
            if reasoning:
                delta["reasoning"] = reasoning
            if text:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = tool_calls
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            body = self._head("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
            body = self._head("text_completion")
        body["choices"] = [choice]
        if include_usage:
            body["usage"] = None  # OpenAI: null on every chunk but the usage one
        if stats is not None:
            body["mlxspec"] = figures(stats)
        return body

    def usage_chunk(self, stats: GenerationStats) -> dict:
        """The extra last chunk of `stream_options.include_usage`: no choices, the usage (and figures)."""
        body = self._head("chat.completion.chunk" if self.chat else "text_completion")
        body.update(choices=[], usage=usage(stats), mlxspec=figures(stats))
        return body


class LogprobStream:
    """OpenAI's `logprobs` of an answer's tokens, handed out as far as its text has gone.

    A token whose text is still held back (a possible stop string, part of a character) waits,
    and tokens past the answer's end (a stop string, the end-of-text token) never go out, so
    the tokens spell the text (as generated: tool-call markup included). `bytes` are each
    token's own, also when they are part of a character."""

    def __init__(self, chat: bool, token_bytes: Callable[[int], bytes]):
        self.chat, self.token_bytes = chat, token_bytes
        self._waiting: deque = deque()
        self._text = bytearray()  # the answer's text so far
        self._at = 0  # byte offset of the next waiting token
        self._skew: Optional[int] = None  # 1: a SentencePiece decoder dropped the text's first space

    def whole(self, events) -> dict:
        """The logprobs of a whole answer's events."""
        return self.feed(events) or self._shape([])

    def feed(self, events) -> Optional[dict]:
        """The logprobs of `events` (and earlier ones) whose text is out now; None if none is."""
        self._waiting.extend(events)
        self._text += "".join(ev.text for ev in events).encode()
        ready = []
        while self._waiting and self._text:
            raw = self.token_bytes(self._waiting[0].token)
            if self._skew is None:
                self._skew = int(raw.startswith(b" ") and not self._text.startswith(b" "))
            if self._at - self._skew >= len(self._text):
                break
            ready.append((self._waiting.popleft(), raw, max(self._at - self._skew, 0)))
            self._at += len(raw)
        return self._shape(ready) if ready else None

    def _shape(self, ready) -> dict:
        if self.chat:
            def entry(raw: bytes, lp: float) -> dict:
                return {"token": raw.decode("utf-8", "replace"), "logprob": lp, "bytes": list(raw)}

            return {"content": [dict(entry(raw, ev.logprob), top_logprobs=[entry(self.token_bytes(t), lp)
                                                                             for t, lp in ev.top_logprobs])
                                for ev, raw, _ in ready], "refusal": None}
        top = []
        for ev, _, _ in ready:
            best: dict = {}
            for t, lp in ev.top_logprobs:  # best first: tokens that print alike keep the best one's
                best.setdefault(_legacy_name(self.token_bytes(t)), lp)
            top.append(best)
        return {"tokens": [_legacy_name(raw) for _, raw, _ in ready],
                "token_logprobs": [ev.logprob for ev, _, _ in ready], "top_logprobs": top,
                "text_offset": [len(bytes(self._text[:start]).decode("utf-8", "ignore")) for _, _, start in ready]}


def _legacy_name(raw: bytes) -> str:
    """A token as the legacy completions API names it: its text, or `bytes:\\xNN...` for part of a character."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def sse(body) -> bytes:
    """One server-sent event carrying a JSON body (or the closing `[DONE]`)."""
    data = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


DONE = sse("[DONE]")

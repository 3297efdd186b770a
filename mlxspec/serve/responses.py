"""OpenAI response shapes: completions, stream chunks, `usage`, and the extra `mlxspec` figures."""

from __future__ import annotations

import json
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
                   tool_calls: Optional[list] = None, logprobs: Optional[dict] = None) -> dict:
        """The whole answer of a request without `stream` (`content` null when only tools were called)."""
        if self.chat:
            message = {"role": "assistant", "content": text or (None if tool_calls else "")}
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
              tool_calls: Optional[list] = None, logprobs: Optional[dict] = None) -> dict:
        """A stream chunk: the role (first), new text or tool calls (each whole, with its `index`
        among the answer's calls), or the finish reason with the mlxspec figures."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {}
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


def logprobs_of(chat: bool, events, token_text: Callable[[int], str], offset: int = 0) -> dict:
    """OpenAI's `logprobs` of these events' tokens: chat's {"content": [{"token", "logprob",
    "bytes", "top_logprobs"}]}, or the legacy completions' {"tokens", "token_logprobs",
    "top_logprobs", "text_offset"} (offsets from `offset`, the characters before these tokens)."""
    if chat:
        def entry(token, lp):
            text = token_text(token)
            return {"token": text, "logprob": lp, "bytes": None if "\ufffd" in text else list(text.encode())}

        return {"content": [dict(entry(ev.token, ev.logprob), top_logprobs=[entry(t, lp) for t, lp in ev.top_logprobs])
                            for ev in events], "refusal": None}
    tokens = [token_text(ev.token) for ev in events]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [ev.logprob for ev in events],
            "top_logprobs": [{token_text(t): lp for t, lp in ev.top_logprobs} for ev in events],
            "text_offset": offsets}


def sse(body) -> bytes:
    """One server-sent event carrying a JSON body (or the closing `[DONE]`)."""
    data = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


DONE = sse("[DONE]")

"""OpenAI response shapes: completions, stream chunks, `usage`, and the extra `mlxspec` figures."""

from __future__ import annotations

import codecs
import dataclasses
import json
from collections import deque
import time
import uuid
from typing import Callable, List, Optional

from ..stats import GenerationStats


# What adds up over a request's generations (OpenAI's n, a completions batch).
SUMMED = ("prompt_tokens", "prefilled_tokens", "prompt_seconds", "prompt_timed_tokens", "tokens", "seconds",
          "rounds", "drafted", "accepted", "wait_seconds", "tree_rounds", "lookup_rounds", "lookup_drafted",
          "lookup_accepted", "forced_rounds", "forced_drafted", "forced_accepted")


def combined(runs: List[GenerationStats]) -> GenerationStats:
    """A request's generations as one: counts and times summed, the rest (drafter, time to the
    first token) the first's."""
    if len(runs) == 1:
        return runs[0]
    total = dataclasses.replace(runs[0])
    for name in SUMMED:
        setattr(total, name, sum(getattr(s, name) for s in runs))
    return total


def prompt_only(stats: GenerationStats) -> GenerationStats:
    """A scored prompt's figures (echo with max_tokens 0): the token generated with its pass is not
    returned, so no generation is reported either (tokens, passes, drafts, times: 0)."""
    return dataclasses.replace(stats, tokens=0, seconds=0.0, first_token_seconds=0.0, rounds=0, drafted=0,
                               accepted=0, wait_seconds=0.0, tree_rounds=0, lookup_rounds=0, lookup_drafted=0,
                               lookup_accepted=0, forced_rounds=0, forced_drafted=0, forced_accepted=0,
                               prediction_accepted=0, prediction_rejected=0)


def usage(runs: List[GenerationStats], n: int, generated: bool, reasoning: int) -> dict:
    """OpenAI `usage` of a request's generations, each prompt's `n` choices in turn: each prompt
    counted once, every choice's tokens (none when the prompt was only scored: echo with
    max_tokens 0). `cached_tokens` is the part of the prompts the engine's caches already held;
    `reasoning`: the completion's tokens of a thinking model's reasoning, where it was split off."""
    prompts = runs[::n]
    prompt = sum(s.prompt_tokens for s in prompts)
    completion = sum(s.tokens for s in runs) if generated else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(s.prompt_tokens - s.prefilled_tokens for s in prompts)},
            "completion_tokens_details": {"reasoning_tokens": reasoning,
                                          "accepted_prediction_tokens": sum(s.prediction_accepted for s in runs),
                                          "rejected_prediction_tokens": sum(s.prediction_rejected for s in runs),
                                          "audio_tokens": 0}}


def figures(stats: GenerationStats) -> dict:
    """The `mlxspec` object: how speculation went for this request (or one of its choices)."""
    return {"drafter": stats.drafter, "acceptance_rate": stats.acceptance_rate,
            "tokens_per_target_pass": stats.tokens_per_target_pass, "tokens_per_second": stats.tokens_per_second,
            "drafted": stats.drafted, "accepted": stats.accepted, "target_passes": stats.rounds,
            "tree_rounds": stats.tree_rounds, "lookup_rounds": stats.lookup_rounds,
            "prompt_tokens_per_second": stats.prompt_tokens_per_second, "prefilled_tokens": stats.prefilled_tokens,
            "prompt_seconds": stats.prompt_seconds, "seconds": stats.seconds,
            "first_token_seconds": stats.first_token_seconds}


class Shapes:
    """Builds every body of one request's answer (same id, `created` and `model` throughout)."""

    def __init__(self, kind: str, model: str, reasoning_key: str = "reasoning", fingerprint: Optional[str] = None):
        self.chat = kind == "chat"
        self.fingerprint = fingerprint  # OpenAI's system_fingerprint (`serve.fingerprint`)
        self.reasoning_key = reasoning_key  # where a thinking model's reasoning goes (`serve --reasoning-key`)
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = model

    def _head(self, obj: str) -> dict:
        head = {"id": self.id, "object": obj, "created": self.created, "model": self.model}
        if self.fingerprint is not None:
            head["system_fingerprint"] = self.fingerprint
        return head

    def choice(self, index: int, text: str, finish_reason: str, tool_calls: Optional[list] = None,
               logprobs: Optional[dict] = None, reasoning: str = "", stop_reason=None) -> dict:
        """One choice of a whole answer (`content` null when only tools were called; a thinking
        model's reasoning in `reasoning`, mlx-lm's key, or `serve --reasoning-key`'s). `stop_reason`:
        vLLM's, the stop string or stop token id that ended it (None at EOS or the length)."""
        if not self.chat:
            return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
                    "stop_reason": stop_reason}
        message = {"role": "assistant", "content": text or (None if tool_calls else "")}
        if reasoning:
            message[self.reasoning_key] = reasoning
        if tool_calls:
            message["tool_calls"] = tool_calls
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason,
                "stop_reason": stop_reason}

    def completion(self, choices: List[dict], usage_body: dict, stats: GenerationStats) -> dict:
        """The whole answer of a request without `stream`."""
        body = self._head("chat.completion" if self.chat else "text_completion")
        body.update(choices=choices, usage=usage_body, mlxspec=figures(stats))
        return body

    def chunk(self, text: Optional[str] = None, *, first: bool = False, finish_reason: Optional[str] = None,
              stats: Optional[GenerationStats] = None, include_usage: bool = False,
              tool_calls: Optional[list] = None, logprobs: Optional[dict] = None, reasoning: str = "",
              index: int = 0, stop_reason=None) -> dict:
        """A stream chunk of choice `index`: the role (first), new reasoning or text or tool calls
        (each whole, with its `index` among the answer's calls), or the finish reason with the
        choice's mlxspec figures."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {}
            if reasoning:
                delta[self.reasoning_key] = reasoning
            if text:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = tool_calls
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            body = self._head("chat.completion.chunk")
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
            body = self._head("text_completion")
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        body["choices"] = [choice]
        if include_usage:
            body["usage"] = None  # OpenAI: null on every chunk but the usage one
        if stats is not None:
            body["mlxspec"] = figures(stats)
        return body

    def usage_chunk(self, usage_body: dict, stats: GenerationStats) -> dict:
        """The extra last chunk of `stream_options.include_usage`: no choices, the usage (and figures)."""
        body = self._head("chat.completion.chunk" if self.chat else "text_completion")
        body.update(choices=[], usage=usage_body, mlxspec=figures(stats))
        return body


class LogprobStream:
    """OpenAI's `logprobs` of an answer's tokens, handed out as far as its text has gone.

    A token whose text is still held back (a possible stop string, part of a character) waits,
    and tokens past the answer's end (a stop string, the end-of-text token) never go out, so
    the tokens spell the text (as generated: tool-call markup included). `bytes` are each
    token's own, also when they are part of a character."""

    def __init__(self, chat: bool, token_bytes: Callable[[int], bytes], offset: int = 0):
        self.chat, self.token_bytes = chat, token_bytes
        self.offset = offset  # characters before the answer's text: the prompt's, echoed or not
        self._waiting: deque = deque()
        self._text = bytearray()  # the answer's text so far
        self._at = 0  # byte offset of the next waiting token
        self._skew: Optional[int] = None  # 1: a SentencePiece decoder dropped the text's first space

    def whole(self, events) -> dict:
        """The logprobs of a whole answer's events."""
        return self.feed(events) or self._shape([])

    def feed(self, events) -> Optional[dict]:
        """The logprobs of `events` (and earlier ones) whose text is out now; None if none is."""
        ready = self.ready(events)
        return self._shape(ready) if ready else None

    def ready(self, events) -> list:
        """(event, its token's bytes, their offset in the text) of `events` (and earlier ones) whose
        text is out now."""
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
        return ready

    def _shape(self, ready) -> dict:
        if self.chat:
            def entry(raw: bytes, lp: float) -> dict:
                return {"token": raw.decode("utf-8", "replace"), "logprob": lp, "bytes": list(raw)}

            return {"content": [dict(entry(raw, ev.logprob), top_logprobs=[entry(self.token_bytes(t), lp)
                                                                             for t, lp in ev.top_logprobs])
                                for ev, raw, _ in ready], "refusal": None}
        return {"tokens": [_legacy_name(raw) for _, raw, _ in ready],
                "token_logprobs": [ev.logprob for ev, _, _ in ready],
                "top_logprobs": [_legacy_top(ev.top_logprobs, self.token_bytes, (ev.token, ev.logprob))
                                 for ev, _, _ in ready],
                "text_offset": [self.offset + len(bytes(self._text[:start]).decode("utf-8", "ignore"))
                                for _, _, start in ready]}


def prompt_logprobs(scored, token_bytes: Callable[[int], bytes]) -> dict:
    """The legacy `logprobs` of an echoed prompt (`TokenEvent.prompt_logprobs`): every token, the
    first one's logprob and top choices null, offsets into the text its tokens spell."""
    decoder = codecs.getincrementaldecoder("utf-8")("ignore")  # a character counts once complete
    chars, offsets, names = 0, [], []
    for token, _, _ in scored:
        raw = token_bytes(token)
        offsets.append(chars)
        chars += len(decoder.decode(raw))
        names.append(_legacy_name(raw))
    return {"tokens": names, "token_logprobs": [lp for _, lp, _ in scored],
            "top_logprobs": [None if lp is None else _legacy_top(best, token_bytes, (token, lp))
                             for token, lp, best in scored],
            "text_offset": offsets}


def joined(first: Optional[dict], then: Optional[dict]) -> Optional[dict]:
    """Two legacy `logprobs` objects one after the other (an echoed prompt's, then the answer's)."""
    if first is None or then is None:
        return first or then
    return {key: first[key] + then[key] for key in first}


def _legacy_top(pairs, token_bytes: Callable[[int], bytes], chosen: tuple) -> dict:
    """The top choices at one position, and the token there (`chosen`: (id, logprob)) if it is not
    among them, as OpenAI's legacy API does (up to logprobs + 1 entries)."""
    best: dict = {}
    for t, lp in [*pairs, chosen]:  # best first: tokens that print alike keep the best one's
        best.setdefault(_legacy_name(token_bytes(t)), lp)
    return best


def _legacy_name(raw: bytes) -> str:
    """A token as the legacy completions API names it: its text, or `bytes:\\xNN...` for part of a character."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def sse(body, event: Optional[str] = None) -> bytes:
    """One server-sent event carrying a JSON body (or the closing `[DONE]`), named `event` when
    given (the Responses' and Anthropic's streams name theirs)."""
    data = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return ((f"event: {event}\n" if event else "") + f"data: {data}\n\n").encode()


DONE = sse("[DONE]")

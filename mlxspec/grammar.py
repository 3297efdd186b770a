"""Structured output: a grammar the generated tokens must follow (OpenAI's `response_format`).

llguidance (the grammar engine vLLM and llama.cpp use too) compiles a JSON schema, a regex or
a Lark grammar into a matcher that says, after any prefix of tokens, which tokens may come next.
A pass masks each row it feeds with the set at that row's position, the drafts' rows too:
greedy rows are the constrained target's argmax, sampled rows its masked distribution, so
speculation stays lossless against constrained plain decoding (a drafter's q need not know
the grammar: rejection sampling against the masked p is exact). A deterministic draft is cut
before its first token the grammar refuses, which the target would reject anyway, and, when
speculating, it is the tokens the grammar forces next where the drafter's draft does not begin
with them (SGLang's "jump forward", verified here like any draft).
"""

from __future__ import annotations

import functools
import re
from typing import Iterable, List, Optional

import mlx.core as mx
import numpy as np

from .errors import InvalidArgumentError, shown

FORMATS = ("text", "json_object", "json_schema", "regex", "choice", "lark")
# Whitespace between JSON tokens, as llama.cpp's schemas allow it: one space, or a newline and an indent
# of up to 20 spaces or tabs. What models write, pretty-printed too; a model that would write newlines
# forever (small ones do, given free whitespace) must close the value instead.
JSON_OPTIONS = {"whitespace_pattern": r"(?: |\n[ \t]{0,20})"}


def check_response_format(fmt, flag: Optional[str] = None) -> Optional[dict]:
    """OpenAI's `response_format` (and a few extensions), checked: None when it constrains nothing.

    {"type": "text"}; {"type": "json_object"} (any JSON object); {"type": "json_schema",
    "json_schema": {"name": ..., "schema": {...}, "strict": ...}}; and, beyond OpenAI's,
    {"type": "regex", "regex": "..."}, {"type": "choice", "choice": ["yes", "no"]} and
    {"type": "lark", "lark": "..."} (llguidance's Lark dialect). `flag`: the command-line flag
    that gave the format's value (`generate --regex`), which errors then name instead of the
    API's field."""

    def field(path: str) -> str:  # what an error calls the value at `path`
        return flag or f"response_format {path}"

    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise InvalidArgumentError(f"response_format must be an object with a \"type\" ({', '.join(FORMATS)}), "
                                   f"got {shown(fmt)}")
    kind = fmt["type"]
    if kind not in FORMATS:
        raise InvalidArgumentError(f"response_format type must be one of {', '.join(FORMATS)}, got {shown(kind)}")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": kind}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise InvalidArgumentError(f"{field('json_schema')} must be an object {{\"name\": ..., \"schema\": "
                                       f"{{...}}}}, got {shown(spec)}")
        schema = spec.get("schema", {})  # OpenAI's default: any JSON
        if not isinstance(schema, (dict, bool)):
            raise InvalidArgumentError(f"{field('json_schema.schema')} must be a JSON Schema object, got "
                                       f"{shown(schema)}")
        # (a checked format checks again as itself)
        return _valid({"type": kind, "json_schema": {"schema": schema}}, flag)
    value = fmt.get(kind)
    if kind == "choice":
        if (not isinstance(value, list) or not value
                or not all(isinstance(v, str) and v for v in value)):
            raise InvalidArgumentError(f"{field('choice')} must be a non-empty list of non-empty strings, "
                                       f"got {shown(value)}")
        return {"type": kind, kind: list(value)}
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(f"{field(kind)} must be a non-empty string, got {shown(value)}")
    return _valid({"type": kind, kind: value}, flag)


def _valid(fmt: dict, flag: Optional[str] = None) -> dict:
    """`fmt` once llguidance has parsed its grammar (no tokenizer needed): a bad regex, schema or
    Lark grammar is said before a model loads or a request queues, not at its first token."""
    error = _grammar_error(grammar_of(fmt, flag))
    if error:
        what = {"json_schema": "its JSON schema"}.get(fmt["type"], f"its {fmt['type']}")
        refused = f"{flag} was refused" if flag else f"response_format was refused ({what})"
        raise InvalidArgumentError(f"{refused}: {_said(error)}")
    return fmt


@functools.lru_cache(maxsize=32)
def _grammar_error(grammar: str) -> str:
    """llguidance's complaint about `grammar` ("" when it parses). Cached: a request's format is
    checked where it arrives (the server) and again by the engine, and a tool set's call grammar
    comes back with every request that offers those tools."""
    from llguidance import LLMatcher

    error = LLMatcher.validate_grammar(grammar)
    # without the position in the wrapped grammar and its caret lines, which name no user text
    lines = [ln for ln in error.splitlines() if ln.strip() != "^" and not re.match(r"\s*\d+ \|", ln)]
    return re.sub(r"^at \d+\(\d+\): ", "", "\n".join(lines))


def grammar_of(fmt: dict, flag: Optional[str] = None) -> str:
    """llguidance's grammar for a checked format (`flag`: as in `check_response_format`)."""
    from llguidance import LLMatcher

    kind = fmt["type"]
    if kind in ("json_object", "json_schema"):
        schema = {"type": "object"} if kind == "json_object" else fmt["json_schema"]["schema"]
        try:
            return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except (ValueError, TypeError) as e:
            who = flag or "response_format's JSON schema"
            raise InvalidArgumentError(f"{who} was refused: {e}") from None
    if kind == "regex":
        return LLMatcher.grammar_from_regex(fmt["regex"])
    if kind == "choice":
        return LLMatcher.grammar_from_regex("|".join(re.escape(c) for c in fmt["choice"]))
    return LLMatcher.grammar_from_lark(fmt["lark"])


def token_table(tokenizer, eos: Iterable[int]):
    """llguidance's view of a tokenizer (about 0.3 s for 49k tokens, 1 s for 150k: build it once)."""
    import llguidance.hf

    hf = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's TokenizerWrapper holds the Hugging Face one
    try:
        return llguidance.hf.from_tokenizer(hf, eos_token=sorted(eos) or None)
    except ValueError as e:
        raise InvalidArgumentError(f"response_format needs a fast (Rust) Hugging Face tokenizer: {e}") from None


class Constraint:
    """One generation's grammar state: masks for a pass's rows, and the committed tokens."""

    def __init__(self, fmt: dict, table, eos: Iterable[int], width: int, refused: Iterable[int] = ()):
        """`width`: the logits' width (an embedding may have padding rows past the tokenizer's ids);
        `refused`: the tokens the request bans outright (a logit_bias of -100), left out of every row."""
        from llguidance import LLMatcher

        self.table = table
        self.matcher = LLMatcher(table, grammar_of(fmt), log_level=0)
        if self.matcher.is_error():
            what = {"json_object": "", "json_schema": " (its JSON schema)"}.get(fmt["type"], f" (its {fmt['type']})")
            raise InvalidArgumentError(f"response_format was refused{what}: {_said(self.matcher.get_error())}")
        self.words = (table.vocab_size + 31) // 32
        self.width = width
        self.eos = set(eos)
        self._ended = None  # the stopped matcher's mask words (`_ended_words`)
        self.refused = None
        if refused:
            self.refused = np.zeros(width, dtype=np.bool_)
            self.refused[list(refused)] = True

    def allowed(self, tokens: List[int]) -> int:
        """How many leading `tokens` the grammar allows from here."""
        return self.matcher.validate_tokens(tokens)

    def forced(self) -> List[int]:
        """The tokens of the bytes the grammar forces next (a schema's keys, its punctuation), in
        the tokenizer's own spelling of them; the model may spell them otherwise, so they are
        verified as drafts, never assumed."""
        return self.matcher.compute_ff_tokens()

    def rows(self, drafts: List[int]) -> mx.array:
        """(1 + n, width) bool: row i, the tokens allowed after `drafts[:i]`, for the longest n
        (up to len(drafts)) whose rows each allow some token; the caller drafts `drafts[:n]`.

        Rows past a draft the grammar refuses allow every token: the refused draft is never
        accepted (its row gives it no mass), so nothing is taken from them. Rows past an
        end-of-sequence draft allow what the matcher allows once it has ended (the end again):
        with ignore_eos the answer goes on there, as plain decoding's does on the ended matcher
        (which cannot roll back an end, so it is not fed one here).

        Raises:
            InvalidArgumentError: the first row allows no token (the request's logit_bias bans
                every one the grammar allows next): nothing can be written.
        """
        m = self.matcher
        n = m.validate_tokens(drafts)
        end = next((i for i, t in enumerate(drafts[:n]) if t in self.eos), None)
        n = n if end is None else end
        out = np.full((len(drafts) + 1, self.words), -1, dtype=np.int32)
        for i in range(n + 1):
            m.unsafe_compute_mask_ptr(out[i].ctypes.data, out.shape[1] * 4)
            if i < n:
                m.consume_token(drafts[i])
        if n:
            m.rollback(n)
        if end is not None:
            out[end + 1:] = self._ended_words(drafts[end])
        self._check()
        # Unpacked here: numpy does it in microseconds, where a gather of bits on the device took
        # 4 ms for 5 rows of 49k on a 2-core CPU (against 1 ms for the `where` that applies them).
        bits = np.unpackbits(out.view(np.uint8), axis=1, count=min(self.width, 32 * self.words),
                             bitorder="little").view(np.bool_)
        if bits.shape[1] < self.width:  # padding rows: no token
            bits = np.pad(bits, [(0, 0), (0, self.width - bits.shape[1])])
        return mx.array(self._unrefused(bits))

    def _unrefused(self, bits: np.ndarray) -> np.ndarray:
        """`rows`' bits less the refused tokens, cut before the first row left with none (a
        draft leading there is cut, so the target never reaches it: plain decoding stops there
        with the error too, after the same tokens)."""
        if self.refused is None:
            return bits
        grammar = bits[0].copy()
        bits &= ~self.refused
        dead = np.flatnonzero(~bits.any(axis=1))
        if len(dead) and dead[0] == 0:
            ids = np.flatnonzero(grammar).tolist()
            raise InvalidArgumentError(
                "nothing can be written: logit_bias bans (-100) every token the response_format allows next "
                f"({', '.join(map(str, ids[:8]))}{', ...' if len(ids) > 8 else ''})")
        return bits[:dead[0]] if len(dead) else bits

    def _ended_words(self, eos: int) -> np.ndarray:
        """The mask words of a matcher that has taken an end-of-sequence token, from one of its own
        that took `eos` (once: every ended matcher allows the same)."""
        if self._ended is None:
            from llguidance import LLMatcher

            ended = LLMatcher(self.table, LLMatcher.grammar_from_regex(""), log_level=0)
            ended.consume_token(eos)
            self._ended = np.zeros(self.words, dtype=np.int32)
            ended.unsafe_compute_mask_ptr(self._ended.ctypes.data, self._ended.nbytes)
        return self._ended

    def commit(self, tokens: List[int]) -> None:
        """Advance over generated tokens (up to the first end-of-sequence one)."""
        for t in tokens:
            self.matcher.consume_token(t)
            if t in self.eos:
                break
        self._check()

    def _check(self) -> None:
        if self.matcher.is_error():  # a masked row always picks an allowed token: this is a bug, said plainly
            raise RuntimeError(f"the grammar matcher failed: {_said(self.matcher.get_error())}")


class AfterThinking:
    """A grammar that applies once the model has closed the thinking block the prompt opened
    (`end`: the closing marker's tokens): before it, every token is allowed and nothing is
    forced, so the model reasons freely and answers in the grammar (vLLM's structured output
    with a reasoning parser). The same interface as `Constraint`."""

    def __init__(self, inner: Constraint, end: List[int]):
        self.inner, self.end = inner, list(end)
        self.open = False  # the block is closed: the grammar applies
        self._tail: List[int] = []  # the last committed tokens, which a marker of several may start in

    def allowed(self, tokens: List[int]) -> int:
        at = self._after_end(tokens)
        return len(tokens) if at is None else at + self.inner.allowed(tokens[at:])

    def forced(self) -> List[int]:
        return self.inner.forced() if self.open else []

    def rows(self, drafts: List[int]) -> mx.array:
        at = self._after_end(drafts)  # row `at` is the first the grammar masks
        free = mx.ones((len(drafts) + 1 if at is None else at, self.inner.width), dtype=mx.bool_)
        if at is None:
            return free
        inner = self.inner.rows(drafts[at:])
        return inner if at == 0 else mx.concatenate([free, inner])

    def commit(self, tokens: List[int]) -> None:
        at = self._after_end(tokens)
        if at is None:
            seq = self._tail + list(tokens)
            self._tail = seq[max(0, len(seq) - len(self.end) + 1):]
            return
        self.open = True
        self.inner.commit(tokens[at:])

    def _after_end(self, tokens: List[int]) -> Optional[int]:
        """Where in `tokens` the grammar starts (0 once open), or None while the block stays open."""
        if self.open:
            return 0
        seq, n = self._tail + list(tokens), len(self.end)
        at = next((i + n for i in range(len(seq) - n + 1) if seq[i:i + n] == self.end), None)
        return None if at is None else at - len(self._tail)


def _said(message: str) -> str:
    """llguidance's error on one line (its regex errors span several), at most 400 characters."""
    text = " ".join(message.split()) or "unknown error"
    return text if len(text) <= 400 else text[:399] + "…"


def masked(rows: mx.array, allowed: mx.array) -> mx.array:
    """Rows of logits (S, V) with what `allowed` (S, V) bool leaves out set to -inf."""
    return mx.where(allowed, rows, mx.array(-mx.inf, rows.dtype))


__all__ = ["AfterThinking", "Constraint", "check_response_format", "grammar_of", "masked", "token_table", "FORMATS"]

"""Incremental detokenisation with stop strings.

Text is emitted only once it is final: an incomplete UTF-8 sequence at the end (decoded
as U+FFFD) and any tail that could still grow into a stop string are held back. When a
stop string appears, the text is cut right before it (after it, for an `end_after` string).
Two limits of llama.cpp's, for completions at an editor's cursor, end it too (`limited`): a
line after the first indented less than `min_indent` (its n_indent), and, once the caller says
the time is up (its t_max_predict_ms), the next line end.

Each token decodes only a short window (the tokens since the last complete character, plus
the chunk before them as context, as vLLM's incremental detokeniser does), not the whole
output: re-decoding everything made each token cost O(length), over 1 ms at 2,000 tokens.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple


def token_texts(tokenizer, width: int) -> List[str]:
    """Each token id's text, decoded alone, for `width` ids ("" past the tokenizer's ids, or
    without a tokenizer). One batched decode (the demo's 49k ids: 0.4 s on 2 x86 cores)."""
    if tokenizer is None:
        return [""] * width
    n = min(width, len(tokenizer.vocab) if hasattr(tokenizer, "vocab") else width)
    ids = [[i] for i in range(n)]
    batch = getattr(tokenizer, "batch_decode", None)
    texts = batch(ids) if batch is not None else [tokenizer.decode(i) for i in ids]
    return list(texts) + [""] * (width - n)


def partial_marker(text: str, marker: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `marker` (text that could
    still grow into it)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class TextAssembler:
    def __init__(self, tokenizer, stop: Optional[Sequence[str]] = None, keep_stop: bool = False,
                 end_after: str = "", min_indent: int = 0):
        """`keep_stop`: the text ends with the stop string found instead of before it (vLLM's
        include_stop_str_in_output). `end_after`: one more string that ends the text, kept in it
        and not reported as `matched` (a tool call's end marker, when one call is all the answer
        may have); a stop string it also is stays the caller's. `min_indent`: a line after the
        first whose first character other than spaces and tabs comes after fewer of them ends
        the text right before that character, as llama.cpp's n_indent does (an editor sends the
        cursor's indentation: the completion stays in its block); a blank line decides nothing
        (llama.cpp's ends there, inside a function's body too)."""
        self.tokenizer = tokenizer
        self.stop = [s for s in (stop or []) if s]
        self.keep_stop = keep_stop
        self._after = end_after if end_after and end_after not in self.stop else ""
        if self._after:
            self.stop.append(self._after)
        self.matched: Optional[str] = None  # the stop string that ended the text (the one found earliest)
        self.min_indent = min_indent
        self.limited = False  # a limit ended the text (`min_indent`, or a line end once late), no stop string
        self._lines_from = 0  # where the next line start `min_indent` has not judged is searched from
        self._longest_stop = max(map(len, self.stop), default=0)
        self.tokens: List[int] = []
        self.text = ""  # decoded so far (possibly with a held-back tail)
        self.emitted = 0  # characters of self.text already handed out
        # The window: tokens[_prefix:_read] decode to _context, already part of text[:_final];
        # tokens from _read on are decoded after that context and appended at _final.
        self._prefix = self._read = self._final = 0
        self._context = ""

    def _held(self, text: str) -> int:
        """How many trailing characters must wait: an incomplete character (U+FFFD until its last
        byte comes) and, before it, any tail that could still grow into a stop string (the
        incomplete character may be the stop's next one)."""
        body = _complete(text)
        hold = max((partial_marker(body, s) for s in self.stop), default=0)
        return len(text) - len(body) + hold

    def add(self, token: Optional[int], late: bool = False) -> Tuple[str, bool]:
        """Add a token (None = add nothing); returns (new final text, stopped). `late`: the time
        is up, so the first line end not yet handed out ends the text (after itself)."""
        if self.tokenizer is None:
            return "", False
        if token is not None:
            self.tokens.append(token)
            self._decode()
        # Not in an incomplete character: its U+FFFD is not text yet and may match no stop.
        body = _complete(self.text)
        hit = None
        if self.stop:
            search_from = max(0, self.emitted - self._longest_stop)
            hits = [(i, s) for s, i in ((s, body.find(s, search_from)) for s in self.stop) if i >= 0]
            hit = min(hits, key=lambda hit: hit[0]) if hits else None
        limit = self._limit(body, late)
        if limit is not None and (hit is None or limit <= hit[0]):
            self.limited = True
            return self._cut(limit), True
        if hit is not None:
            cut, found = hit
            self.matched = None if found == self._after else found
            return self._cut(cut + len(found) if self.keep_stop or found == self._after else cut), True
        end = len(self.text) - self._held(self.text)
        piece = self.text[self.emitted : end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return piece, False

    def _cut(self, cut: int) -> str:
        """End the text at `cut`; returns what of it was not handed out yet."""
        piece = self.text[self.emitted : cut] if cut > self.emitted else ""
        self.text = self.text[:cut]
        self.emitted = len(self.text)
        return piece

    def _limit(self, body: str, late: bool) -> Optional[int]:
        """Where a limit ends `body`, if one does: before a line's first character indented less
        than `min_indent`, or, when `late`, after the first line end not handed out."""
        cut = None
        while self.min_indent:
            nl = body.find("\n", self._lines_from)
            if nl < 0:
                break
            first = nl + 1
            while first < len(body) and body[first] in " \t":
                first += 1
            if first == len(body):
                break  # nothing but blanks on it yet: undecided
            if body[first] != "\n" and first - nl - 1 < self.min_indent:
                cut = first
                break
            self._lines_from = first  # judged (a blank line: nothing to judge)
        if late:
            nl = body.find("\n", self.emitted)
            if nl >= 0 and (cut is None or nl + 1 < cut):
                cut = nl + 1
        return cut

    def _decode(self) -> None:
        window = self.tokenizer.decode(self.tokens[self._prefix:])
        if window.startswith(self._context):
            self.text = self.text[: self._final] + window[len(self._context):]
        else:  # a decoder that rewrote the context itself: decode everything, window from the start
            self.text = self.tokenizer.decode(self.tokens)
            self._prefix = self._read = self._final = 0
            self._context = ""
        if not self.text.endswith("\ufffd"):  # complete characters: move the window on
            self._prefix, self._read, self._final = self._read, len(self.tokens), len(self.text)
            self._context = self.tokenizer.decode(self.tokens[self._prefix:self._read])

    def flush(self) -> str:
        """Release whatever was held back (the generation ended without a stop string)."""
        piece = self.text[self.emitted :]
        self.emitted = len(self.text)
        return piece


def _complete(text: str) -> str:
    """`text` without the U+FFFD run an incomplete UTF-8 sequence decodes to at its end."""
    return text.rstrip("\ufffd") if text.endswith("\ufffd") else text

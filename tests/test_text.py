"""TextAssembler: the streamed pieces are exactly what decoding the whole output gives, and
each token decodes a short window, not the whole output."""

from __future__ import annotations

import random

import pytest

from mlxspec.text import TextAssembler
from tiny import make_tokenizer

SPECIALS = 3  # make_tokenizer's special tokens come first; then one token per byte


class WholeDecode:
    """The reference semantics: decode everything after every token (what TextAssembler did)."""

    def __init__(self, tokenizer, stop):
        self.tokenizer, self.stop = tokenizer, [s for s in stop if s]
        self.tokens, self.text, self.emitted = [], "", 0

    def add(self, token):
        self.tokens.append(token)
        self.text = self.tokenizer.decode(self.tokens)
        body = self.text.rstrip("\ufffd")  # the complete characters (the byte tokens here decode no U+FFFD)
        if self.stop:
            hits = [i for i in (body.find(s) for s in self.stop) if i >= 0]
            if hits:
                cut = min(hits)
                piece = self.text[self.emitted:cut] if cut > self.emitted else ""
                self.emitted = cut
                return piece, True
        hold = 0
        for s in self.stop:
            hold = max([hold] + [n for n in range(1, min(len(s), len(body) + 1)) if body.endswith(s[:n])])
        end = len(body) - hold
        piece = self.text[self.emitted:end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return piece, False


class Counting:
    """A tokenizer wrapper that counts the tokens it is asked to decode."""

    def __init__(self, tokenizer):
        self.tokenizer, self.decoded = tokenizer, 0

    def decode(self, ids):
        self.decoded += len(ids)
        return self.tokenizer.decode(ids)


def byte_tokens(text: str):
    return [SPECIALS + b for b in text.encode()]


def run(assembler, tokens):
    pieces, stopped = [], False
    for t in tokens:
        piece, stopped = assembler.add(t)
        pieces.append(piece)
        if stopped:
            break
    return pieces, stopped


ALPHABET = ["a", "b", " ", "\n", "é", "ß", "日", "本", "🤖", "👩\u200d💻", "🇫🇷", ".", "!"]


@pytest.mark.parametrize("seed", range(20))
def test_pieces_equal_whole_decoding_with_multibyte_characters_and_stops(seed):
    rng = random.Random(seed)
    tok = make_tokenizer()
    text = "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(5, 80)))
    stop = [] if seed % 4 == 0 else ["".join(rng.choice(ALPHABET) for _ in range(rng.randrange(1, 4)))
                                     for _ in range(rng.randrange(1, 3))]
    ids = byte_tokens(text)
    got, got_stop = run(TextAssembler(tok, stop), ids)
    want, want_stop = run(WholeDecode(tok, stop), ids)
    assert got == want and got_stop == want_stop
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    assert got_stop == bool(cuts)
    if cuts:  # nothing at or past the stop was ever handed out, not even a piece later cut away
        assert "".join(got) == text[:min(cuts)]
    if not got_stop:
        a = TextAssembler(tok, stop)
        streamed = "".join(a.add(t)[0] for t in ids) + a.flush()
        assert streamed == text
    assert not any("\ufffd" in p for p in got)  # a split character is held back, never emitted


@pytest.mark.parametrize("text,stop,want", [
    ("Hi 你好 🎉 there", "好 🎉", "Hi 你"),  # the stop's last character comes in 4 byte tokens
    ("a 🎉🚀🌍 b", "🚀🌍", "a 🎉"),
    ("ok 🎉 done", "\ufffd", None),  # an incomplete character is not a U+FFFD in the text
])
def test_a_stop_whose_later_character_is_split_into_bytes_cuts_where_it_starts(text, stop, want):
    pieces, stopped = run(TextAssembler(make_tokenizer(), [stop]), byte_tokens(text))
    assert stopped is (want is not None)
    assert "".join(pieces) == (want if want is not None else text[:len("".join(pieces))])
    if want is None:
        assert len("".join(pieces)) == len(text)  # all of it but nothing held forever: flush has nothing left


def test_metaspace_decoder_strips_the_leading_space_once():
    """SentencePiece-style vocabularies mark spaces with U+2581 and the decoder drops the first
    one: a window that starts mid-text must not lose the space before a word."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["▁Hello", "▁world", ",", "▁how", "▁are", "▁you", "?", "▁fine", "."]
    vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(words)}}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Metaspace()
    raw.decoder = decoders.Metaspace()
    tok = TokenizerWrapper(PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>"))
    rng = random.Random(0)
    ids = [rng.randrange(1, len(vocab)) for _ in range(200)]
    got, _ = run(TextAssembler(tok, []), ids)
    want, _ = run(WholeDecode(tok, []), ids)
    assert got == want
    assert "".join(got) == tok.decode(ids)


def test_each_token_decodes_a_window_not_the_whole_output():
    """Decoded tokens grow linearly with the output (they grew quadratically: 2 million here)."""
    tok = Counting(make_tokenizer())
    ids = byte_tokens("日本語 and 🤖 " * 100)  # 2,000 tokens, many of them inside a character
    a = TextAssembler(tok, ["<stop>"])
    for t in ids:
        a.add(t)
    assert a.text == tok.tokenizer.decode(ids)
    assert tok.decoded <= 8 * len(ids)


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("text, stops, matched, cut", [
    ("say ab then abc", ["abc", "ab"], "ab", 4),  # the earliest found wins
    ("say abc", ["bc", "abc"], "abc", 4),  # both end with the same token: the one that starts first
    ("x END y", ["END"], "END", 2),
    ("END y", ["END"], "END", 0),  # at the very start: nothing before it
])
def test_the_stop_string_found_is_named_and_kept_when_asked(text, stops, matched, cut, keep):
    asm = TextAssembler(make_tokenizer(), stops, keep_stop=keep)
    out, stopped = fed_until_stopped(asm, text)
    assert stopped and asm.matched == matched
    assert out == text[:cut] + (matched if keep else "")


def fed_until_stopped(asm, text):
    """(the text `asm` gives out for `text`, fed token by token until it stops, whether it stopped)."""
    out, stopped = "", False
    for t in asm.tokenizer.encode(text, add_special_tokens=False):
        piece, stopped = asm.add(t)
        out += piece
        if stopped:
            break
    return out, stopped


@pytest.mark.parametrize("stops, text, out, matched", [
    ([], "a </c> b </c>", "a </c>", None),  # kept, and no stop string of the caller's is named
    (["b"], "a b </c>", "a ", "b"),  # the caller's stop string comes first: it cuts as ever
    (["</c>"], "a </c> b", "a ", "</c>"),  # the caller's own stop string it also is: the caller's rule
])
def test_an_end_after_string_ends_the_text_with_it(stops, text, out, matched):
    asm = TextAssembler(make_tokenizer(), stops, end_after="</c>")
    got, stopped = fed_until_stopped(asm, text)
    assert stopped and got == out and asm.matched == matched


@pytest.mark.parametrize("text, indent, out", [
    # the cursor's line is never judged; a line indented less ends the text before its first character
    ("x = 1\n    y = 2\n    z = 3\nprint(x)\n", 4, "x = 1\n    y = 2\n    z = 3\n"),
    ("if a:\n        b\n    c\n", 8, "if a:\n        b\n    "),  # (llama.cpp keeps the short line's blanks)
    ("if a:\n\tb\n\tc\nd", 1, "if a:\n\tb\n\tc\n"),  # a tab is one character, as llama.cpp counts
    ("a\n    b\n\n    c\n  \n    d\ne", 4, "a\n    b\n\n    c\n  \n    d\n"),  # blank lines decide nothing
    ("no\nlimit\n", 0, "no\nlimit\n"),
    ("stop here\n    x", 4, "stop"),  # a stop string before the limit wins
    ("\nprint(x)", 4, "\n"),  # an empty cursor line: the next is judged from the first character
])
def test_a_line_indented_less_than_min_indent_ends_the_text(text, indent, out):
    asm = TextAssembler(make_tokenizer(), [" here"] if "here" in text else [], min_indent=indent)
    got, stopped = fed_until_stopped(asm, text)
    if got != text:
        got += "" if stopped else asm.flush()
    assert got == out and stopped == (out != text)
    assert asm.limited == (stopped and "here" not in text)


def test_late_ends_the_text_after_the_first_line_end_not_given_out():
    asm = TextAssembler(make_tokenizer(), ["zz"], min_indent=0)
    tokens = asm.tokenizer.encode("ab\ncd z\nef\ngh", add_special_tokens=False)
    out = ""
    for i, t in enumerate(tokens):
        piece, stopped = asm.add(t, late=i >= 4)  # the time is up from "c" on: "ab\n" went out before
        out += piece
        if stopped:
            break
    assert stopped and asm.limited and asm.matched is None
    assert out == "ab\ncd z\n"  # the held-back " z" (it may grow into "zz") went out with its line end
    whole = TextAssembler(make_tokenizer())
    assert whole.add(tokens[0])[0] == "a" and whole.add(tokens[1], late=True) == ("b", False)  # no line end yet
    assert whole.add(tokens[2], late=True) == ("\n", True) and whole.limited  # the line end that comes next


@pytest.mark.parametrize("before", ["", "ab"])
def test_late_cuts_right_after_a_line_end_that_was_held_back(before):
    """A line end held back (it may begin the stop string "\nzz") is the first not given out: the
    time up, the text ends right after it, not after what follows it."""
    asm = TextAssembler(make_tokenizer(), ["\nzz"])
    out = ""
    for t in asm.tokenizer.encode(before + "\nz", add_special_tokens=False):
        piece, stopped = asm.add(t)
        assert not stopped
        out += piece
    assert out == before
    piece, stopped = asm.add(asm.tokenizer.encode("q", add_special_tokens=False)[0], late=True)
    assert stopped and asm.limited and out + piece == before + "\n"

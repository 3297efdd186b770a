"""A logit_bias of -100 under a response_format: the banned tokens leave the grammar's rows. Where
the grammar allows nothing else next, the request cannot go on and says so (it stopped on "NaN
logits" greedily, and on the grammar matcher's own error sampling); where it allows something else,
that is written, and every drafter writes what plain decoding does (a draft that leads to such a
row is cut before it)."""

import pytest

import tiny
from mlxspec import Engine

ASK = [{"role": "user", "content": "say it say it again"}]
EOS = tiny.SPECIALS.index("<|im_end|>")
A, B, C = (ord(ch) + 3 for ch in "abc")  # the tiny tokenizer's byte tokens


TARGET, TOK = tiny.make_llama(5, tie_embeddings=False, layers=2), tiny.make_tokenizer()


def engines(tmp_path):
    yield "none", Engine(TARGET, TOK, drafter="none")
    yield "ngram", Engine(TARGET, TOK, drafter="ngram")
    yield "model copy", Engine(TARGET, TOK, drafter="model", num_draft=3,
                               draft_model=tiny.make_llama(5, tie_embeddings=False, layers=2))
    yield "eagle", Engine(TARGET, TOK, drafter="eagle", num_draft=3,
                          eagle_head=tiny.make_eagle_head(TARGET, tmp_path / "head", seed=4, copy=True))


@pytest.mark.parametrize("options", [{}, {"temperature": 1.0, "seed": 2}])
def test_a_ban_on_all_the_grammar_allows_next_is_said_where_it_happens_the_same_for_every_drafter(
        tmp_path, options):
    cases = [("[ab]c", {A: -100, B: -100}, [], f"({A}, {B})"),  # at the start
             ("ab", {EOS: -100}, [A, B], f"({EOS})"),  # after "ab", only the end may come
             ("a(b|c)", {B: -100, C: -100}, [A], f"({B}, {C})")]
    fresh = Engine(TARGET, TOK, drafter="none").generate(ASK, max_tokens=6).tokens
    for regex, bias, before, names in cases:
        kw = dict(max_tokens=8, response_format={"type": "regex", "regex": regex}, logit_bias=bias, **options)
        for name, engine in engines(tmp_path):
            got, error = tiny.streamed(engine, ASK, **kw)
            assert got == before and error == ("nothing can be written: logit_bias bans (-100) every token the "
                                               f"response_format allows next {names}"), (name, regex, got, error)
            # the next request, on the caches the error left, as on a fresh engine
            assert engine.generate(ASK, max_tokens=6).tokens == fresh, name


@pytest.mark.parametrize("options", [{}, {"temperature": 1.0, "seed": 2}])
def test_a_ban_that_leaves_the_grammar_a_token_keeps_every_drafter_s_answer_plain_decoding_s(tmp_path, options):
    for regex, bias, text in (("[ab]c", {A: -100}, "bc"), ("a[a-z ]{3,40}", {B: -100, C: -100, EOS: -100}, None)):
        kw = dict(max_tokens=16, response_format={"type": "regex", "regex": regex}, logit_bias=bias, **options)
        plain = None
        for name, engine in engines(tmp_path):
            for _ in range(2):
                r = engine.generate(ASK, **kw)
                plain = plain or r
                assert r.tokens == plain.tokens, name
            assert not set(bias) & set(plain.tokens) and (text is None or plain.text == text), plain.text
        assert text or (plain.finish_reason == "length" and len(plain.tokens) == 16)

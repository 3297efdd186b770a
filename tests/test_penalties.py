"""presence_penalty and frequency_penalty: every row of every pass gets the penalties plain decoding
would give it there (the drafts before it counted), so output is the penalised target's."""

import mlx.core as mx
import pytest

import tiny
from mlxspec.engine import Engine
from mlxspec.errors import InvalidArgumentError
from mlxspec.penalties import Penalties, check_penalty
from mlxspec.prompts import encode_prompt
from serve_helpers import openai_client, running_server, tiny_engine

ASK = [{"role": "user", "content": "Tell me a long story about rivers and the sea, again and again."}]


def engine_for(drafter, tmp_path):
    target = tiny.make_llama(0, tie_embeddings=True)  # tied: each token mostly predicts itself, so text repeats
    kw = {}
    if drafter == "model":
        kw["draft_model"] = tiny.make_llama(0, tie_embeddings=True)
    if drafter == "eagle":
        kw["eagle_head"] = tiny.make_eagle_head(target, tmp_path / "head", copy=True)
    return Engine(target, tiny.make_tokenizer(), drafter=drafter, **kw), target


def reference(target, ids, tokens, presence, frequency):
    """The greedy tokens of the penalised target, teacher-forced along `tokens`."""
    logits = target(mx.array(ids + tokens)[None])[0, len(ids) - 1:-1].astype(mx.float32)
    out = []
    for i in range(len(tokens)):
        counts = mx.zeros((logits.shape[-1],))
        for t in tokens[:i]:
            counts[t] += 1
        out.append(int(mx.argmax(logits[i] - frequency * counts - presence * (counts > 0)).item()))
    return out


@pytest.mark.parametrize("drafter", ["none", "ngram", "model", "eagle"])
@pytest.mark.parametrize("options", [{}, {"num_draft": 3}, {"temperature": 0.8, "seed": 3}])
def test_output_is_the_penalised_target_s(drafter, options, tmp_path):
    engine, target = engine_for(drafter, tmp_path)
    free = engine.generate(ASK, max_tokens=40, **options)
    engine.reset()
    pen = dict(presence_penalty=0.4, frequency_penalty=0.3)
    plain = engine.generate(ASK, max_tokens=40, speculative=False, **pen, **options)
    engine.reset()
    fast = engine.generate(ASK, max_tokens=40, **pen, **options)
    assert plain.tokens != free.tokens  # the penalties changed the text
    if not (drafter in ("model", "eagle") and "temperature" in options):  # else a sample from the same law
        assert fast.tokens == plain.tokens
    if "temperature" not in options:
        ids = encode_prompt(ASK, engine.tokenizer, engine.vocab_size)
        assert reference(target, ids, fast.tokens, 0.4, 0.3) == fast.tokens
        if drafter in ("ngram", "eagle") and "num_draft" in options:  # (a fixed k: auto varies with timings)
            assert fast.stats.accepted > 0  # rows past the first were verified with the drafts counted


def test_penalty_rows_count_the_drafts_before_each_row():
    p = Penalties(8, presence=0.5, frequency=0.25)
    p.commit([3, 3])
    rows = p.rows([], [3, 5, 5])(mx.zeros((1, 4, 8)))[0]
    want = mx.zeros((4, 8))
    for i, counts in enumerate([{3: 2}, {3: 3}, {3: 3, 5: 1}, {3: 3, 5: 2}]):
        for t, c in counts.items():
            want[i, t] = -(0.25 * c + 0.5)
    assert mx.array_equal(rows, want).item()
    lazy = p.rows([], [], pending=mx.array([5], dtype=mx.uint32))(mx.zeros((1, 1, 8)))[0]  # a chained step: its predecessor's token on the device
    assert lazy[0, 5].item() == -(0.25 + 0.5) and lazy[0, 3].item() == -(0.5 + 0.5)


@pytest.mark.parametrize("kw, says", [({"presence_penalty": 3}, "presence_penalty must be a number in [-2, 2]"),
                                      ({"frequency_penalty": "x"}, "frequency_penalty must be"),
                                      ({"frequency_penalty": True}, "frequency_penalty must be")])
def test_bad_penalties_are_refused(kw, says, tmp_path):
    engine, _ = engine_for("none", tmp_path)
    with pytest.raises(InvalidArgumentError, match=__import__("re").escape(says)):
        engine.stream(ASK, **kw)


def test_the_ends_of_openai_s_range_are_taken():
    assert [check_penalty(v, "presence_penalty") for v in (-2, 2.0, None)] == [-2.0, 2.0, 0.0]
    with pytest.raises(InvalidArgumentError, match=r"in \[-2, 2\]"):
        check_penalty(-2.0001, "presence_penalty")


def test_penalties_through_the_openai_client():
    engine = tiny_engine(drafter="ngram")
    with running_server(engine, model_id="t") as (url, _):
        client = openai_client(url)
        r = client.chat.completions.create(model="t", messages=ASK, max_tokens=20, frequency_penalty=1.5,
                                           presence_penalty=0.5)
        assert r.choices[0].message.content == engine.generate(ASK, max_tokens=20, frequency_penalty=1.5,
                                                               presence_penalty=0.5).text
        assert r.choices[0].message.content != engine.generate(ASK, max_tokens=20).text


@pytest.mark.parametrize("drafter", ["none", "ngram", "model", "eagle"])
@pytest.mark.parametrize("options", [{}, {"num_draft": 3}, {"temperature": 0.8, "seed": 3}])
def test_repetition_penalty_is_mlx_lm_s_row_by_row(drafter, options, tmp_path):
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_logits_processors

    engine, target = engine_for(drafter, tmp_path)
    rep = dict(repetition_penalty=4.0, repetition_context_size=2)  # text that cycles: drafts to accept
    plain = engine.generate(ASK, max_tokens=30, speculative=False, **rep, **options)
    engine.reset()
    fast = engine.generate(ASK, max_tokens=30, **rep, **options)
    if not (drafter in ("model", "eagle") and "temperature" in options):
        assert fast.tokens == plain.tokens
    if "temperature" not in options:
        ids = encode_prompt(ASK, engine.tokenizer, engine.vocab_size)
        theirs = [int(t) for (t, _), _ in zip(generate_step(mx.array(ids), target, max_tokens=30,
                                                            logits_processors=make_logits_processors(**rep)),
                                              range(30))]
        assert plain.tokens == theirs[:len(plain.tokens)]  # mlx-lm's own, prompt in the window included
        engine.reset()
        assert engine.generate(ASK, max_tokens=30, **options).tokens != plain.tokens  # it did something
        if drafter in ("ngram", "eagle") and "num_draft" in options:  # (a fixed k: auto varies with timings;
            assert fast.stats.accepted > 0  # the draft model, an unpenalised copy, misses every draft there)


def test_repetition_penalty_through_the_server():
    engine = tiny_engine(drafter="ngram")
    with running_server(engine, model_id="t") as (url, _):
        client = openai_client(url)
        r = client.chat.completions.create(model="t", messages=ASK, max_tokens=20,
                                           extra_body={"repetition_penalty": 1.5, "repetition_context_size": 8})
        assert r.choices[0].message.content == engine.generate(ASK, max_tokens=20, repetition_penalty=1.5,
                                                               repetition_context_size=8).text

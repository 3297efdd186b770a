"""logit_bias: added to the target's logits at every row of every pass (chains, trees, plain steps),
so the output is the biased target's, whatever drafts."""

import mlx.core as mx
import pytest

import tiny
from mlxspec.engine import Engine
from mlxspec.errors import InvalidArgumentError
from mlxspec.prompts import encode_prompt
from serve_helpers import openai_client, running_server, tiny_engine

ASK = [{"role": "user", "content": "Tell me a long story about rivers and the sea, again and again."}]


def engine_for(drafter, tmp_path):
    target = tiny.make_llama(0, tie_embeddings=False)
    kw = {}
    if drafter == "model":
        kw["draft_model"] = tiny.make_llama(1, layers=1, tie_embeddings=False)
    if drafter == "eagle":
        kw["eagle_head"] = tiny.make_eagle_head(target, tmp_path / "head", copy=True)
    return Engine(target, tiny.make_tokenizer(), drafter=drafter, **kw), target


def banned_and_boosted(engine):
    """A bias that changes this model's greedy answer: its two most frequent tokens banned, a third nudged."""
    free = engine.generate(ASK, max_tokens=40).tokens
    engine.reset()
    common = sorted(set(free), key=free.count, reverse=True)
    return {str(common[0]): -100, common[1]: -100.0, str(common[2]): 3.5}, free


@pytest.mark.parametrize("drafter", ["none", "ngram", "model", "eagle"])
@pytest.mark.parametrize("options", [{}, {"num_draft": 3, "tree": "off"}, {"temperature": 0.8, "seed": 7}])
def test_output_is_the_biased_target_s(drafter, options, tmp_path):
    engine, target = engine_for(drafter, tmp_path)
    bias, free = banned_and_boosted(engine)
    plain = engine.generate(ASK, max_tokens=40, logit_bias=bias, speculative=False, **options)
    engine.reset()
    fast = engine.generate(ASK, max_tokens=40, logit_bias=bias, **options)
    banned = {int(k) for k, v in bias.items() if v == -100}
    assert not banned & set(fast.tokens) and not banned & set(plain.tokens) and plain.tokens != free
    if not (drafter in ("model", "eagle") and "temperature" in options):  # else a sample from the same law
        assert fast.tokens == plain.tokens
    if "temperature" not in options:  # greedy: every token is the argmax of the target's biased logits, teacher-forced
        ids = encode_prompt(ASK, engine.tokenizer, engine.vocab_size)
        logits = target(mx.array(ids + fast.tokens)[None])[0, len(ids) - 1:-1].astype(mx.float32)
        row = mx.zeros((engine.vocab_size,))
        for k, v in bias.items():
            row[int(k)] = -mx.inf if v == -100 else v
        assert mx.argmax(logits + row, axis=-1).tolist() == fast.tokens
        if drafter in ("ngram", "eagle") and "num_draft" in options:  # (a fixed k: auto varies with timings;
            # the draft model, another random model, misses every draft)
            assert fast.stats.accepted > 0


def test_plus_100_selects_the_token(tmp_path):
    engine, _ = engine_for("ngram", tmp_path)
    a = ord("a") + 3
    r = engine.generate(ASK, max_tokens=12, logit_bias={a: 100}, temperature=1.0, seed=1)
    assert r.tokens == [a] * 12 and r.stats.accepted > 0  # the n-gram drafter drafts the repeats


@pytest.mark.parametrize("bias, says", [
    ([5], "must be an object"),
    ({"x": 1}, "token ids (in [0, 259))"),
    ({"-3": 1}, "token ids (in [0, 259))"),
    ({259: 1}, "token ids (in [0, 259))"),
    ({"5": 100.5}, "logit_bias[5] must be a number in [-100, 100]"),
    ({"5": "high"}, "must be a number"),
    ({"5": True}, "must be a number"),
])
def test_bad_biases_are_refused(bias, says, tmp_path):
    engine, _ = engine_for("none", tmp_path)
    with pytest.raises(InvalidArgumentError, match=__import__("re").escape(says)):
        engine.stream(ASK, logit_bias=bias)


def test_logit_bias_through_the_openai_client():
    engine = tiny_engine(drafter="ngram")
    with running_server(engine, model_id="t") as (url, _):
        client = openai_client(url)
        free = engine.generate(ASK, max_tokens=20).tokens
        engine.reset()
        ban = {str(t): -100 for t in set(free[:3])}
        r = client.chat.completions.create(model="t", messages=ASK, max_tokens=20, logit_bias=ban)
        text = r.choices[0].message.content
        assert text and not set(engine.tokenizer.encode(text, add_special_tokens=False)) & {int(t) for t in ban}
        assert text == engine.generate(ASK, max_tokens=20, logit_bias=ban).text
        r = client.completions.create(model="t", prompt="The sea", max_tokens=6, logit_bias={str(ord("z") + 3): 100})
        assert r.choices[0].text == "zzzzzz"

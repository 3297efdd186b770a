"""Every bad input gets a clear error naming the value and what is allowed; nothing is left half-done."""

import math

import mlx.core as mx
import pytest

import tiny
from mlxspec import Engine
from mlxspec.errors import (
    ContextLengthError,
    IncompatibleModelsError,
    InvalidArgumentError,
    MlxSpecError,
    NumericalError,
)

PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def engine():
    return Engine(tiny.make_llama(1), tiny.make_tokenizer(), tiny.make_llama(2, layers=1))


@pytest.mark.parametrize("kwargs,match", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"max_tokens": -1}, r"got -1 \(mlx-lm.s -1, no limit, is not taken"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"min_p": 1.0}, "min_p"),
    ({"min_p": -0.2}, "min_p"),
    ({"num_draft": -1}, "num_draft"),
    ({"num_draft": 10_000}, "num_draft"),
    ({"num_draft": "many"}, "num_draft"),
    ({"seed": -5}, "seed"),
    ({"stop": 5}, "stop"),
    ({"stop": [""]}, "stop string 0 is empty"),  # once dropped quietly: asked for, and nothing happened
    ({"stop": ["ok", ""]}, "stop string 1 is empty"),
    ({"stop": ""}, "stop string 0 is empty"),
    ({"drafter": "tree"}, "drafter must be one of model, eagle, ngram, none, got 'tree'"),  # no drafter at all
    ({"drafter": "EAGLE"}, "drafter must be one of"),
    ({"drafter": "tree", "speculative": False}, "drafter"),  # checked though plain decoding ignores it
    ({"drafter": "eagle"}, "not available on this engine"),  # no head
])
def test_bad_generation_arguments(engine, kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match) as info:
        engine.stream(PROMPT, **kwargs)  # raised at call time, before any work
    assert isinstance(info.value, ValueError) and isinstance(info.value, MlxSpecError)


@pytest.mark.parametrize("prompt,match", [
    ("", "empty"),
    ([], "empty"),
    ([5, 99_999], "outside the vocabulary"),
    ([5, -1], "outside the vocabulary"),
    ([5, "x"], "integers"),
    ([True, False], "prompt token 0 is True; token ids must be integers"),  # bools are ints to Python only
    ([{"role": "user"}], "content"),
    (3.14, "prompt must be"),
    (mx.array([[5, 6]]), r"a list \(or 1-D array\) of token ids .*got array of shape \(1, 2\)"),  # a batch
    ("a\ud800", "not valid Unicode text"),
    ([{"role": "user", "content": "\udc00"}], "message 0's content is not valid Unicode"),
    ([{"role": "user", "content": None}], "message 0's content must be a string.* got None$"),  # not 'None'
    ([{"role": "user", "content": 5}], "got 5$"),
    ([{"role": "system", "content": "be brief"}, {"role": "user", "content": 5}], "message 1's content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], "parts, got"),
])
def test_bad_prompts(engine, prompt, match):
    with pytest.raises(InvalidArgumentError, match=match):
        engine.generate(prompt, max_tokens=2)


def test_text_prompt_without_tokenizer():
    e = Engine(tiny.make_llama(1))
    with pytest.raises(InvalidArgumentError, match="tokenizer"):
        e.generate("hello")


def test_engine_construction_errors():
    t = tiny.make_llama(1)
    with pytest.raises(InvalidArgumentError, match="drafter"):
        Engine(t, drafter="medusa")
    with pytest.raises(InvalidArgumentError, match="draft_model"):
        Engine(t, drafter="model")
    with pytest.raises(InvalidArgumentError, match="num_draft"):
        Engine(t, num_draft=-2)
    with pytest.raises(InvalidArgumentError, match="max_kv_size"):
        Engine(t, max_kv_size=2)
    for bad in (0, -1, "x", True):
        with pytest.raises(InvalidArgumentError, match="prefill_step must be an integer >= 1"):
            Engine(t, prefill_step=bad)
    with pytest.raises(InvalidArgumentError, match=r"target_model must be an mlx-lm model \(as mlx_lm.load returns\), "
                                                   r"got str; to load one by name or path, use mlxspec.load\('demo'\)"):
        Engine("demo")
    with pytest.raises(InvalidArgumentError, match=r"draft_model must be an mlx-lm model .*, got int$"):
        Engine(t, draft_model=3)


@pytest.mark.parametrize("kwargs,match", [({"num_draft": 99}, "num_draft"), ({"tree": 0}, "tree"),
                                          ({"lookup": "yes"}, "lookup"), ({"drafter": object()}, "drafter")])
def test_load_checks_the_engine_settings_before_loading(kwargs, match, tmp_path):
    import mlxspec

    # A target that does not exist: a setting checked before the load is what is reported.
    with pytest.raises(InvalidArgumentError, match=match):
        mlxspec.load(str(tmp_path / "no-such-model"), **kwargs)


@pytest.mark.parametrize("width", [tiny.VOCAB - 1, tiny.VOCAB + 64])
def test_draft_with_other_vocabulary_width_is_incompatible(width):
    with pytest.raises(IncompatibleModelsError, match="width"):
        Engine(tiny.make_llama(1), None, tiny.make_llama(2, vocab_size=width))


def test_prompt_longer_than_context():
    t = tiny.make_llama(1)
    t.args.max_position_embeddings = 16
    e = Engine(t)
    with pytest.raises(ContextLengthError, match="has 20 tokens but the model's context is 16, so at most 15 fit"):
        e.generate(list(range(5, 25)))
    with pytest.raises(ContextLengthError, match="has 16 tokens .* at most 15 fit"):  # as long as the context
        e.generate(list(range(5, 21)))
    # With a sliding window the same prompt is fine.
    assert len(Engine(t, max_kv_size=8).generate(list(range(5, 25)), max_tokens=3).tokens) == 3
    # Generation stops at the context's end with finish_reason "length".
    r = e.generate(list(range(5, 15)), max_tokens=50)
    assert r.finish_reason == "length" and len(r.tokens) == 6
    # A window as wide as the context never slides before it is full: the context still bounds.
    wide = Engine(t, max_kv_size=16)
    with pytest.raises(ContextLengthError, match="below it"):
        wide.generate(list(range(5, 25)))
    assert len(wide.generate(list(range(5, 15)), max_tokens=50).tokens) == 6


class Poisoned:
    """A model wrapper that returns NaN logits while `on` is set (`poison`: what the logits are
    multiplied by then), and its logits plus `shift` always."""

    def __init__(self, model, poison=mx.nan, shift: float = 0.0):
        self.model, self.on, self.poison, self.shift = model, False, poison, shift
        self.args, self.layers = model.args, model.layers

    def make_cache(self):
        return self.model.make_cache()

    def parameters(self):
        return self.model.parameters()

    def __call__(self, x, cache=None):
        out = self.model(x, cache=cache) + self.shift
        return out * self.poison if self.on else out


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("poison", [mx.nan, mx.inf])
def test_nan_logits_raise_and_engine_recovers(temperature, poison):
    t = tiny.make_llama(1)
    kw = dict(max_tokens=10, temperature=temperature, seed=3)
    fresh = Engine(t, None, t, num_draft=3).generate(PROMPT, **kw).tokens
    p = Poisoned(t, poison)
    e = Engine(p, None, t, num_draft=3)
    gen = e.stream(PROMPT, **kw)
    first = next(gen)
    p.on = True
    with pytest.raises(NumericalError, match="NaN"):
        for _ in gen:
            pass
    p.on = False
    assert first.token == fresh[0]
    assert e.generate(PROMPT, **kw).tokens == fresh


@pytest.mark.parametrize("speculative", [False, True])
def test_float16_logits_that_add_up_past_its_range_are_finite(speculative):
    """Sampled rounds check a whole row of logits at once by its sum. In float16 a vocabulary of
    ordinary logits adds up past 65504 (here 259 logits near 1000): every sampled float16 request
    stopped before its first token, as if the target had produced infinite logits."""
    t = tiny.make_llama(1, dtype=mx.float16)
    shifted = Poisoned(t, shift=1000.0)  # the same distribution: a softmax ignores a shift
    assert shifted(mx.array([PROMPT])).dtype == mx.float16
    assert mx.sum(shifted(mx.array([PROMPT]))[0, -1]).item() == math.inf
    e = Engine(shifted, None, tiny.make_llama(2, layers=1, dtype=mx.float16), num_draft=3)
    out = e.generate(PROMPT, max_tokens=12, temperature=0.8, seed=1, speculative=speculative)
    assert len(out.tokens) == 12 and out.finish_reason == "length"
    assert out.tokens == e.generate(PROMPT, max_tokens=12, temperature=0.8, seed=1, speculative=not speculative).tokens


def test_text_parts_read_as_the_joined_string():
    from mlxspec.prompts import encode_prompt

    tok = tiny.make_tokenizer()
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]}]
    joined = [{"role": "user", "content": "hello\nworld"}]
    assert encode_prompt(parts, tok, tiny.VOCAB) == encode_prompt(joined, tok, tiny.VOCAB)
    assert parts[0]["content"][0]["text"] == "hello"  # the caller's messages are not changed


def test_numpy_scalars_are_taken_as_python_numbers(engine):
    import numpy as np

    from mlxspec.sampling import SamplingParams

    p = SamplingParams(np.float32(0.5), np.float64(0.9), np.int64(3), np.float32(0.0))
    assert p == SamplingParams(0.5, 0.9, 3, 0.0) and type(p.temperature) is float and type(p.top_k) is int
    numpy_args = engine.generate("hello", max_tokens=4, temperature=np.float32(0.5), top_k=np.int64(5), seed=1)
    assert numpy_args.tokens == engine.generate("hello", max_tokens=4, temperature=0.5, top_k=5, seed=1).tokens
    with pytest.raises(InvalidArgumentError, match="top_k must be an integer"):
        SamplingParams(0.5, 1.0, np.float32(3.0), 0.0)

"""Embeddings (`mlxspec.embed`, `Engine.embed`): the pooled final hidden states of each input,
whatever the batching, padding and chunking; llama.cpp's normalizations; inputs checked."""

import threading

import mlx.core as mx
import numpy as np
import pytest

import tiny
from mlxspec.backbone import split_model
from mlxspec.embed import MAX_INPUTS, encode_inputs, normalized, pooled
from mlxspec.engine import Engine
from mlxspec.errors import ContextLengthError, EngineBusyError, InvalidArgumentError

LENGTHS = (1, 7, 3, 20, 12, 2, 20)  # unsorted, with a tie: the answer keeps the inputs' order


def _inputs(seed=0, lengths=LENGTHS):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, tiny.VOCAB, n).tolist() for n in lengths]


def _alone(backbone, ids, pooling):
    """One input through the backbone in one pass, no cache, no padding."""
    h = backbone(mx.array([ids], dtype=mx.uint32)).astype(mx.float32)[0]
    return np.array(h.mean(axis=0) if pooling == "mean" else h[-1])


@pytest.mark.parametrize("make", [tiny.make_llama, tiny.make_gemma3, tiny.make_qwen2, tiny.make_gemma2, tiny.make_gpt_oss,
                                  tiny.make_granite, tiny.make_cohere],
                         ids=["llama", "gemma3-sliding-window", "qwen2", "gemma2-softcap", "gpt-oss-sinks", "granite",
                              "cohere"])
@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_batched_padded_chunked_rows_are_each_input_alone(make, pooling):
    model = make(0)
    backbone, _ = split_model(model)
    inputs = _inputs()
    # 40 padded tokens per batch: several batches, padded rows; 6 columns per pass: chunks (and,
    # for gemma3, a window of 8 that wraps within a row)
    got = np.array(pooled(backbone, model, inputs, pooling, batch_tokens=40, step=6))
    want = np.stack([_alone(backbone, ids, pooling) for ids in inputs])
    assert got.shape == (len(inputs), 64)
    np.testing.assert_allclose(got, want, rtol=tiny.float32_tol(), atol=tiny.float32_tol() * np.abs(want).max())
    assert not np.allclose(got[3], got[6])  # two inputs of the same length are not mixed up


def test_mean_and_last_differ_and_last_of_one_token_is_the_mean():
    model = tiny.make_llama(1)
    backbone, _ = split_model(model)
    inputs = _inputs(1, (1, 9))
    mean = np.array(pooled(backbone, model, inputs, "mean"))
    last = np.array(pooled(backbone, model, inputs, "last"))
    np.testing.assert_array_equal(mean[0], last[0])
    assert np.abs(mean[1] - last[1]).max() > 1e-2


@pytest.mark.parametrize("p", [-1, 0, 1, 2, 3])
def test_normalized_as_llama_cpp(p):
    rng = np.random.default_rng(p + 5)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    x[2] = 0  # a zero vector stays zero, at every p
    got = np.array(normalized(mx.array(x), p))
    if p == -1:
        want = x
    else:
        norm = np.abs(x).max(axis=1) / 32760.0 if p == 0 else (np.abs(x) ** p).sum(axis=1) ** (1.0 / p)
        want = np.where(norm[:, None] > 0, x / np.where(norm > 0, norm, 1)[:, None], 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.isnan(got).any() and (got[2] == 0).all()
    if p == 2:
        np.testing.assert_allclose(np.linalg.norm(got[[0, 1, 3]], axis=1), 1, rtol=1e-6)


def test_the_engine_encodes_text_as_prompts_and_answers_unit_vectors_by_default():
    engine = Engine(tiny.make_llama(2), tiny.make_tokenizer())
    texts = ["hello", "a longer sentence to embed", "hi"]
    out = engine.embed(texts)
    ids = [engine.tokenizer.encode(t) for t in texts]
    assert out.tokens == [len(i) for i in ids]
    np.testing.assert_allclose(np.linalg.norm(np.array(out.vectors), axis=1), 1, rtol=1e-6)
    raw = engine.embed(ids, normalize=-1)  # token ids give the same vectors, here not normalized
    backbone, _ = split_model(engine.target_model)
    want = np.stack([_alone(backbone, i, "mean") for i in ids])
    np.testing.assert_allclose(np.array(raw.vectors), want, rtol=tiny.float32_tol(), atol=1e-6)
    one = engine.embed(ids[1], pooling="last", normalize=-1)  # one token list is one input
    assert one.vectors.shape == (1, 64)
    np.testing.assert_allclose(np.array(one.vectors[0]), _alone(backbone, ids[1], "last"),
                               rtol=tiny.float32_tol(), atol=1e-6)


def test_embedding_between_two_events_of_a_stream_leaves_its_caches_alone():
    engine = Engine(tiny.make_llama(3, tie_embeddings=False), tiny.make_tokenizer(), drafter="ngram")
    plain = Engine(engine.target_model, engine.tokenizer, drafter="ngram").generate("once upon", max_tokens=24)
    stream = engine.stream("once upon", max_tokens=24)
    tokens = [next(stream).token for _ in range(5)]
    engine.embed(["something else entirely", "and more"])
    tokens += [ev.token for ev in stream]
    assert tokens == plain.tokens


def test_a_cancel_stops_it_between_two_chunks():
    class After:  # set once it has been asked `n` times
        def __init__(self, n):
            self.n, self.asked = n, 0

        def is_set(self):
            self.asked += 1
            return self.asked > self.n

    engine = Engine(tiny.make_llama(4), tiny.make_tokenizer(), prefill_step=4)
    cancel = After(2)
    assert engine.embed([list(range(3, 40))], cancel=cancel) is None
    assert cancel.asked == 3  # two chunks ran, the third was not started
    assert engine.embed("still works").vectors.shape == (1, 64)


def test_another_thread_generating_makes_it_busy_not_interleaved():
    engine = Engine(tiny.make_llama(5), tiny.make_tokenizer())
    stream = engine.stream("hello", max_tokens=8)
    next(stream)  # this thread now holds the engine, suspended between two events
    engine.occupancy.thread = holder = threading.Thread(target=threading.Event().wait, args=(5,), daemon=True)
    holder.start()
    try:
        with pytest.raises(EngineBusyError, match="another thread"):
            engine.embed("x")
    finally:
        engine.occupancy.thread = None
        stream.close()


@pytest.mark.parametrize("inputs, says", [
    ([], "non-empty"), ("", "input is empty"), (["ok", ""], "input 1 is empty"), ([[]], "input is empty"),
    ([[3, 4], [5, 9999]], "input 1 token id 9999 is outside the vocabulary"), ([[3, 1.5]], "token 1 is 1.5"),
    ([3, "x"], "input 0 must be a string or a list of token ids, got 3"), (5, "got 5"),
    ({"input": "x"}, "got {'input': 'x'}"), (["a\ud800"], "not valid Unicode"),
])
def test_bad_inputs_are_refused_naming_what_is_wrong(inputs, says):
    with pytest.raises(InvalidArgumentError, match=says.replace("(", r"\(").replace("{", r"\{")):
        encode_inputs(inputs, tiny.make_tokenizer(), tiny.VOCAB)


def test_too_many_inputs_and_bad_options_are_refused():
    tok = tiny.make_tokenizer()
    with pytest.raises(InvalidArgumentError, match=f"at most {MAX_INPUTS}"):
        encode_inputs(["a"] * (MAX_INPUTS + 1), tok, tiny.VOCAB)
    assert len(encode_inputs(["a"] * MAX_INPUTS, tok, tiny.VOCAB)) == MAX_INPUTS
    engine = Engine(tiny.make_llama(6), tok)
    with pytest.raises(InvalidArgumentError, match="pooling must be one of mean, last, got 'cls'"):
        engine.embed("x", pooling="cls")
    for bad in (-2, 2.0, True, "2"):
        with pytest.raises(InvalidArgumentError, match="normalize must be an integer >= -1"):
            engine.embed("x", normalize=bad)
    with pytest.raises(InvalidArgumentError, match="no tokenizer"):
        Engine(tiny.make_llama(6)).embed("text")


def test_an_input_past_the_context_is_refused_or_cut_to_its_start():
    tok = tiny.make_tokenizer()
    ids = list(range(3, 23))
    with pytest.raises(ContextLengthError, match="input 1 has 20 tokens, more than the model's context of 16"):
        encode_inputs([[3], ids], tok, tiny.VOCAB, context=16)
    assert encode_inputs([[3], ids], tok, tiny.VOCAB, context=16, truncate=True) == [[3], ids[:16]]
    engine = Engine(tiny.make_llama(7), tok)
    engine.context = 16
    cut = engine.embed(ids, truncate=True, normalize=-1)
    assert cut.tokens == [16]
    np.testing.assert_allclose(np.array(cut.vectors), np.array(engine.embed(ids[:16], normalize=-1).vectors))

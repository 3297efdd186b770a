"""prompt_logprobs: every prompt token's log-probability given the ones before it, from the prefill."""

import mlx.core as mx
import pytest

import tiny
from mlxspec.errors import InvalidArgumentError
from mlxspec.prompts import encode_prompt
from test_logprobs import ASK, engine_for

TOP = 3


def teacher_forced(target, ids):
    """log-softmax of the target's logits over `ids` in one pass: row r predicts ids[r + 1]."""
    logits = target(mx.array(ids)[None])[0].astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def check_against(target, ids, scored, top=TOP):
    ref = teacher_forced(target, ids)
    tol = tiny.float32_tol(1e-4) * 10  # log-softmax of logits of magnitude ~10
    assert [t for t, _, _ in scored] == ids
    assert scored[0][1] is None and scored[0][2] == []
    got = mx.array([lp for _, lp, _ in scored[1:]])
    want = mx.take_along_axis(ref[:-1], mx.array(ids[1:])[:, None], axis=-1)[:, 0]
    assert mx.allclose(got, want, atol=tol).item(), mx.abs(got - want).max().item()
    best = mx.sort(ref[:-1], axis=-1)[:, ::-1][:, :top]
    for r, (_, _, choices) in enumerate(scored[1:]):
        assert len(choices) == top
        assert [v for _, v in choices] == sorted((v for _, v in choices), reverse=True)
        assert mx.allclose(mx.array([v for _, v in choices]), best[r], atol=tol).item()
        assert all(abs(ref[r, t].item() - v) <= tol for t, v in choices)


@pytest.mark.parametrize("drafter", ["none", "ngram", "model", "eagle"])
def test_each_prompt_token_s_logprob_is_the_target_s_teacher_forced(drafter, tmp_path):
    engine, target = engine_for(drafter, tmp_path)
    r = engine.generate(ASK, max_tokens=6, prompt_logprobs=TOP)
    check_against(target, encode_prompt(ASK, engine.tokenizer, engine.vocab_size), r.prompt_logprobs)


def test_a_prompt_over_several_chunks_and_one_already_cached(tmp_path):
    """Chunk boundaries line up (row r of chunk c predicts the token after it), and a prompt the
    caches hold (the same request again) is still scored whole, not from the cache."""
    engine, target = engine_for("ngram", tmp_path, prefill_step=7)
    ids = encode_prompt(ASK, engine.tokenizer, engine.vocab_size)
    assert len(ids) > 3 * 7
    first = engine.generate(ids, max_tokens=4, prompt_logprobs=TOP)
    again = engine.generate(ids, max_tokens=4, prompt_logprobs=TOP)
    check_against(target, ids, first.prompt_logprobs)
    check_against(target, ids, again.prompt_logprobs)
    assert again.stats.prefilled_tokens == len(ids)  # nothing taken from the cache
    assert engine.generate(ids, max_tokens=4).stats.prefilled_tokens == 1  # and the cache is whole after it


def test_the_answer_equals_one_without_them_and_they_equal_the_answer_s_own_logprobs(tmp_path):
    """Asking for them changes no token; fed back as a prompt, the answer's tokens score what
    generation reported for them."""
    engine, _ = engine_for("eagle", tmp_path)
    # A fixed k: every round drafts, whatever the cost model would make of this machine's timings
    plain = engine.generate(ASK, max_tokens=30, logprobs=0, num_draft=3)
    engine.reset()
    scored = engine.generate(ASK, max_tokens=30, logprobs=0, prompt_logprobs=0, num_draft=3)
    assert scored.tokens == plain.tokens and scored.stats.accepted > 0
    ids = encode_prompt(ASK, engine.tokenizer, engine.vocab_size)
    back = engine.generate(ids + plain.tokens, max_tokens=1, prompt_logprobs=0).prompt_logprobs
    got = mx.array([lp for _, lp, _ in back[len(ids):]])
    assert mx.allclose(got, mx.array(plain.logprobs), atol=tiny.float32_tol() * 10).item()


def test_only_the_first_event_carries_them_and_a_one_token_prompt_has_none(tmp_path):
    engine, _ = engine_for("none", tmp_path)
    events = list(engine.stream(ASK, max_tokens=5, prompt_logprobs=0))
    assert events[0].prompt_logprobs is not None and all(ev.prompt_logprobs is None for ev in events[1:])
    assert engine.generate([5], max_tokens=2, prompt_logprobs=2).prompt_logprobs == [(5, None, [])]
    assert engine.generate(ASK, max_tokens=2).prompt_logprobs is None


@pytest.mark.parametrize("bad", [-1, 1001, 1.5, True, "3"])
def test_bad_prompt_logprobs_are_refused(bad, tmp_path):
    engine, _ = engine_for("none", tmp_path)
    with pytest.raises(InvalidArgumentError, match="prompt_logprobs must be None"):
        engine.generate(ASK, max_tokens=2, prompt_logprobs=bad)

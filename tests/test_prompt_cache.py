"""The engine's prompt cache: interleaved conversations come back to their own caches, and change no output."""

import mlx.core as mx
import pytest

import tiny
from mlxspec.engine import Engine
from mlxspec.errors import InvalidArgumentError
from mlxspec.prompt_cache import MIN_PARK
from mlxspec.sequence import Sequence

CHAT = [{"role": "user", "content": "Tell me about the rivers of Europe, their sources and their mouths. " * 3}]
SIDE = [{"role": "user", "content": "Write a short title for a conversation about geography and maps. " * 2}]


def engine_for(drafter, size, tmp_path, **kw):
    target = tiny.make_llama(0, tie_embeddings=False)
    if drafter == "model":
        kw["draft_model"] = tiny.make_llama(1, layers=1, tie_embeddings=False)
    if drafter == "eagle":
        kw["eagle_head"] = tiny.make_eagle_head(target, tmp_path / "head")
    return Engine(target, tiny.make_tokenizer(), drafter=drafter, prompt_cache_size=size, **kw)


def interleave(engine, turns=3, **options):
    """A chat that grows by a turn each time, with a side request between turns: (text, prefilled) of each."""
    out, chat = [], list(CHAT)
    for turn in range(turns):
        r = engine.generate(chat, max_tokens=16, **options)
        out.append((r.text, r.stats.prefilled_tokens))
        chat += [{"role": "assistant", "content": r.text}, {"role": "user", "content": f"And then {turn}?"}]
        r = engine.generate(SIDE + [{"role": "user", "content": f"Variant {turn}."}], max_tokens=8, **options)
        out.append((r.text, r.stats.prefilled_tokens))
    return out


@pytest.mark.parametrize("drafter", ["ngram", "model", "eagle", "none"])
@pytest.mark.parametrize("window", [None, 96])
def test_interleaved_conversations_reuse_their_caches_and_answer_the_same(drafter, window, tmp_path):
    plain = interleave(engine_for(drafter, 0, tmp_path, max_kv_size=window))
    engine = engine_for(drafter, 2, tmp_path, max_kv_size=window)
    cached = interleave(engine)
    assert [text for text, _ in cached] == [text for text, _ in plain]
    # Both first requests prefill in full. After them, without the cache every request prefills
    # nearly all of its prompt again; with it, only what its conversation added.
    assert [n for _, n in cached[:2]] == [n for _, n in plain[:2]]
    if window is None:
        for (_, n_cached), (_, n_plain) in zip(cached[2:], plain[2:]):
            assert n_cached < 64 < 2 * 64 < n_plain
    else:  # a window that wrapped cannot roll back: the conversation starts over, as without the cache
        assert sum(n for _, n in cached[2:]) <= sum(n for _, n in plain[2:])
    assert engine.last_stats.parked_kv_bytes == engine.prompt_cache.nbytes > 0


def test_sampled_answers_are_the_same_with_and_without_the_cache(tmp_path):
    options = dict(temperature=0.9, seed=7, num_draft=3)
    plain = interleave(engine_for("model", 0, tmp_path), **options)
    cached = interleave(engine_for("model", 3, tmp_path), **options)
    assert [t for t, _ in cached] == [t for t, _ in plain]
    assert sum(n for _, n in cached) < sum(n for _, n in plain)


def prompt(i, n=MIN_PARK + 40):
    """Conversation i: token ids no other conversation's start with."""
    return [3 + i] + [3 + (7 * j + i) % 200 for j in range(n)]


def first_tokens(engine):
    return [slot["target"].tokens[0] for slot in engine.prompt_cache.parked]


def test_the_least_recently_used_leaves_first():
    engine = Engine(tiny.make_llama(0), tiny.make_tokenizer(), drafter="none", prompt_cache_size=2)
    for i in range(3):  # each request parks the one before it
        engine.generate(prompt(i), max_tokens=2)
    assert first_tokens(engine) == [3, 4]
    assert engine.prompt_cache.evicted == 0
    engine.generate(prompt(3), max_tokens=2)  # conversation 0 leaves
    assert first_tokens(engine) == [4, 5] and engine.prompt_cache.evicted == 1
    r = engine.generate(prompt(1) + [9, 9], max_tokens=2)  # 1 comes back: swapped in, 3 parked in its place
    assert r.stats.prefilled_tokens < 5 and first_tokens(engine) == [5, 6]
    r = engine.generate(prompt(0), max_tokens=2)  # gone: prefilled in full
    assert r.stats.prefilled_tokens == len(prompt(0))


def test_short_histories_and_prefixes_of_others_are_not_kept():
    engine = Engine(tiny.make_llama(0), tiny.make_tokenizer(), drafter="none", prompt_cache_size=4)
    cache = engine.prompt_cache
    seq = Sequence(engine.target_model, max_kv_size=None, headroom=8)
    seq.prefill(prompt(0, MIN_PARK - 2))
    cache.park({"target": seq.copy_state()})
    assert cache.parked == []  # shorter than MIN_PARK: cheaper to prefill again than to keep
    seq.prefill([5] * 10)
    cache.park({"target": seq.copy_state()})
    seq.prefill([6] * 10)
    cache.park({"target": seq.copy_state()})  # the one before is a prefix of this one: dropped
    assert [len(slot["target"].tokens) for slot in cache.parked] == [len(prompt(0, MIN_PARK - 2)) + 20]
    engine.reset()
    assert cache.parked == [] and cache.nbytes == 0


def test_a_copied_state_is_not_changed_by_what_the_sequence_does_next():
    model = tiny.make_llama(0)
    for window in (None, 24):
        seq = Sequence(model, max_kv_size=window, headroom=8)
        seq.prefill(prompt(0, 40))
        copy = seq.copy_state()
        expected = seq.forward([5, 6, 7])
        seq.rollback(3)
        seq.forward([9] * 12)  # past the window: its ring buffer wraps
        seq.rollback(4)
        seq.forward([11, 12])
        other = Sequence(model, max_kv_size=window, headroom=8)
        other.put_state(copy)
        assert other.tokens == prompt(0, 40) and mx.array_equal(other.forward([5, 6, 7]), expected)


@pytest.mark.parametrize("size", [-1, 1.5, True, "2"])
def test_a_bad_size_is_refused(size):
    with pytest.raises(InvalidArgumentError, match="prompt_cache_size must be an integer >= 0"):
        Engine(tiny.make_llama(0), tiny.make_tokenizer(), prompt_cache_size=size)


def test_a_byte_bound_keeps_the_most_recent_that_fit():
    engine = Engine(tiny.make_llama(0), tiny.make_tokenizer(), drafter="none", prompt_cache_size=8)
    for i in range(3):
        engine.generate(prompt(i), max_tokens=2)
    one = engine.prompt_cache.parked[-1]["target"].nbytes
    assert len(engine.prompt_cache.parked) == 2 and engine.prompt_cache.nbytes == 2 * one
    bounded = Engine(tiny.make_llama(0), tiny.make_tokenizer(), drafter="none", prompt_cache_size=8,
                     prompt_cache_bytes=one + one // 2)
    for i in range(3):
        bounded.generate(prompt(i), max_tokens=2)
    assert first_tokens(bounded) == [4] and bounded.prompt_cache.nbytes == one
    assert bounded.prompt_cache.evicted == 1 and engine.prompt_cache.evicted == 0
    with pytest.raises(InvalidArgumentError, match="prompt_cache_bytes must be None or an integer >= 0"):
        Engine(tiny.make_llama(0), tiny.make_tokenizer(), prompt_cache_bytes=-5)


def test_a_server_s_interleaved_conversations_report_their_cached_tokens():
    from serve_helpers import openai_client, running_server, scrape_metrics

    engine = Engine(tiny.make_llama(0, tie_embeddings=False), tiny.make_tokenizer(), drafter="ngram",
                    prompt_cache_size=4)
    with running_server(engine, model_id="t") as (url, _):
        client = openai_client(url)
        chat, side = list(CHAT), list(SIDE)
        first = client.chat.completions.create(model="t", messages=chat, max_tokens=8)
        client.chat.completions.create(model="t", messages=side, max_tokens=8)
        chat += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And then?"}]
        again = client.chat.completions.create(model="t", messages=chat, max_tokens=8)
        cached = again.usage.prompt_tokens_details.cached_tokens
        assert cached >= first.usage.prompt_tokens and again.usage.prompt_tokens - cached < 64
        m = scrape_metrics(url)  # what an operator sizing --prompt-cache-size reads
        assert m["mlxspec_prompt_cache_parked"] == len(engine.prompt_cache.parked) >= 1
        assert m["mlxspec_prompt_cache_bytes"] == engine.prompt_cache.nbytes > 0
        assert m["mlxspec_prompt_cache_evictions_total"] == 0


@pytest.mark.parametrize("next_request", [{}, {"prompt_logprobs": 0}])
def test_caches_an_interrupted_pass_left_half_written_are_never_parked(next_request):
    """Whether the next request swaps conversations or computes its prompt whole
    (`prompt_logprobs`, which sets the live history aside), only consistent histories are parked."""
    target = tiny.make_llama(0, tie_embeddings=False)
    failing = tiny.FailingOnce(target, width=32)
    engine = Engine(failing, tiny.make_tokenizer(), drafter="ngram", prompt_cache_size=3, prefill_step=32)
    plain = Engine(target, tiny.make_tokenizer(), drafter="ngram", prefill_step=32)
    b = prompt(1, 200)
    failing.countdown = 3  # after two chunks (64 tokens) were fed
    with pytest.raises(MemoryError):
        engine.generate(b, max_tokens=4)
    assert engine.target.dirty and len(engine.target.tokens) == 64
    engine.generate(prompt(2), max_tokens=4, **next_request)  # another conversation: the half-written one is not parked
    assert engine.prompt_cache.parked == []
    assert engine.generate(b, max_tokens=12).tokens == plain.generate(b, max_tokens=12).tokens


def test_a_draft_model_s_history_is_parked_with_its_last_drafts_written(tmp_path):
    """A draft model's last round fed its drafts lazily: they are written into its token list
    before its history is parked, and not into the history swapped in."""
    engine = engine_for("model", 2, tmp_path)
    engine.generate(CHAT, max_tokens=16, num_draft=3)
    engine.generate(SIDE, max_tokens=16, num_draft=3)  # CHAT's caches are parked, the draft's with them
    from mlxspec.prompts import encode_prompt

    chat = encode_prompt(CHAT, engine.tokenizer, engine.vocab_size)
    engine.prompt_cache.recall(engine, chat + [5])  # CHAT's come back (its next turn), SIDE's are parked
    states = [slot["model"] for slot in engine.prompt_cache.parked]
    assert len(states) == 1 and None not in states[0].tokens
    live = engine.drafters["model"].seq.tokens
    assert None not in live and live[:len(chat)] == chat


def test_regenerating_an_answer_does_not_park_copies_of_the_conversation():
    engine = Engine(tiny.make_llama(0), tiny.make_tokenizer(), drafter="none", prompt_cache_size=3)
    engine.generate(prompt(0), max_tokens=2)
    engine.generate(prompt(1), max_tokens=2)  # another conversation: 0 is parked
    for seed in range(4):  # 1's answer regenerated: what it discards is its own last answer
        engine.generate(prompt(1), max_tokens=70, temperature=1.0, seed=seed)
    assert first_tokens(engine) == [3]
    r = engine.generate(prompt(0) + [9], max_tokens=2)
    assert r.stats.prefilled_tokens < 5


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_a_request_scoring_its_prompt_parks_the_live_conversation_and_takes_none_back(drafter, tmp_path):
    """prompt_logprobs computes the prompt whole, from empty caches: the live conversation is
    parked, and a parked one it shares a prefix with stays parked (taken back, it would be lost)."""
    from mlxspec.prompts import encode_prompt

    engine = engine_for(drafter, 2, tmp_path)
    first = engine.generate(CHAT, max_tokens=8)
    engine.generate(SIDE, max_tokens=8)  # another conversation: CHAT's caches are parked
    ids = encode_prompt(CHAT, engine.tokenizer, engine.vocab_size)
    scored = engine.generate(ids[:len(ids) // 2], max_tokens=4, prompt_logprobs=0)
    assert scored.stats.prefilled_tokens == len(ids) // 2
    again = engine.generate(CHAT, max_tokens=8)
    assert again.stats.prefilled_tokens == 1 and again.tokens == first.tokens  # CHAT's parked caches
    assert engine.generate(SIDE, max_tokens=8).stats.prefilled_tokens == 1  # parked by the scoring request

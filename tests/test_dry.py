"""DRY: its penalties against text-generation-webui's own loop (the rule llama.cpp and KoboldCpp
took up), its settings' checks, and speculation that stays plain decoding's under it."""

import random

import mlx.core as mx
import numpy as np
import pytest

import tiny
from mlxspec import Engine
from mlxspec.dry import BREAKERS, Dry, breaking_tokens, check_breakers, check_dry
from mlxspec.errors import InvalidArgumentError
from mlxspec.penalties import Penalties


def webui_dry(input_ids, breakers, multiplier, base, allowed_length):
    """text-generation-webui's DRY logits processor, for one row, as it is written there."""
    last_token = input_ids[-1]
    if last_token in breakers:
        return {}
    match_indices = [idx for idx, val in enumerate(input_ids[:-1]) if val == last_token]
    match_lengths = {}
    for i in match_indices:
        next_token = input_ids[i + 1]
        if next_token in breakers:
            continue
        match_length = 1
        while match_length < 50:
            j = i - match_length
            if j < 0:
                break
            previous_token = input_ids[-(match_length + 1)]
            if input_ids[j] != previous_token:
                break
            if previous_token in breakers:
                break
            match_length += 1
        match_lengths[next_token] = max(match_length, match_lengths.get(next_token, 0))
    return {t: multiplier * base ** (n - allowed_length) for t, n in match_lengths.items() if n >= allowed_length}


@pytest.mark.parametrize("seed", range(60))
def test_penalties_match_text_generation_webui(seed):
    rng = random.Random(seed)
    vocab = rng.choice([3, 5, 8])  # few tokens: many repeats, some longer than 50
    n = rng.choice([2, 10, 60, 200])
    ids = [rng.randrange(vocab) for _ in range(n)]
    if seed % 3 == 0:  # a long periodic run at the end: repeats past the cap of 50
        ids = ids + [0, 1, 2] * 40
    breakers = {rng.randrange(vocab)} if seed % 2 else set()
    breaking = np.array([t in breakers for t in range(vocab)])
    multiplier, base, allowed = rng.choice([0.8, 2.0]), rng.choice([1.75, 1.1]), rng.choice([1, 2, 3])
    last_n = rng.choice([-1, 7, 40])
    dry = Dry(multiplier, base, allowed, last_n, breaking)
    window = ids[-last_n:] if last_n > 0 else ids
    want = webui_dry(window, breakers, multiplier, base, allowed)
    got = dry.penalties(ids)
    assert got.keys() == want.keys()
    for t in want:
        assert got[t] == pytest.approx(want[t], rel=1e-12)


def test_a_repeat_is_penalised_by_its_length_and_a_breaker_stops_it():
    dry = Dry(1.0, 2.0, 2, -1, np.array([False] * 9 + [True]))
    # "5 6 7 8 ... 5 6 7": the 8 that followed loses 1 x 2 ** (3 - 2)
    assert dry.penalties([5, 6, 7, 8, 1, 5, 6, 7]) == {8: 2.0}
    assert dry.penalties([5, 6, 7, 9, 1, 5, 6, 7]) == {}  # 9 is a breaker: never penalised
    assert dry.penalties([5, 9, 7, 8, 1, 5, 9, 7]) == {}  # the repeat stops at the breaker: 1 token, allowed
    assert dry.penalties([5, 6, 7, 8, 1, 6, 7]) == {8: 1.0}  # length 2: the multiplier alone
    assert Dry(1.0, 2.0, 1).penalties([5, 5]) == {5: 1.0}  # the shortest context with a repeat
    # a token past the breakers' table (a model's padded vocabulary) is no breaker
    assert Dry(1.0, 2.0, 1, -1, np.array([False, False, True])).penalties([3, 1, 3]) == {1: 1.0}


def test_breaking_tokens_are_those_whose_text_holds_a_breaker():
    texts = ["Hello", "\n", "a:b", "\n\n", "*bold", "plain", '"']
    assert breaking_tokens(texts, BREAKERS).tolist() == [False, True, True, True, True, False, True]
    assert breaking_tokens(texts, ["ll"]).tolist() == [True] + [False] * 6
    # an engine's: its tokenizer's texts (the byte tokenizer's ids are 3 specials, then the bytes)
    engine = Engine(tiny.make_llama(0), tiny.make_tokenizer())
    penalty = {"dry": check_dry(0.8, 1.75, 2, -1, None)}
    breaking = engine._penalties(penalty).dry.breaking
    assert np.nonzero(breaking)[0].tolist() == sorted(3 + ord(c) for c in BREAKERS)
    penalty = {"dry": check_dry(0.8, 1.75, 2, -1, ["<|im_end|>", "b"])}
    assert np.nonzero(engine._penalties(penalty).dry.breaking)[0].tolist() == [2, 3 + ord("b")]


def test_settings_are_checked_and_breakers_read_in_every_client_s_shape():
    assert check_dry(0.0, 1.75, 2, -1, None) is None and check_dry(0.8, 1.75, 2, 0, None) is None
    on = check_dry(0.8, 1.75, 2, -1, None)
    assert on == {"multiplier": 0.8, "base": 1.75, "allowed_length": 2, "last_n": -1, "breakers": list(BREAKERS)}
    assert check_breakers('"\\n", ":", "\\"", "*"') == ["\n", ":", "\"", "*"]  # text-generation-webui's string
    assert check_breakers('["\\n"]') == ["\n"]
    assert check_breakers("\n") == ["\n"] and check_breakers("###") == ["###"]  # no list: one breaker
    assert check_breakers([]) == check_breakers("[]") == [] and check_breakers("[ ]") == []  # none, however sent
    assert len(check_breakers(["x" * 40] * 32)) == 32  # the most taken
    for args, says in [((-1, 1.75, 2, -1, None), "dry_multiplier must be a number >= 0"),
                       ((0.8, 0.5, 2, -1, None), "dry_base must be a number >= 1"),
                       ((0.8, 1.75, 0, -1, None), "dry_allowed_length must be an integer >= 1"),
                       ((0.8, 1.75, 2.5, -1, None), "dry_allowed_length must be an integer >= 1"),
                       ((0.8, 1.75, 2, -2, None), "dry_penalty_last_n must be an integer >= -1"),
                       ((0.8, 1.75, 2, -1, [""]), "non-empty strings"),
                       ((0.8, 1.75, 2, -1, ["x" * 41]), "at most 40 characters"),
                       ((0.8, 1.75, 2, -1, [1]), "dry_sequence_breakers must be a list of non-empty strings"),
                       ((0.8, 1.75, 2, -1, ""), "non-empty strings"),
                       ((0.8, 1.75, 2, -1, ["x"] * 33), "at most 32 strings"),
                       ((True, 1.75, 2, -1, None), "dry_multiplier must be a number >= 0"),
                       ((float("nan"), 1.75, 2, -1, None), "dry_multiplier")]:
        with pytest.raises(InvalidArgumentError, match=says):
            check_dry(*args)


def test_each_row_of_a_pass_gets_the_penalties_of_its_own_position():
    dry = Dry(1.0, 1.75, 2, -1, np.zeros(10, dtype=bool))
    penalties = Penalties(10, dry=dry)
    history, drafts = [1, 2, 3, 4, 1, 2], [3, 4, 1]
    out = np.array(penalties.rows(history, drafts)(mx.zeros((1, 4, 10))))[0]
    for i in range(4):
        want = np.zeros(10)
        for t, amount in dry.penalties(history + drafts[:i]).items():
            want[t] = -amount
        np.testing.assert_allclose(out[i], want, rtol=1e-6)
    assert (out != 0).sum() >= 3  # the rows did have repeats to penalise
    # the history is converted incrementally: one that grew, and one that is another, read right
    for later in (history + [3, 4, 1, 2], [9, 8, 9, 8], [1, 2, 3, 4, 1, 2, 3]):
        got = np.array(penalties.rows(later, [])(mx.zeros((1, 1, 10))))[0, 0]
        want = np.zeros(10)
        for t, amount in dry.penalties(later).items():
            want[t] = -amount
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("drafter", ["ngram", "model", "eagle"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_speculation_gives_plain_decoding_s_tokens_under_dry(drafter, temperature, tmp_path):
    model = tiny.make_llama(seed=5, vocab_size=12, hidden=32)
    kw = {"ngram": {}, "model": {"draft_model": tiny.make_llama(6, vocab_size=12, hidden=16, layers=1)},
          "eagle": {"eagle_head": tiny.make_eagle_head(model, tmp_path, seed=7)}}[drafter]
    engine = Engine(model, None, drafter=drafter, **kw)
    prompt = [3, 7, 1, 3, 7] * 4
    dry = dict(dry_multiplier=1.5, dry_allowed_length=2)
    changed = drafted = 0
    for seed in range(3):
        plain = engine.generate(prompt, max_tokens=32, temperature=temperature, seed=seed, speculative=False, **dry)
        spec = engine.generate(prompt, max_tokens=32, temperature=temperature, seed=seed, num_draft=3, **dry)
        assert spec.tokens == plain.tokens, seed
        drafted += spec.stats.drafted
        without = engine.generate(prompt, max_tokens=32, temperature=temperature, seed=seed, speculative=False)
        changed += without.tokens != plain.tokens
    assert drafted > 0 and changed > 0  # drafts were judged, and DRY changed what the target wrote

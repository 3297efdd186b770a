"""Predicted Outputs (`prediction`): lookup drafts from the text the answer is expected to repeat;
the answer stays the target's (greedy and seeded sampling equal plain decoding, whatever the
prediction), and OpenAI's usage counts say how much of the prediction the answer holds."""

import random

import pytest

import tiny
from mlxspec import Engine
from mlxspec.drafters.ngram import NgramDrafter
from mlxspec.errors import InvalidArgumentError
from mlxspec.prediction import MAX_PREDICTION, prediction_counts
from serve_helpers import openai_client, running_server
from test_engine_trees import flat_curve

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]


def target():
    return tiny.make_llama(3, hidden=32)


def plain_answer(model, **kw):
    return Engine(model, drafter="none").generate(PROMPT, max_tokens=60, **kw).tokens


def edited(tokens, seed):
    """`tokens` with a few changed, dropped and inserted: an imperfect prediction."""
    rng, out = random.Random(seed), []
    for t in tokens:
        roll = rng.random()
        if roll < 0.05:
            continue
        out.append(t if roll > 0.1 else rng.randrange(3, tiny.VOCAB))
        if roll > 0.95:
            out.append(rng.randrange(3, tiny.VOCAB))
    return out


# -- the drafter ------------------------------------------------------------------------------------

def test_the_answer_starts_from_the_prediction_and_follows_it_in_order():
    d = NgramDrafter()
    pred = [40, 41, 42, 50, 51, 40, 41, 43, 52]
    d.predict(pred, start=3)
    first = d.propose([1, 2, 3], 4)
    assert (first.tokens, first.kind) == ([40, 41, 42, 50], "p0")
    # "40 41" occurs twice: after the first use, the later occurrence that also matches further back wins
    assert d.propose([1, 2, 3, 40, 41, 42, 50, 51, 40, 41], 3).tokens == [43, 52]
    # after a divergence ("99" is not in it) the answer's tail finds the prediction again
    r = d.propose([1, 2, 3, 40, 99, 50, 51], 2)
    assert r.tokens == [40, 41] and r.kind == "p2"
    d.predict(None)
    assert d.propose([1, 2, 3], 4).tokens == []


def test_where_the_tail_matches_as_far_back_twice_the_one_after_the_last_used_wins():
    d = NgramDrafter()
    d.predict([7, 8, 9, 1, 7, 8, 2], start=1)
    assert d.propose([0, 5, 7, 8], 2).tokens == [9, 1]  # "7 8" twice, "5 7 8" nowhere: the first, nearer
    assert d.propose([0, 5, 7, 8, 9, 1], 2).tokens == [7, 8]
    assert d.propose([0, 5, 7, 8, 9, 1, 6, 7, 8], 1).tokens == [2]  # the one after the last used


def test_a_longer_match_in_the_history_beats_a_shorter_one_in_the_prediction():
    d = NgramDrafter()
    d.predict([7, 60, 61], start=4)
    history = [6, 7, 8, 9, 6, 7]  # "6 7" recurs in the history, followed by 8; the prediction has "7" alone
    assert d.propose(history, 2).tokens == [8, 9]
    d.predict([6, 7, 60, 61], start=4)  # now it matches as far back: the prediction wins
    assert d.propose(history, 2).tokens == [60, 61]
    tree = d.propose_tree(history, 3, 8)  # a tree: the prediction's chain, the history's beside it
    assert tree.tokens == [60, 61, 8, 9, 6] and tree.parents == [-1, 0, -1, 2, 3] and tree.kind == "p2"
    # with the cost model's word: the kind accepted more drafts wins, however far back the other matches
    d.judge = lambda kind: 0.9 if kind.startswith("n") else 0.2
    assert d.propose(history, 2).tokens == [8, 9]
    d.judge = lambda kind: 0.5
    assert d.propose(history, 2).tokens == [60, 61]  # a tie: as far back, the prediction's


# -- the engine -------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["exact", "edited", "unrelated"])
@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_greedy_output_is_plain_decoding_s_whatever_the_prediction(how, drafter):
    model = target()
    plain = plain_answer(model)
    pred = {"exact": plain, "edited": edited(plain, 1), "unrelated": list(range(40, 100))}[how]
    kw = {"draft_model": tiny.make_llama(4, hidden=16, layers=1)} if drafter == "model" else {}
    engine = flat_curve(Engine(model, drafter=drafter, lookup=False, **kw))
    r = engine.generate(PROMPT, max_tokens=60, prediction=pred)
    assert r.tokens == plain
    assert r.stats.prediction_accepted + r.stats.prediction_rejected == len(pred)
    if how == "exact":  # drafted from it (a model drafter's lookup rounds, though lookup is off)
        assert r.stats.prediction_accepted == len(pred) and r.stats.tokens_per_target_pass > 3
        assert drafter == "ngram" or r.stats.lookup_rounds > 0
        # the lookup's cost model, which learned the prediction's kinds, judges them against the history's
        assert engine.drafters["ngram"].judge("p8") == engine.costs["ngram"].alpha_of("p8") > 0.5


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_a_prediction_makes_rounds_accept_more(drafter):
    """A model that writes a text that never repeats itself (lookup alone finds nothing), given a
    prediction of it with an edit every seven tokens or so."""
    model = tiny.ScriptedModel()
    script = random.Random(0).sample(range(3, tiny.VOCAB), 120)
    model.say(script, len(PROMPT))
    kw = {"draft_model": tiny.make_llama(4, hidden=16, layers=1)} if drafter == "model" else {}
    engine = flat_curve(Engine(model, drafter=drafter, **kw))
    without = engine.generate(PROMPT, max_tokens=100)
    with_it = engine.generate(PROMPT, max_tokens=100, prediction=edited(script, 2))
    assert without.tokens == with_it.tokens == script[:100]
    assert with_it.stats.rounds < without.stats.rounds / 3, (with_it.stats.rounds, without.stats.rounds)


def test_a_prediction_is_the_request_s_alone():
    """The next request (or one that overtakes it) does not draft from an earlier request's prediction."""
    engine = Engine(target(), drafter="ngram")
    pred = [40, 41, 42, 43]
    engine.generate(PROMPT, max_tokens=5, prediction=pred)
    assert engine.drafters["ngram"].propose(PROMPT, 4).tokens[:4] != pred
    stream = engine.stream(PROMPT, max_tokens=50, prediction=pred)
    next(stream)
    engine.generate(PROMPT, max_tokens=5)  # overtakes it
    assert engine.drafters["ngram"].propose(PROMPT, 4).tokens[:4] != pred


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_seeded_sampling_is_plain_decoding_s_with_a_prediction(drafter):
    model = target()
    kw = {"draft_model": tiny.make_llama(4, hidden=16, layers=1)} if drafter == "model" else {}
    engine = flat_curve(Engine(model, drafter=drafter, **kw))
    accepted = 0
    for seed in range(4):
        plain = engine.generate(PROMPT, max_tokens=40, temperature=0.8, seed=seed, speculative=False).tokens
        r = engine.generate(PROMPT, max_tokens=40, temperature=0.8, seed=seed, prediction=edited(plain, seed))
        assert r.tokens == plain, seed
        accepted += r.stats.accepted
    assert accepted > 40  # the predictions drafted, and the target kept much of them


def test_text_predictions_and_bad_ones():
    engine = Engine(target(), tiny.make_tokenizer(), drafter="ngram")
    plain = engine.generate("Say it:", max_tokens=30, speculative=False)
    r = engine.generate("Say it:", max_tokens=30, prediction=plain.text)
    assert r.tokens == plain.tokens and r.stats.prediction_rejected == 0
    assert r.stats.prediction_accepted == len(engine.tokenizer.encode(plain.text, add_special_tokens=False))
    for bad, says in ((5, "prediction must be the text the answer is expected to repeat (a string) or its token ids"),
                      ([1, -2], "integers in [0, 259)"), ([1, 259], "integers in [0, 259)"),
                      ([1, True], "integers in [0, 259)"),
                      ([0] * (MAX_PREDICTION + 1), f"at most {MAX_PREDICTION} are taken")):
        with pytest.raises(InvalidArgumentError, match=__import__("re").escape(says)):
            engine.generate("Say it:", prediction=bad)
    with pytest.raises(InvalidArgumentError, match="a prediction as text needs the model's tokenizer"):
        Engine(target(), drafter="ngram").generate(PROMPT, prediction="text")
    longest = engine.generate("Say it:", max_tokens=2, prediction=[0] * MAX_PREDICTION)  # the most taken
    assert longest.stats.prediction_rejected == MAX_PREDICTION - longest.stats.prediction_accepted


def test_prediction_counts_are_the_prediction_s_tokens_in_the_answer_in_order():
    assert prediction_counts([1, 2, 3, 4], [1, 2, 3, 4]) == (4, 0)
    assert prediction_counts([1, 2, 3, 4], [0, 1, 2, 9, 4, 5]) == (3, 1)
    assert prediction_counts([1, 2, 3], []) == (0, 3)
    assert prediction_counts([3, 2, 1], [1, 2, 3]) == (1, 2)  # in order: one of them
    # A long answer of common tokens: none of them is a diff's "junk" (difflib's autojunk would drop
    # the tokens that fill over 1 % of it, and count most of this answer's prediction rejected)
    rng = random.Random(0)
    answer = [rng.choice([0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]) for _ in range(250)]
    assert prediction_counts(answer[:99] + [42] + answer[99:], answer) == (250, 1)


# -- the server -------------------------------------------------------------------------------------

def test_the_openai_client_s_prediction_and_its_usage():
    engine = Engine(target(), tiny.make_tokenizer(), drafter="ngram")
    ask = [{"role": "user", "content": "Say it."}]
    with running_server(engine, model_id="t") as (url, _):
        client = openai_client(url)
        plain = client.chat.completions.create(model="t", messages=ask, max_tokens=30)
        assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0
        text = plain.choices[0].message.content
        for prediction in ({"type": "content", "content": text},
                           {"type": "content", "content": [{"type": "text", "text": text}]}):
            r = client.chat.completions.create(model="t", messages=ask, max_tokens=30, prediction=prediction)
            assert r.choices[0].message.content == text
            details = r.usage.completion_tokens_details
            assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens == 0
        with pytest.raises(Exception) as err:
            client.chat.completions.create(model="t", messages=ask, max_tokens=5, prediction={"type": "text"})
        assert err.value.status_code == 400 and err.value.body["param"] == "prediction"
        assert 'prediction must be {"type": "content", "content": ...}' in err.value.body["message"]

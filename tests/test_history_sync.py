"""Drafters sync to a history that grows round by round without comparing what they hold again,
and a history that changed is still compared: the drafts are the same either way."""

import pathlib

import pytest
from hypothesis import given, settings, strategies as st

import tiny
from mlxspec.engine import Engine
from mlxspec.sampling import SamplingParams
from mlxspec.sequence import shared_prefix


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=300), st.lists(st.integers(0, 3), max_size=60),
       st.lists(st.integers(0, 3), max_size=60), st.integers(0, 400))
def test_shared_prefix_is_the_longest_common_prefix(common, tail_a, tail_b, start):
    a, b = common + tail_a, common + tail_b
    naive = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert shared_prefix(a, b) == naive
    assert shared_prefix(a, b, min(start, naive)) == naive  # a prefix known to agree is not compared


def drafts(drafter, history, k=4):
    d = drafter.propose(history, k, SamplingParams(), 0)
    return d.tokens if isinstance(d.tokens, list) else d.tokens.tolist()


@pytest.mark.parametrize("name", ["ngram", "model", "eagle"])
def test_a_growing_history_drafts_as_fresh_copies_do(name, tmp_path: pathlib.Path):
    def build():
        target = tiny.make_llama(0, tie_embeddings=False)
        engine = Engine(target, tiny.make_tokenizer(), draft_model=tiny.make_llama(1, layers=1, tie_embeddings=False),
                        drafter="model", eagle_head=tiny.make_eagle_head(target, tmp_path / "head"))
        return engine, engine.drafters[name]

    prompt = [3 + (7 * i) % 50 for i in range(120)]
    (e1, grown), (e2, fresh) = build(), build()
    history = list(prompt)
    for r in range(12):
        for e in (e1, e2):  # the target's passes over the new tokens (the features a head reads)
            e.target.forward(history[len(e.target.tokens):])
        mine = drafts(grown, history)  # the same list, appended to: the loop's way
        assert mine == drafts(fresh, list(history))  # a new list each round: compared in full
        history.extend(mine[: r % 3] + [3 + r])  # some drafts accepted, then the target's token
    # A history that is not the one grown (another request's) is compared, not trusted.
    other = prompt[:60] + [9, 9, 9] + prompt[60:] + prompt[:60]  # longer than the grown one, too
    e3, clean = build()
    for e in (e1, e3):
        e.target.forward(e.target.sync(other))
    assert drafts(grown, other) == drafts(clean, list(other))
    assert held(grown, len(other)) == other  # what it drafted from is this history, not the grown one


def held(drafter, n):
    """The history a drafter's state was built from (its first n tokens)."""
    if hasattr(drafter, "seq"):  # the draft model's cache
        return drafter.seq.tokens[:n]
    if hasattr(drafter, "covered"):  # the head's real entries (all but the last token)
        return drafter.covered[:n]
    return drafter._corpus[drafter._base:][:n]  # the n-gram index's current history

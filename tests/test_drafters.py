"""Drafters in isolation."""

from mlxspec.drafters import NgramDrafter
from mlxspec.sampling import SamplingParams

G = SamplingParams()


def test_ngram_takes_most_recent_occurrence_of_longest_suffix():
    d = NgramDrafter()
    h = [1, 2, 3, 4, 9, 9, 2, 3, 5, 6, 7, 1, 2, 3]
    # Longest suffix with an earlier occurrence: [1, 2, 3] at 0 -> continues with 4.
    assert d.propose(h, 3, G, None).tokens == [4, 9, 9]
    # Only [2, 3] recurs (most recently at 6) -> continues with 5.
    assert d.propose([8, 2, 3, 5, 6, 0, 2, 3], 2, G, None).tokens == [5, 6]


def test_ngram_falls_back_to_shorter_ngrams_and_to_nothing():
    d = NgramDrafter()
    assert d.propose([1, 2, 3, 4, 5, 3], 2, G, None).tokens == [4, 5]
    assert d.propose([1, 2, 3, 4], 2, G, None).tokens == []  # nothing repeats


def test_ngram_index_extends_and_rebuilds():
    d = NgramDrafter()
    h = [1, 2, 3, 1]
    assert d.propose(h, 2, G, None).tokens == [2, 3]
    h += [2]
    assert d.propose(h, 2, G, None).tokens == [3, 1]
    assert d.propose([7, 8, 7], 1, G, None).tokens == [8]  # a new history, not an extension


def test_ngram_draft_continues_a_cycle_past_the_end_of_the_history():
    d = NgramDrafter()
    assert d.propose([4, 4, 4], 5, G, None).tokens == [4, 4, 4, 4, 4]
    assert d.propose([9, 1, 2, 3, 1, 2, 3, 1, 2], 5, G, None).tokens == [3, 1, 2, 3, 1]


def test_ngram_tree_merges_every_occurrence_chain_first():
    d = NgramDrafter()
    h = [5, 6, 7, 8, 9, 5, 6, 7, 11, 12, 5, 6, 7, 8, 13, 5, 6, 7]
    t = d.propose_tree(h, 3, 10)
    chain = d.propose(h, 3, G, None).tokens
    assert t.tokens[:3] == chain == [8, 13, 5] and t.parents[:3] == [-1, 0, 1]
    # The other occurrences continue 8 9 5 and 11 12 5: a branch under the chain's first node
    # and one at the root, each seen once among the two other occurrences.
    branches = {(t.parents[i], t.tokens[i]): t.scores[i] for i in range(3, len(t))}
    assert branches[(-1, 11)] == 0.5 and branches[(0, 9)] == 1.0
    assert all(p < i for i, p in enumerate(t.parents))


def test_ngram_tree_keeps_earlier_histories():
    d = NgramDrafter()
    d.propose([1, 2, 3, 4, 1, 2], 2, G, None)
    new = [9, 1, 2]  # a new history (not an extension): no chain, but the old one still branches
    assert d.propose(new, 2, G, None).tokens == []
    t = d.propose_tree(new, 2, 4)
    assert t.tokens[:2] == [3, 4] and t.kind == "a2"


def test_ngram_labels_a_longest_match_by_how_far_it_extends_back():
    d = NgramDrafter()
    copied = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    # The tail matches 3, 5 and 10 tokens of an earlier occurrence (a phrase, a clause, a copy).
    assert d.propose([1, 7, 8, 9, 2, 5, 8, 9], 1, G, None).kind == "n2"
    assert d.propose([7, 2, 3, 4, 20, 9, 2, 3, 4], 1, G, None).kind == "n3"
    assert d.propose([5, 6, 1, 2, 3, 4, 20, 9, 5, 6, 1, 2, 3, 4], 1, G, None).kind == "n4"
    h = [*copied, 20, 21, *copied]
    assert d.propose(h, 2, G, None).kind == "n8" and d.propose(h, 2, G, None).tokens == [20, 21]
    assert d.propose_tree(h, 2, 4).kind == "n8"
    # In an earlier history only: the same labels, "a" for archived.
    assert d.propose_tree([30, *copied[-9:]], 1, 2).kind == "a8"


def test_ngram_copy_says_how_far_back_the_match_reaches_up_to_top():
    d = NgramDrafter()
    copied = [10, 11, 12, 13, 14, 15]
    h = [*copied, 20, 21, *copied]
    assert d.copy(h, 2) == (6, [20, 21])  # six tokens recur, though the index holds 3-grams
    assert d.copy(h, 2, top=4) == (4, [20, 21])
    assert d.copy([1, 2, 3, 4], 2) == (0, [])  # nothing recurs
    d.propose([1, 2, 3, 1, 2], 1, G, None)
    assert d.copy([9, 1, 2], 2) == (0, [])  # only an earlier history has it: no copy of this one


def test_ngram_trees_merge_the_latest_occurrences_to_a_bounded_depth(monkeypatch):
    from mlxspec.drafters import ngram

    # [5, 6] occurs four times; each occurrence continues differently.
    h = [5, 6, 1, 2, 3, 5, 6, 11, 12, 13, 5, 6, 21, 22, 23, 5, 6, 31, 32, 33, 5, 6]
    monkeypatch.setattr(ngram, "MAX_OCCURRENCES", 3)  # the chain's occurrence and the two before it
    t = NgramDrafter().propose_tree(h, 3, 20)
    assert t.tokens[:3] == [31, 32, 33]
    roots = {t.tokens[i] for i in range(3, len(t)) if t.parents[i] == -1}
    assert roots == {11, 21}  # not 1: the oldest occurrence is left out
    monkeypatch.setattr(ngram, "SIDE_DEPTH", 1)
    t = NgramDrafter().propose_tree(h, 3, 20)
    assert all(t.parents[i] == -1 for i in range(3, len(t)))  # side branches one level deep


def test_ngram_keeps_a_bounded_corpus_of_earlier_histories(monkeypatch):
    from mlxspec.drafters import ngram

    monkeypatch.setattr(ngram, "MAX_CORPUS", 100)
    d = NgramDrafter()
    for i in range(20):
        d.propose([1000 + i] + [i % 7, 5, 6, 7] * 5, 1, G, None)  # 21 tokens, a new history each time
        assert len(d._corpus) <= 100
    t = d.propose_tree([2000, 5, 6], 1, 4)
    assert len(t) >= 1  # the latest earlier histories are still there to branch from


def _state(d: NgramDrafter):
    return d._corpus, d._base, d._indexed, {k: list(v) for k, v in d._index.items()}


def test_ngram_forgets_what_the_next_prompt_does_not_share_as_if_never_seen():
    prompt = [5, 6, 7, 8, 5, 6]
    answer = [7, 9, 10, 11, 5, 6, 7, 9, 10]
    d = NgramDrafter()
    d.propose([1, 2, 3, 1], 2, G, None)  # an earlier history, kept
    d.propose(prompt + answer, 2, G, None)
    fresh = NgramDrafter()
    fresh.propose([1, 2, 3, 1], 2, G, None)
    fresh.propose(prompt, 2, G, None)
    assert _state(d) != _state(fresh)
    assert not d.forget_beyond(prompt + answer + [12])  # a prompt that holds it all: nothing dropped
    assert d.forget_beyond(prompt + [7, 12])  # it parts after the prompt's [7]
    assert d._corpus[d._base:] == prompt + [7]
    assert d.forget_beyond(prompt + [0]) and d._corpus[d._base:] == prompt  # down to the last token
    d = NgramDrafter()
    d.propose([1, 2, 3, 1], 2, G, None)
    d.propose(prompt + answer, 2, G, None)
    assert d.forget_beyond(prompt)  # the answer taken back, the same prompt again
    assert _state(d) == _state(fresh)  # the answer's tokens and n-grams are gone, the rest kept
    assert not d.forget_beyond(prompt)  # nothing past it any more
    # the retry's history grows from the prompt again, as it would have without the answer
    retry = prompt + [7, 12, 5, 6]
    assert d.propose(retry, 3, G, None).tokens == fresh.propose(retry, 3, G, None).tokens
    assert d.propose_tree(retry, 3, 8).tokens == fresh.propose_tree(retry, 3, 8).tokens
    assert _state(d) == _state(fresh)

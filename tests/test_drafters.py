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

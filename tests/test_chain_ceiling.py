"""scripts/chain_ceiling.py's replay: rounds, costs, the oracle and the confidence gate."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import chain_ceiling as cc  # noqa: E402


def answer(truth, chains, ps=None):
    """Records along one answer: at position j the drafter proposes chains[j]; truth is the answer."""
    return [{"chain": c, "p": (ps[j] if ps else [0.5] * len(c)), "truth": truth[j: j + len(c)]}
            for j, c in enumerate(chains)]


def test_accepted_counts_the_leading_matches_only():
    rec = {"chain": [5, 6, 9, 8], "truth": [5, 6, 7, 8]}
    assert [cc.accepted(rec, k) for k in range(5)] == [0, 1, 2, 2, 2]


def test_replay_charges_each_round_its_pass_and_its_head_steps():
    truth = [1, 2, 3, 4, 5]
    # At 0 the chain is right twice then wrong; at 3 it is right once (the answer then ends).
    chains = [[1, 2, 9], [0, 0, 0], [0, 0, 0], [4, 5, 0], [0, 0, 0]]
    a = answer(truth, chains)
    curve, step = [1.0, 1.5, 2.0], 0.1
    r = cc.replay([a], cc.fixed(2), curve, step)
    # Round 1 at 0: k = 2, both accepted -> 3 tokens for V(3) + 2 steps. Round 2 at 3: only one token
    # is left after the target's own, so k = 1, accepted -> 2 tokens for V(2) + 1 step.
    cost = (2.0 + 0.2) + (1.5 + 0.1)
    assert r["all"] == pytest.approx(5 / cost)
    assert r["tokens_per_pass"] == pytest.approx(2.5)
    assert r["per_token"] == pytest.approx(3 / 3)  # every judged draft accepted: 2 + 1 of 2 + 1
    plain = cc.replay([a], cc.fixed(0), curve, step)
    assert plain["all"] == pytest.approx(1.0) and plain["tokens_per_pass"] == 1.0 and plain["per_token"] == 0.0
    # At 0 a chain of 3 is judged up to its first rejection: 2 of 3 accepted, then 1 of 1 at 3.
    assert cc.replay([a], cc.fixed(3), curve, step)["per_token"] == pytest.approx(3 / 4)
    # Drafts after a chain's first rejection are never judged: a wrong first token is 0 of 1, not of 3.
    wrong_first = answer(truth, [[9, 2, 3], [2, 3, 4], [3, 4, 5], [4, 5, 0], [0, 0, 0]])
    assert cc.replay([wrong_first], cc.fixed(3), curve, step)["per_token"] == pytest.approx(3 / 4)


def random_answers(seed: int, count: int, length: int, depth: int, rate: float):
    """`count` answers of `length` tokens whose drafted tokens are right with probability `rate`."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        truth = [rng.randrange(4) for _ in range(length)]
        chains = [[t if rng.random() < rate else 9 for t in truth[j: j + depth]] for j in range(length)]
        out.append(answer(truth, chains, ps=[[rng.random() for _ in range(depth)] for _ in range(length)]))
    return out


def test_the_oracle_advances_as_the_longest_chain_does_for_fewer_drafts():
    answers = random_answers(0, 6, 40, 6, 0.6)
    curve, step = cc.CURVES["h100"]
    oracle, longest = cc.replay(answers, cc.oracle, curve, step), cc.replay(answers, cc.fixed(6), curve, step)
    assert oracle["tokens_per_pass"] == pytest.approx(longest["tokens_per_pass"])
    assert oracle["all"] > longest["all"] and oracle["per_token"] == 1.0


def test_the_gate_cuts_where_the_product_of_probabilities_falls_under_tau():
    rec = {"chain": [1, 2, 3, 4], "p": [0.9, 0.8, 0.5, 0.9], "truth": [1, 2, 3, 4]}
    assert cc.gate(0.5, 4)(rec) == (2, True)  # 0.9, 0.72, then 0.36 < 0.5
    assert cc.gate(0.1, 4)(rec) == (4, True)  # 0.324 after four steps
    assert cc.gate(0.1, 3)(rec) == (3, True)
    assert cc.gate(0.95, 4)(rec) == (0, True)


def test_a_read_is_charged_only_to_rounds_that_draft():
    truth = [1, 2, 3]
    a = answer(truth, [[1, 2], [2, 3], [3]], ps=[[0.9, 0.9], [0.9, 0.9], [0.01]])
    free = cc.replay([a], cc.gate(0.5, 2), [1.0, 1.2, 1.4], 0.0, read=0.0)
    paid = cc.replay([a], cc.gate(0.5, 2), [1.0, 1.2, 1.4], 0.0, read=0.3)
    # One round drafts 2 (all 3 tokens, the last the target's own): V(3) = 1.4, plus the read.
    assert free["all"] == pytest.approx(3 / 1.4) and paid["all"] == pytest.approx(3 / 1.7)


@pytest.mark.parametrize("text", ["", "1,x", "1,-2", "h200", "1:1.0 3:1.2", "1:1.0 2:"])
def test_a_bad_curve_says_what_is_allowed(text):
    with pytest.raises(SystemExit, match="h100"):
        cc.parse_curve(text)


def test_named_and_given_curves():
    assert cc.parse_curve("h100") == cc.CURVES["h100"]
    assert cc.parse_curve("1,1.1,1.6") == ([1.0, 1.1, 1.6], None)
    # the line `mlxspec bench` prints, pasted as it is
    assert cc.parse_curve("1:1.00  2:1.25  3:1.40") == ([1.0, 1.25, 1.4], None)


def test_load_refuses_a_missing_or_foreign_file(tmp_path):
    with pytest.raises(SystemExit, match="not chains written by --save"):
        cc.load(str(tmp_path / "absent.jsonl"))
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text('{"prompt": "hello"}\n', encoding="utf-8")
    with pytest.raises(SystemExit, match="not chains written by --save"):
        cc.load(str(foreign))
    good = tmp_path / "good.jsonl"
    good.write_text('{"kind": "x", "recs": [{"chain": [1], "p": [0.5], "truth": [1]}]}\n', encoding="utf-8")
    assert cc.load(str(good))[0]["recs"][0]["chain"] == [1]


def test_hindsight_may_stop_short_of_what_would_be_accepted_on_a_curve_with_steps():
    truth = list(range(6))
    a = answer(truth, [truth[j: j + 3] for j in range(6)])  # every draft right, chains of 3
    curve = [1.0, 1.1, 1.1, 2.0]  # a pass of 4 rows costs nearly twice one of 3
    oracle = cc.replay([a], cc.oracle, curve, 0.0)
    best = cc.hindsight([a], curve, 0.0, 3)
    assert oracle["all"] == pytest.approx(6 / (2.0 + 1.1))  # k = 3 at 0 (4 tokens), then k = 1 (2)
    assert best["all"] == pytest.approx(6 / (1.1 + 1.1))  # k = 2 twice (3 tokens each)
    assert best["tokens_per_pass"] == pytest.approx(3.0)


def test_hindsight_beats_every_policy_on_random_answers():
    answers = random_answers(1, 5, 30, 5, 0.5)
    for name in ("h100", "flat", "cpu"):
        curve, step = cc.CURVES[name]
        best = cc.hindsight(answers, curve, step, 5)["all"]
        policies = [cc.fixed(k) for k in range(6)] + [cc.oracle] + [cc.gate(t, 5) for t in cc.TAUS]
        assert all(best >= cc.replay(answers, p, curve, step)["all"] - 1e-12 for p in policies)

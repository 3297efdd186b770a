"""Per-step acceptance in GenerationStats: which drafts the target judged, and which it accepted."""

import time

import pytest

import tiny
from mlxspec import Engine
from mlxspec.stats import GenerationStats

PROMPT = [5, 6, 7, 8, 9, 10, 5, 6, 7, 11, 12]


def test_step_counts_by_hand():
    s = GenerationStats()
    for k, n in [(4, 0), (4, 2), (4, 4), (2, 1)]:  # chain rounds of the drafter itself
        s.record_round(k, n)
    s.record_round(5, 3, tree=True)  # a tree's node count is no draft position: not counted
    s.record_round(4, 4, lookup=True)  # another drafter's round: not counted
    s.record_round(0, 0)  # a plain step
    # A chain stops being judged at its first rejection: (4, 0) judged 1 draft, (4, 2) judged 3.
    assert s.step_reached == [4, 3, 2, 1]
    assert s.step_accepted == [3, 2, 1, 1]
    assert s.step_acceptance == pytest.approx([3 / 4, 2 / 3, 1 / 2, 1.0])
    assert s.judged_acceptance == pytest.approx(7 / 10)
    # accepted / drafted counts every draft, the unjudged ones after a rejection too
    assert s.acceptance_rate == pytest.approx((0 + 2 + 4 + 1 + 3 + 4) / (4 + 4 + 4 + 2 + 5 + 4))
    d = s.as_dict()
    assert d["step_acceptance"] == s.step_acceptance and d["judged_acceptance"] == s.judged_acceptance
    # the counts the CLI, the bench and the chat print
    s.record_round(5, 2, tree=True)
    s.record_round(3, 3, forced=True)
    assert (s.rounds, s.drafted, s.accepted) == (9, 4 + 4 + 4 + 2 + 5 + 4 + 5 + 3, 0 + 2 + 4 + 1 + 3 + 4 + 2 + 3)
    assert (s.tree_rounds, s.lookup_rounds, s.forced_rounds) == (2, 1, 1)
    assert (s.lookup_drafted, s.lookup_accepted, s.forced_drafted, s.forced_accepted) == (4, 4, 3, 3)
    assert s.tree_histogram == {5: 2} and s.k_histogram == {4: 4, 2: 1, 5: 2, 0: 1, 3: 1}
    assert s.accept_histogram == {0: 1, 2: 2, 4: 2, 1: 1, 3: 2}  # drafting rounds only
    assert (s.last_k, s.last_tree, s.last_lookup) == (3, False, False)
    assert s.as_dict()["tree_histogram"] == {"5": 2} and s.as_dict()["accept_histogram"]["4"] == 2
    # mapping-style access: stats["judged_acceptance"] as stats.judged_acceptance
    assert "judged_acceptance" in s and "nope" not in s and s["judged_acceptance"] == s.judged_acceptance
    with pytest.raises(KeyError, match="nope"):
        s["nope"]
    assert GenerationStats().judged_acceptance == 0.0 and GenerationStats().step_acceptance == []


def test_self_draft_judges_and_accepts_every_draft():
    target = tiny.make_llama(1)
    r = Engine(target, None, target, num_draft=4).generate(PROMPT, max_tokens=40).stats
    assert r.judged_acceptance == 1.0 and r.step_acceptance == [1.0] * 4
    assert sum(r.step_accepted) == r.accepted == r.drafted


def test_engine_counts_agree_with_its_totals():
    target, draft = tiny.make_llama(1), tiny.make_llama(2, layers=1, hidden=32)
    s = Engine(target, None, draft, num_draft=3).generate(PROMPT, max_tokens=48).stats
    assert s.drafted > 0 and s.tree_rounds == 0 and s.lookup_rounds == 0
    assert sum(s.step_accepted) == s.accepted  # every accepted draft was judged
    # the rounds that drafted judged position 1; each accepted draft at i < k brings its round to i + 1
    assert s.step_reached[0] == sum(c for k, c in s.k_histogram.items() if k)
    assert all(r >= a for r, a in zip(s.step_reached, s.step_accepted))
    # a round reaches i + 1 only after accepting i; all do where every round drafted 3
    full = set(k for k in s.k_histogram if k) == {3}
    assert all((s.step_reached[i + 1] == s.step_accepted[i]) if full else (s.step_reached[i + 1] <= s.step_accepted[i])
               for i in range(len(s.step_reached) - 1))
    assert s.judged_acceptance >= s.acceptance_rate


def test_a_rate_of_nothing_is_printed_as_none_not_zero():
    from mlxspec.stats import acceptance_text

    assert acceptance_text(31, 50) == "62% (31/50)"
    assert acceptance_text(0, 0) == "- (nothing drafted)"
    # a rate is never rounded to all or none when it is not
    assert acceptance_text(7650, 7659) == "99.8% (7650/7659)" and acceptance_text(9999, 10000) == "99.9% (9999/10000)"
    assert acceptance_text(1, 10000) == "0.1% (1/10000)" and acceptance_text(5, 5) == "100% (5/5)"
    assert acceptance_text(0, 5) == "0% (0/5)" and acceptance_text(199, 200) == "99.5% (199/200)"
    s = GenerationStats(tokens=1, seconds=0.5, rounds=1)
    assert s.summary_line().startswith("1 token, 2.0 tok/s, acceptance - (nothing drafted), 1.00 tokens/target pass")


def test_prompt_rate_counts_only_the_tokens_its_time_fed():
    target = tiny.make_llama(1)
    e = Engine(target, None, drafter="ngram")
    s = e.generate(PROMPT, max_tokens=4).stats
    # The last prompt token is fed with the first pass, which `seconds` times, not `prompt_seconds`.
    assert s.prefilled_tokens == len(PROMPT) and s.prompt_timed_tokens == len(PROMPT) - 1
    assert s.prompt_tokens_per_second == pytest.approx((len(PROMPT) - 1) / s.prompt_seconds)
    again = e.generate(PROMPT, max_tokens=4).stats  # the caches hold all but the prompt's last token
    assert again.prefilled_tokens == 1 and again.prompt_timed_tokens == 0 and again.prompt_tokens_per_second == 0.0


def test_a_request_cancelled_before_it_starts_still_reports_the_memory_it_holds():
    import threading

    e = Engine(tiny.make_llama(1), None, drafter="ngram")
    e.generate(PROMPT, max_tokens=4)
    stop = threading.Event()
    stop.set()
    r = e.generate(PROMPT + [13], max_tokens=4, cancel=stop)
    assert r.finish_reason == "cancelled" and r.stats.peak_memory_bytes >= e.target_weights_bytes > 0


def test_time_to_first_token_is_the_prompt_and_the_first_pass():
    e = Engine(tiny.make_llama(1), None, drafter="ngram")
    t0 = time.perf_counter()
    s = e.generate(PROMPT, max_tokens=6).stats
    wall = time.perf_counter() - t0
    assert 0 < s.prompt_seconds < s.first_token_seconds < s.prompt_seconds + s.seconds <= wall  # parts of the call
    first = next(iter(e.stream(PROMPT + [14], max_tokens=6)))  # known when the first token is
    assert first.stats.first_token_seconds == first.stats.prompt_seconds + first.stats.seconds > 0
    stop = __import__("threading").Event()
    stop.set()
    assert e.generate(PROMPT + [13], max_tokens=6, cancel=stop).stats.first_token_seconds == 0.0


def test_the_cli_stats_line_counts_tree_and_lookup_rounds():
    from mlxspec.commands.generate import stats_line

    s = GenerationStats(tokens=10, seconds=1.0, rounds=4, drafted=8, accepted=6, tree_rounds=1, lookup_rounds=2,
                        lookup_drafted=4, lookup_accepted=3)
    line = stats_line(s)
    assert "acceptance 75% (6/8)" in line and "2 rounds by lookup (3/4)" in line and "1 tree round," in line
    assert "tree round" not in stats_line(GenerationStats(tokens=3, seconds=1.0, rounds=3))
    one = GenerationStats(tokens=5, seconds=1.0, rounds=3, drafted=2, accepted=1, lookup_rounds=1, lookup_drafted=2,
                          lookup_accepted=1)
    assert "1 round by lookup (1/2)" in stats_line(one)
    predicted = GenerationStats(tokens=5, seconds=1.0, rounds=2, prediction_accepted=4, prediction_rejected=3)
    assert "prediction 4 of 7 tokens in the answer, " in stats_line(predicted) and "prediction" not in stats_line(one)


def test_plain_decoding_counts_no_drafting_and_the_memory_it_holds():
    """Every count of drafting starts at zero for each generation (a default of 1 would print a lookup,
    tree or forced round that never ran); the memory figures are measured, not left at zero."""
    s = Engine(tiny.make_llama(1), drafter="none").generate(PROMPT, max_tokens=12).stats
    assert (s.tokens, s.rounds, s.prompt_tokens, s.prefilled_tokens, s.prompt_timed_tokens) == (12, 12, 11, 11, 10)
    drafting = ("drafted", "accepted", "tree_rounds", "lookup_rounds", "lookup_drafted", "lookup_accepted",
                "forced_rounds", "forced_drafted", "forced_accepted", "prediction_accepted",
                "prediction_rejected", "last_k", "draft_weights_bytes", "draft_kv_bytes", "parked_kv_bytes")
    assert {name: getattr(s, name) for name in drafting} == dict.fromkeys(drafting, 0)
    assert not s.last_tree and not s.last_lookup and s.step_reached == [] and s.tree_histogram == {}
    assert s.target_weights_bytes > 0 and s.target_kv_bytes > 0 and s.peak_memory_bytes > 0


def test_host_time_per_round_is_what_the_loop_did_not_wait():
    s = GenerationStats(seconds=2.0, wait_seconds=0.5, rounds=3)
    assert s.host_seconds_per_round == pytest.approx(0.5) and GenerationStats().host_seconds_per_round == 0.0


def test_each_event_names_the_pass_that_gave_it():
    """`round` counts target passes from 0: a round's accepted drafts and the target's own token
    after them share one, and the next pass is the next number."""
    e = Engine(tiny.make_llama(1), None, drafter="ngram", num_draft=3)
    events = list(e.stream(PROMPT, max_tokens=30))
    rounds = [ev.round for ev in events]
    assert rounds[0] == 0 and rounds[-1] == events[-1].stats.rounds - 1
    assert all(b - a in (0, 1) for a, b in zip(rounds, rounds[1:])) and len(set(rounds)) < len(rounds)
    for a, b in zip(events, events[1:]):  # a pass gives its accepted drafts, then the target's own token
        assert b.round == (a.round if a.from_draft else a.round + 1)

"""A model drafter's lookup companion: rounds handed to prompt lookup stay lossless and teach
the lookup's cost model, not the model drafter's.

Time is virtual (as in test_engine_costs): reading a pass advances the loop's clock by a
GPU-like cost, nearly flat in its length, and drafting costs nothing, so drafting pays and
which drafter wins a round does not depend on how busy the machine running the tests is.
"""

import numpy as np
import pytest

import tiny
from mlxspec import Engine, loop
from mlxspec.errors import InvalidArgumentError
from mlxspec.sampling import SamplingParams
from test_engine_costs import clock  # noqa: F401  (the fixture)
from test_engine_sampling import N, VOCAB as SAMPLING_VOCAB, exact_joint

# The tiny llama's greedy text falls into a cycle quickly, which a lookup predicts.
PROMPT = [5, 6, 7, 8, 9, 10, 5, 6, 7, 11, 12]


@pytest.fixture(scope="module")
def target():
    return tiny.make_llama(1, layers=1)


@pytest.fixture(scope="module")
def weak_head(target, tmp_path_factory):
    # Random weights and every third id only: it rarely drafts what the target says.
    return tiny.make_eagle_head(target, tmp_path_factory.mktemp("weak"), seed=3,
                                draft_ids=list(range(0, tiny.VOCAB, 3)))


@pytest.fixture
def timed(monkeypatch, clock):
    real = loop.read

    def read(p):
        clock.t += 2e-3 + 1e-4 * p.fed
        return real(p)

    monkeypatch.setattr(loop, "read", read)
    return clock


@pytest.fixture
def steep(monkeypatch, clock):
    real = loop.read

    def read(p):
        clock.t += 2e-3 * p.fed  # every row costs a whole step: drafting cannot pay
        return real(p)

    monkeypatch.setattr(loop, "read", read)
    return clock


def engine_for(kind, target, head, **kw):
    if kind == "eagle":
        return Engine(target, None, eagle_head=head, drafter="eagle", **kw)
    # Random, and unlike seeds 3, 4 and 7 it does not fall into the target's cycle (those then
    # rightly win the rounds from the lookup).
    draft = tiny.make_llama(5, layers=1, hidden=16)
    return Engine(target, None, draft, drafter="model", **kw)


@pytest.mark.parametrize("kind", ["eagle", "model"])
def test_lookup_drafts_where_it_pays_and_greedy_stays_plain(kind, target, weak_head, timed):
    e = engine_for(kind, target, weak_head)
    plain = e.generate(PROMPT, max_tokens=120, speculative=False).tokens
    on = e.generate(PROMPT, max_tokens=120)
    assert on.tokens == plain
    s = on.stats
    assert s.lookup_rounds > 0 and 0 < s.lookup_drafted <= s.drafted and s.lookup_accepted <= s.accepted
    # The cycle is predictable: lookup rounds carry most of the output.
    assert s.lookup_accepted > 0.5 * s.lookup_drafted
    off = e.generate(PROMPT, max_tokens=120, lookup=False)
    assert off.tokens == plain and off.stats.lookup_rounds == 0


def test_lookup_rounds_teach_the_lookup_cost_model(target, weak_head, timed):
    e = engine_for("eagle", target, weak_head)
    r = e.generate(PROMPT, max_tokens=120)
    assert r.stats.lookup_rounds > 0
    # Acceptance of lookup proposals is learnt per n-gram kind on the n-gram's own model...
    assert any(kind.startswith(("n", "a")) for kind in e.costs["ngram"].counts)
    # ...and the head's model only ever sees its own (kind "") rounds, and its trees' side leaves.
    assert {kind.split("/")[0] for kind in e.costs["eagle"].counts} <= {""}


def test_fixed_draft_length_means_the_model_drafts_every_round(target, weak_head, timed):
    e = engine_for("eagle", target, weak_head)
    r = e.generate(PROMPT, max_tokens=60, num_draft=3)
    assert r.stats.lookup_rounds == 0 and r.stats.drafted > 0


@pytest.mark.parametrize("kind", ["eagle", "model"])
def test_greedy_probes_of_a_model_that_does_not_pay_verify_nothing(kind, target, weak_head, steep):
    """Where drafting cannot pay, a model drafter is still re-tested now and then: greedy, its
    first draft token is checked against the token the next plain step gives (no verify rows);
    sampled, a k = 1 round (measured faster there than a guess, `Planner.probe_instead`)."""
    e = engine_for(kind, target, weak_head)
    plain = e.generate(PROMPT, max_tokens=200, speculative=False).tokens
    r = e.generate(PROMPT, max_tokens=200, lookup=False)
    assert r.tokens == plain
    # No probe verified rows. Real rounds may, once per length: a length is a guess until a round
    # times it (the prior's, or interpolated), and a draft model whose guesses hold up can look
    # worth it until then; once timed, it is not tried again within STALE_ROUNDS.
    drafted_rounds = {k: n for k, n in r.stats.k_histogram.items() if k}
    assert all(n == 1 for n in drafted_rounds.values()), r.stats.k_histogram
    assert r.stats.rounds >= 200 - r.stats.drafted
    s, f = e.costs[kind].counts[""]  # ...yet probes were checked: the Beta(1, 1) prior moved
    assert (s, f) != (1.0, 1.0)
    sampled = e.generate(PROMPT, max_tokens=200, lookup=False, temperature=0.8, seed=0)
    assert 0 < sampled.stats.drafted == sampled.stats.k_histogram.get(1, 0)
    assert sampled.tokens == e.generate(PROMPT, max_tokens=200, speculative=False, temperature=0.8, seed=0).tokens


def test_lookup_must_be_a_bool(target, weak_head):
    with pytest.raises(InvalidArgumentError, match="lookup must be True or False"):
        Engine(target, None, eagle_head=weak_head, drafter="eagle", lookup="yes")
    e = Engine(target, None, eagle_head=weak_head, drafter="eagle")
    with pytest.raises(InvalidArgumentError, match="lookup must be True or False"):
        e.generate(PROMPT, max_tokens=4, lookup=1)


def test_mixed_rounds_sample_the_target(tmp_path, timed):
    """Rounds drafted by the head (its q) and by lookup (deterministic) in one engine: the first
    two sampled tokens follow the target's exact law (tolerance: 4x the expected total variation
    of N draws), and both kinds of round occurred."""
    params = SamplingParams(0.9, top_p=0.95)
    t = tiny.make_llama(5, vocab_size=SAMPLING_VOCAB, hidden=32, layers=1)
    head = tiny.make_eagle_head(t, tmp_path, seed=7, draft_ids=list(range(1, SAMPLING_VOCAB, 2)))
    # The lookup proposes 10 (after "0 4"), which the target samples 41 % of the time, about as
    # often as the head's q is accepted: each wins some rounds (found by a search over prompts).
    prompt = [0, 4, 10, 0, 4]
    e = Engine(t, None, eagle_head=head, drafter="eagle")
    joint = exact_joint(t, params, prompt)
    counts = np.zeros((SAMPLING_VOCAB, SAMPLING_VOCAB))
    lookup_rounds = head_drafts = 0
    for seed in range(N):
        # Each request starts from the uniform prior, as on a fresh engine: the head's own rate
        # over the earlier ones would make it draft about half as often, and this test is the
        # stronger for checking many rounds of each kind.
        e.costs["eagle"].longrun.clear()
        r = e.generate(prompt, max_tokens=2, temperature=params.temperature, top_p=params.top_p, seed=seed)
        counts[r.tokens[0], r.tokens[1]] += 1
        lookup_rounds += r.stats.lookup_rounds
        head_drafts += r.stats.drafted - r.stats.lookup_drafted
    assert lookup_rounds > N // 10 and head_drafts > N // 10, (lookup_rounds, head_drafts)
    tv = 0.5 * np.abs(counts / N - joint).sum()
    tol = 4 * 0.5 * np.sqrt(joint * (1 - joint) / N).sum()
    assert tv <= tol, f"TV {tv:.4f} > {tol:.4f}"


def test_a_round_that_re_times_a_length_is_a_chain(target, weak_head, timed, monkeypatch):
    """A round the cost model drafts to re-time a pass length (`CostModel._explore`) verifies
    that length: no side leaves, which would lengthen the pass and leave the length's estimate
    warm-up's (on an H100 the head's every round was such a tree, and a 2-token pass stayed
    priced 30 % above the loop's own timing)."""
    from mlxspec import treeplan
    from mlxspec.costmodel import CostModel

    monkeypatch.setattr(treeplan, "static_leaves", lambda cost, k, tree: 1)  # side leaves always "pay"
    e = engine_for("eagle", target, weak_head)
    plain = e.generate(PROMPT, max_tokens=60, speculative=False).tokens
    monkeypatch.setattr(CostModel, "_explore", lambda self, reach, best, stopped=False: 1)
    r = e.generate(PROMPT, max_tokens=60, lookup=False, tree=4)
    assert r.tokens == plain and r.stats.drafted > 0 and r.stats.tree_rounds == 0
    # The same rounds, chosen because they pay, carry side leaves.
    real = CostModel.choose_nodes

    def pays(self, reach):
        real(self, reach)  # for the flags it sets on the round (not exploring)
        return 1 if reach else 0

    monkeypatch.setattr(CostModel, "_explore", lambda self, reach, best, stopped=False: 0)
    monkeypatch.setattr(CostModel, "choose_nodes", pays)
    r = e.generate(PROMPT, max_tokens=60, lookup=False, tree=4)
    assert r.tokens == plain and r.stats.tree_rounds > 0


def test_forget_beyond_drops_the_answers_taken_back_from_prompt_lookup_and_nothing_else():
    from mlxspec.drafters import NgramDrafter

    engine = Engine(tiny.make_llama(3, tie_embeddings=False), tiny.make_tokenizer(tiny.CHAT_TEMPLATE), drafter="ngram")
    assert not engine.forget_beyond("anything")  # nothing held yet
    chat = [{"role": "user", "content": "Rivers run to the sea because"}]
    first = engine.generate(chat, max_tokens=40, num_draft=4)
    ngram = engine.drafters["ngram"]
    ids = engine.tokenizer.encode(engine.tokenizer.apply_chat_template(chat, tokenize=False,
                                                                       add_generation_prompt=True))
    assert len(ngram._corpus) > len(ids) and ngram._corpus[:len(ids)] == ids  # it had indexed the answer
    assert not engine.forget_beyond(ids + first.tokens + [5, 6])  # a prompt that holds it all: all kept
    assert engine.forget_beyond(chat)  # the turn retried: its answer is forgotten
    fresh = NgramDrafter()
    fresh.propose(ids, 1)
    assert (ngram._corpus, ngram._index) == (fresh._corpus, fresh._index)  # as if the answer never was
    assert not engine.forget_beyond(chat)  # nothing left to forget
    again = engine.generate(chat, max_tokens=40, num_draft=4)
    assert again.tokens == first.tokens  # greedy, from caches that still held the old answer

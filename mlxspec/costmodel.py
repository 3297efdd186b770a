"""Pick the draft length k from measured costs and acceptance.

With per-token acceptance probability a, a round that drafts k tokens yields on average
    E(k) = (1 - a^(k+1)) / (1 - a)          tokens (accepted drafts + the target's own)
and costs
    T(k) = k * c + V(k + 1)                  seconds,
where c is the drafter's seconds per token and V(j) the wall time of a round whose target
pass is over j tokens (host work, device time and the one host read). Plain decoding
keeps the next step in flight while the host reads the last one, so it costs P <= V(1)
per token. Each round takes the k in [0, k_max] with the highest E(k) / T(k), k = 0
meaning plain decoding at 1 / P; drafting must beat that by a 5% margin.

The target's costs (`target_curve.TargetCurve`, one per engine, shared by every drafter) are
kept at the host's pace, which drifts and moves every cost alike; a length never timed is
interpolated from the timed ones. Every cost is a robust estimate that holds back stalls
(`estimate.Estimate`). A draft cost that keeps its drafter from drafting is re-timed at its
prior by a round of 1 after C_STALE rounds, and a lower timing replaces it, as any re-timing
round's does (a slower spell's or stalls' cost would otherwise never be timed again); one timed
fewer than three times, within a few rounds (one slow round is not yet a cost). Re-timing rounds
are the model drafter's even where lookup would draft instead. Lengths whose estimate is old,
only interpolated or still warm-up's are re-timed now and then when they could beat the current
choice, so neither a stall nor a stale number can lock drafting out (a length timed only at its
first use on a GPU is priced at what the other lengths predict when lower: `TargetCurve.unsure`).
A model drafter's rounds teach its draft cost (the typical round of that shape, the median
of the recent ones, less V(k + 1)); a typical round that beats V(k + 1) alone shows that V
too high, and corrects it instead; a round at a length never timed times V(k + 1) (the
round less the draft cost's estimate). A round whose drafts were read on the host before
its pass (a model drafter's tree: `treeplan.widen`) also pays that read, during which the
device idles; it teaches its own cost, `read_seconds`, not c, and side leaves are added only
where they pay for it. So does a fixed-shape tree's pass, dearer than a chain's of its length
on a GPU (`static_seconds`).

Acceptance and draft cost (`CostModel`) are per drafter. Acceptance is kept per *kind* of proposal:
the n-gram drafter labels drafts by match length (a 3-token match is far more reliable than
a 1-token one), and a free drafter proposes first so the engine picks k for that kind.
Lookup's kinds come and go with the text and are forgotten fast; a model drafter's acceptance is
mostly the pair's and is forgotten slowly (`MODEL_DECAY`). A new request weakens every estimate
toward what its kind did over the last few hundred rounds (`LONG_DECAY`), so short requests do
not each relearn a poor drafter from a uniform prior. A model drafter that stopped drafting
is re-tested by probes: greedy, a guess of the next token checked for free, every GUESS_EVERY
plain rounds; sampled, a k = 1 round, at intervals that double while they fail.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from .estimate import Estimate
from .target_curve import TargetCurve

STALE_ROUNDS = 256  # an estimate older than this many rounds is re-timed when it could pay
EXPLORE_EVERY = 32  # rounds between re-timings
# A draft cost nothing re-timed for this many rounds while it kept its drafter from drafting is
# explored at its prior, and the next timing replaces it (the host's speed drifts: 5-11 ms a token
# from one prompt to the next on an H100, and a cost from another spell is another machine's).
C_STALE = 32
UNSURE_BELOW, UNSURE_EVERY = 3, 4  # a draft cost timed fewer times that stops drafting is re-timed this often
PROBE_FIRST, PROBE_LAST = 16, 128  # plain rounds between a model drafter's probes: first, and most
# Plain rounds between greedy probes, which verify nothing: the drafter's first token is checked
# against the token the plain step gives (one drafting step, ~6 % of a plain step for the demo's
# head). They never back off: a drafter that stopped must see the text change to resume.
GUESS_EVERY = 8
# How fast acceptance estimates forget, per round. Prompt lookup's kinds come and go with the text,
# so they forget fast. A model drafter's acceptance is mostly the pair's, and on a GPU it pays from
# about 0.2 per token (a 2-token round costs ~1.15 plain steps): with the fast rate, a run of five
# misses (one in twenty at 0.45) reads as 0.18 and stops it until probes restore it (on H100-shaped
# costs, tests/test_engine_costs.py: 90 % of rounds drafted at 0.85, all but one at 0.97).
DECAY, MODEL_DECAY = 0.85, 0.97
# A new request starts each kind's estimate from what the kind has done over the last few hundred
# rounds (forgotten this slowly, per round), not from the uniform prior: on short requests (a chat's
# 16-token answers) a drafter far worse than 0.5 spent most of each request relearning that it was
# (a head for the base target under a fine-tuned adapter ran at 0.98x plain decoding).
LONG_DECAY = 0.995
# ... from the kind's prior at the weight of this many rounds: a few unlucky first rounds must not
# set where every later short request starts (a test's head, sampled, lost its first 5 drafts and,
# its 2-token requests too short for a probe and lookup drafting the rest, never drafted again).
LONG_PRIOR = 20.0


def chain_reach(alpha: float, k: int) -> List[float]:
    """Acceptance probability of each of k chained drafts: alpha, alpha^2, ... (alpha capped below 1)."""
    a = min(alpha, 0.999)
    out, r = [], 1.0
    for _ in range(k):
        r *= a
        out.append(r)
    return out



class CostModel:
    """One drafter's acceptance and cost, choosing k against the engine's shared `TargetCurve`."""

    def __init__(self, curve: Optional[TargetCurve] = None, *, k_max: int = 15, decay: float = DECAY,
                 draft_is_free: bool = False, prior_draft_ratio: Optional[float] = None, margin: float = 1.05):
        self.curve = curve if curve is not None else TargetCurve()
        self.k_max = k_max
        self.decay = decay
        self.draft_is_free = draft_is_free
        self.prior_draft_ratio = prior_draft_ratio  # drafter seconds per token / plain step, until measured
        self.c = Estimate()  # drafter seconds per drafted token
        self.round_seconds: Dict[tuple, Estimate] = {}  # (k, drafter steps, read, static) -> this drafter's whole rounds
        self.read = Estimate()  # what reading the drafts on the host before the pass adds to a round
        self.static = Estimate()  # what a fixed-shape tree's pass adds to a chain pass of its length
        self.counts: Dict[str, list] = {}  # kind -> [successes, failures], from a Beta prior (1, 1 unless given)
        self.priors: Dict[str, tuple] = {}  # kind -> its Beta prior, when not (1, 1)
        self.longrun: Dict[str, list] = {}  # kind -> [successes, failures] across requests (LONG_DECAY)
        self.margin = margin  # drafting must beat plain decoding by this factor: estimates are noisy
        self.rounds_since_draft = 0
        self.probe_every = PROBE_FIRST  # plain rounds between probes of a model drafter (doubles while probes fail)
        self.probing = False  # the last `choose` returned a probe (1), not a length expected to pay
        self.exploring = False  # the last `choose` returned a length to re-time (`_explore`): verify it as a chain
        self.probe_out: Optional[str] = None  # the kind whose probe's outcome is still to come
        self.guess_probes = False  # probes are greedy guesses (the loop sets it per request): GUESS_EVERY
        self.rounds_since_explore = 0
        self.greedy = False  # whose acceptance `counts` holds: greedy or sampled requests' (`set_greedy`)
        self._other_counts: Dict[str, list] = {}  # the other mode's
        self._other_longrun: Dict[str, list] = {}

    # -- observations -----------------------------------------------------------------------
    def observe_round(self, k: int, seconds: float, drafted: Optional[int] = None,
                      read: Optional[bool] = None, static: bool = False, retime: bool = False) -> None:
        """A round that verified k drafts (k = 0: a plain step, not pipelined) took `seconds`,
        drafting included. `drafted`: the drafter's steps, when fewer than k (a tree's side
        leaves cost none); `read`: the drafts were read on the host before the pass (a model
        drafter's read tree; by default, whenever `drafted` is given); `static`: a fixed-shape
        tree, left on the device (`treeplan.static_leaves`); `retime`: a round `_explore` chose
        to re-time a cost, whose timing replaces a higher estimate (one from a slower spell or
        from stalls, which kept itself from being re-timed)."""
        if k and not self.draft_is_free:
            curve = self.curve
            # Everything below is at pace 1 (`TargetCurve.pace`).
            v = curve.verify_base(k + 1)
            read = drafted is not None and not static if read is None else read
            steps = drafted or k
            # What the round pays beyond its pass and its steps, learned apart from c: a read tree's
            # read, a fixed-shape tree's dearer pass.
            over = self.read if read else self.static if static else None
            if v is None:
                return
            typical = self.round_seconds.setdefault((k, steps, read, static), Estimate())
            # A shape's rounds tell the host's pace, as plain steps do (a shape never timed yet, as
            # always in the first-timing branch below, tells nothing); while the pace is read anew,
            # no timing is learnt at the old one.
            if not curve.pace_sample(seconds, typical):
                return
            # V is never taken below a plain step: a draft cost that absorbed other work must not
            # make a pass look free.
            floor = curve.plain.value() or 0.0
            c = self._draft()
            if curve.age(k + 1) is None or curve.unsure(k + 1):
                # V(k + 1) is only a guess (interpolated, or the prior's), or a first use's timing
                # doubted: this round times it, less the drafting's current estimate. Teaching the
                # draft cost instead would leave the length untimed, its guess never corrected.
                extra = steps * c + self._over(over)
                curve.add_verify(k + 1, max(seconds / curve.pace - extra, floor))
                return
            # Judge the typical round of this shape, not this one: a single round's noise would
            # go to the draft cost when slow and to V when fast, and the two would drift apart
            # (V down, c up, so long drafts would look dearer than they are).
            x = seconds / curve.pace
            # A shape's first round is judged against what it should cost (later ones, against the estimate).
            expected = None
            if not len(typical):
                expected = v + steps * c + self._over(over)
            if not typical.add(x, curve.now, guess=expected, fresh_after=0 if retime else None):
                return  # held back as a stall
            t = typical.value()
            if over is not None:
                # The steps cost what chain rounds teach; the rest is the tree's own: a read and what
                # waited for it (the device idles while the host reads the drafts and builds the
                # pass), or a fixed-shape tree's pass, dearer than a chain's of its length (its
                # ancestor mask: 19 ms against 12.6 for 3 rows on an H100). Either would make every
                # chain look dear if it went to c (on the H100, c went from 0.9 ms to 13).
                work = steps * c
                if t >= v + work:
                    over.add(t - v - work, curve.now)
                    curve.touch(k + 1)
                else:  # the tree cost nothing of its own
                    over.add(0.0, curve.now)
                    # Only a round under V(k + 1) alone shows V too high, as below. Between V and V
                    # plus the steps, whether V or c is too high cannot be told: lowering V by c
                    # there, while chain rounds teach c as the round less V, let the two walk apart
                    # with the noise (a replay of the H100: V(2) 11.6 -> 10.6 ms, c 0.3 -> 2.2,
                    # and k = 1 chosen where k = 2 pays); chain rounds correct c instead.
                    if t < v:
                        curve.add_verify(k + 1, max(t - work, floor))
            elif t >= v:
                self.c.add((t - v) / steps, curve.now, fresh_after=0 if retime else C_STALE)
                curve.touch(k + 1)  # V(k + 1) is not too high: no need to re-time it soon
            else:
                # The typical round, drafting included, beats the curve's V(k + 1) alone: that V
                # is too high (a warm-up outlier, or the machine got faster). Only rounds of this
                # drafter time this length when nothing else drafts, so it must be corrected
                # here, or the length would look too dear to be chosen again and never re-timed.
                curve.add_verify(k + 1, max(t - steps * (self.c.value() or 0.0), floor))
            return
        self.curve.observe(k + 1, seconds)

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        """Drafting n tokens took `seconds` on its own (warm-up measures it so)."""
        if n_tokens > 0:
            self.c.add(seconds / n_tokens / self.curve.pace, self.curve.now)

    def observe_acceptance(self, drafted: int, accepted: float, kind: str = "", *, prior=(1.0, 1.0)) -> None:
        """A round's outcome; `accepted` may be fractional (an expected value). `prior`: the Beta
        prior of a kind seen for the first time."""
        if drafted <= 0:
            return
        if kind not in self.counts:
            self.counts[kind], self.priors[kind] = list(prior), tuple(prior)
        if kind not in self.longrun:
            s0, f0 = self.priors.get(kind, prior)
            self.longrun[kind] = [LONG_PRIOR * s0 / (s0 + f0), LONG_PRIOR * f0 / (s0 + f0)]
        longrun = self.longrun[kind]
        if kind == self.probe_out:  # a probe's outcome: back off while probes fail, start over when one holds
            self.probe_out = None
            if not self.guess_probes:
                self.probe_every = PROBE_FIRST if accepted >= 1 else min(2 * self.probe_every, PROBE_LAST)
        failed = min(1.0, drafted - accepted)
        for c, decay in ((self.counts[kind], self.decay), (longrun, LONG_DECAY)):
            c[0] = decay * c[0] + accepted
            c[1] = decay * c[1] + failed

    def set_greedy(self, greedy: bool) -> None:
        """Per request, before `new_request`. A greedy draft is accepted when it is the target's
        top token, a sampled one when it is the target's race winner: different rates, so each mode
        keeps its own counts, and a sampled turn cannot stop the next greedy one from drafting
        (nor the other way round)."""
        if greedy != self.greedy:
            self.counts, self._other_counts = self._other_counts, self.counts
            self.longrun, self._other_longrun = self._other_longrun, self.longrun
            self.greedy = greedy

    def new_request(self, keep: float = 0.25) -> None:
        """A new prompt may be a different kind of text: keep the acceptance estimates but
        weaken them toward what the kind did over recent requests (`longrun`, at the strength of
        its prior), so this request's own rounds soon outweigh the last one's; and probe a model
        drafter that stopped drafting at the first interval again (probes that failed on the
        last prompt say little about this one)."""
        self.probe_every = PROBE_FIRST
        for kind, c in self.counts.items():
            s0, f0 = self.priors.get(kind, (1.0, 1.0))
            ls, lf = self.longrun.get(kind, (s0, f0))
            mean = ls / (ls + lf)
            s0, f0 = mean * (s0 + f0), (1.0 - mean) * (s0 + f0)
            c[0] = s0 + keep * (c[0] - s0)
            c[1] = f0 + keep * (c[1] - f0)

    # -- estimates ----------------------------------------------------------------------------
    def alpha_of(self, kind: str = "", *, prior=(1.0, 1.0)) -> float:
        s, f = self.counts.get(kind, prior)
        return s / (s + f)

    def expected_tokens(self, k: int, kind: str = "") -> float:
        a = min(self.alpha_of(kind), 0.999)
        return (1.0 - a ** (k + 1)) / (1.0 - a)

    def draft_seconds(self) -> float:
        """Seconds per drafted token (0 for a free drafter), at the host's pace now."""
        return self._draft() * self.curve.pace

    def _draft(self) -> float:
        """Seconds per drafted token at pace 1."""
        if self.draft_is_free:
            return 0.0
        c = self.c.value()
        if c is not None:
            return c
        step = self.curve.plain_base() or 0.0
        return (self.prior_draft_ratio or 0.1) * step  # not timed yet: calibrated ratio, else a tenth

    def read_seconds(self) -> float:
        """What reading a model drafter's drafts on the host before the pass adds to a round.
        0 until a read round has been timed, and again once that timing is STALE_ROUNDS old: a
        read that once looked too dear would otherwise never be tried, so never re-timed."""
        return self._over_seconds(self.read)

    def static_seconds(self) -> float:
        """What a fixed-shape tree's pass adds to a chain's of the same length; 0 as `read_seconds`."""
        return self._over_seconds(self.static)

    def _over_seconds(self, over: Optional[Estimate]) -> float:
        return self._over(over) * self.curve.pace

    def _over(self, over: Optional[Estimate]) -> float:
        t = None if over is None else over.value()
        return 0.0 if t is None or self.curve.now - over.when >= STALE_ROUNDS else t

    def speed(self, k: int, kind: str = "") -> Optional[float]:
        """Expected tokens per second when drafting k (None if unknown)."""
        if k == 0:
            p = self.curve.plain_seconds()
            return None if p is None else 1.0 / p
        v = self.curve.verify_seconds(k + 1)
        if v is None:
            return None
        return self.expected_tokens(k, kind) / (k * self.draft_seconds() + v)

    def choose(self, k_cap: Optional[int] = None, kind: str = "") -> int:
        """The draft length with the best expected speed, in [0, min(k_max, k_cap)]."""
        k_top = self.k_max if k_cap is None else max(0, min(self.k_max, k_cap))
        m = self.choose_nodes(chain_reach(self.alpha_of(kind), k_top))
        if self.probing:
            self.probe_out = kind
        return m

    def choose_nodes(self, reach: Sequence[float]) -> int:
        """How many candidates to verify: a chain's drafts or a tree's nodes, best first.

        `reach[i]` is the probability that candidate i is accepted; candidates come in the order
        they would be added (for a tree, each after its parent), so every prefix is a valid
        draft. A round over the first m yields 1 + sum(reach[:m]) tokens on average and costs
        m * c + V(m + 1). Returns the m in [0, min(k_max, len(reach))] with the best speed.
        """
        self.probing = self.exploring = False
        m_top = min(self.k_max, len(reach))
        if m_top == 0:
            return 0
        plain = self.speed(0)
        if plain is None:
            return 0  # time one plain step first: it is the unit everything is judged against
        best_m, best = 0, plain * self.margin
        c = self.draft_seconds()
        tokens = 1.0
        for m in range(1, m_top + 1):
            tokens += reach[m - 1]
            v = self.curve.verify_seconds(m + 1)
            if v is None:
                break
            s = tokens / (m * c + v)
            if s > best:
                best_m, best = m, s
        self.rounds_since_explore += 1
        # A model drafter that does not draft explores too: a length that warm-up timed too high,
        # or that only a too-steep prior priced (no warm-up), is timed by nobody else when no
        # free drafter drafts it.
        explored = self._explore(reach[:m_top], max(best, plain * self.margin), stopped=not best_m)
        self.exploring = bool(explored)
        m = explored or best_m
        if m or self.draft_is_free:
            if m:
                self.rounds_since_draft, self.probe_every = 0, PROBE_FIRST
            return m
        # Re-test now and then: acceptance drifts with the text. A model drafter costs a step to
        # probe, so probes back off while they keep failing; a free drafter is probed for free
        # by the engine's shadow check instead.
        self.rounds_since_draft += 1
        if self.rounds_since_draft >= (GUESS_EVERY if self.guess_probes else self.probe_every):
            self.rounds_since_draft = 0
            self.probing = True
            return 1
        return 0

    def choose_widening(self, k: int, tokens: float, reach: Sequence[float], extra: float = 0.0) -> int:
        """How many extra candidates (best first) to verify beside k drafted ones that yield
        `tokens` per round on average: rows that cost no drafting, only a longer pass, and
        `extra` seconds more for any (a tree's own cost: reading the drafts first, 0 once they
        are read, or a fixed-shape tree's pass beyond a chain's, `static_seconds`). Returns
        the m in [0, len(reach)] with the best expected speed (passes longer than the warm-up
        timed are estimated from the curve's slope)."""
        fixed = k * self.draft_seconds()
        v = self.curve.verify_seconds(k + 1)
        if v is None:
            return 0
        best_m, best = 0, tokens / (fixed + v)
        for m in range(1, len(reach) + 1):
            v = self.curve.verify_seconds(k + m + 1)
            if v is None:
                break
            tokens += reach[m - 1]
            if tokens / (fixed + extra + v) > best:
                best_m, best = m, tokens / (fixed + extra + v)
        return best_m

    def _explore(self, reach: Sequence[float], best: float, stopped: bool = False) -> int:
        """A size whose V is only interpolated, stale or warm-up's (provisional) and that could
        beat `best` if its pass were a quarter cheaper than estimated; at most one every
        EXPLORE_EVERY rounds. `stopped`: the estimates say not to draft at all."""
        # A draft cost timed fewer than 3 times is one noisy sample's (the minimum of two): it may
        # not stop a drafter until rounds confirm it, so it is re-timed within UNSURE_EVERY rounds,
        # not EXPLORE_EVERY (a single slow first round stopped a draft model for a whole request,
        # with its greedy probes hitting: they check a guess and time nothing).
        unsure_c = stopped and not self.draft_is_free and 0 < len(self.c) < UNSURE_BELOW
        if self.rounds_since_explore < (UNSURE_EVERY if unsure_c else EXPLORE_EVERY):
            return 0
        pick, pick_speed = 0, best
        c = self.draft_seconds()
        # A draft cost that stopped its drafter for C_STALE rounds (or that nothing re-timed for
        # STALE_ROUNDS) may be a stall's or a slower spell's: judged by its prior instead, or the
        # drafter would never be timed again. A round of 1, the cheapest, re-times it, and a lower
        # timing replaces it (`Estimate.add`'s fresh_after).
        age_c = self.curve.now - self.c.when
        stale_c = (not self.draft_is_free and bool(len(self.c))
                   and (age_c >= STALE_ROUNDS or (stopped and age_c >= C_STALE)))
        if stale_c and not unsure_c:
            reach = reach[:1]
        at_prior = stale_c or unsure_c  # any length may re-time it, fresh or not
        if at_prior:
            c = min(c, (self.prior_draft_ratio or 0.1) * (self.curve.plain_seconds() or 0.0))
        for m in range(1, len(reach) + 1):
            age = self.curve.age(m + 1)
            if not at_prior and age is not None and age < STALE_ROUNDS and not self.curve.provisional(m + 1):
                continue
            v = self.curve.verify_seconds(m + 1)
            s = None if v is None else (1.0 + sum(reach[:m])) / (m * c + 0.75 * v)
            if s is not None and s > pick_speed:
                pick, pick_speed = m, s
        if pick:
            self.rounds_since_explore = 0
        return pick

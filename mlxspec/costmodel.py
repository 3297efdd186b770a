"""Pick the draft length k from measured costs and acceptance.

With per-token acceptance probability a, a round that drafts k tokens yields on average
    E(k) = (1 - a^(k+1)) / (1 - a)          tokens (accepted drafts + the target's own)
and costs
    T(k) = k * c + V(k + 1)                  seconds,
where c is the drafter's seconds per token and V(j) the target's seconds for one pass
over j tokens (verification and host read included). k = 0 is plain decoding (E = 1,
T = V(1)). Each round takes the k in [0, k_max] with the highest E(k) / T(k) (drafting must beat
plain decoding by a 5% margin), so speculation falls back to plain decoding wherever it
cannot pay.

All three quantities are measured while the engine runs: V(j) and c as exponential
moving averages, a from a decayed count of accepts and first rejections (a round with
n accepted out of k shows n successes and, if n < k, one failure). Until a length j has
been timed, V(j) is interpolated from the timed ones (or a calibration curve).

Acceptance is kept per *kind* of proposal: a drafter may label its drafts (the n-gram
drafter labels them by match length, since a 3-token match is far more reliable than a
1-token one), and a free drafter proposes first so the engine picks k for that kind.
"""

from __future__ import annotations

from typing import Dict, Optional


class CostModel:
    def __init__(self, *, k_max: int = 12, prior_ratios: Optional[Dict[int, float]] = None,
                 prior_slope: float = 0.5, ema: float = 0.25, decay: float = 0.85,
                 draft_is_free: bool = False, prior_draft_ratio: Optional[float] = None):
        self.k_max = k_max
        self.prior_ratios = dict(prior_ratios or {})  # V(j)/V(1), e.g. from `mlxspec calibrate`
        self.prior_slope = prior_slope  # V(j)/V(1) = 1 + slope*(j-1) when nothing better is known
        self.ema, self.decay = ema, decay
        self.draft_is_free = draft_is_free
        self.prior_draft_ratio = prior_draft_ratio  # drafter seconds per token / V(1), until measured
        self.v: Dict[int, float] = {}  # j -> seconds of a target pass over j tokens
        self.c: Optional[float] = None  # drafter seconds per drafted token
        self.counts: Dict[str, list] = {}  # kind -> [successes, failures], Beta(1, 1) prior
        self.rounds_since_draft = 0
        self.probe_every = 16  # plain rounds between probes of a model drafter (doubles while probes fail)
        self.margin = 1.05  # drafting must beat plain decoding by this factor: estimates are noisy

    # -- observations -----------------------------------------------------------------------
    def observe_verify(self, j: int, seconds: float) -> None:
        old = self.v.get(j)
        self.v[j] = seconds if old is None else old + self.ema * (seconds - old)

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        if n_tokens <= 0:
            return
        per = seconds / n_tokens
        self.c = per if self.c is None else self.c + self.ema * (per - self.c)

    def observe_acceptance(self, drafted: int, accepted: float, kind: str = "") -> None:
        """A round's outcome; `accepted` may be fractional (an expected value, e.g. a shadow probe)."""
        if drafted <= 0:
            return
        c = self.counts.setdefault(kind, [1.0, 1.0])
        c[0] = self.decay * c[0] + accepted
        c[1] = self.decay * c[1] + min(1.0, drafted - accepted)

    def new_request(self, keep: float = 0.25) -> None:
        """A new prompt may be a different kind of text: keep the acceptance estimates but
        weaken them, so this request's own rounds soon outweigh the last one's."""
        for c in self.counts.values():
            c[0] = 1.0 + keep * (c[0] - 1.0)
            c[1] = 1.0 + keep * (c[1] - 1.0)

    # -- estimates ----------------------------------------------------------------------------
    def alpha_of(self, kind: str = "") -> float:
        s, f = self.counts.get(kind, (1.0, 1.0))
        return s / (s + f)

    def verify_seconds(self, j: int) -> Optional[float]:
        """Measured or interpolated V(j); None before any pass was timed."""
        if j in self.v:
            return self.v[j]
        if not self.v:
            return None
        known = sorted(self.v)
        if j in self.prior_ratios:  # scale the calibrated curve from the nearest timed length
            m = min(known, key=lambda x: abs(x - j))
            if m in self.prior_ratios:
                return self.v[m] * self.prior_ratios[j] / self.prior_ratios[m]
        lo = max((x for x in known if x < j), default=None)
        hi = min((x for x in known if x > j), default=None)
        ratio = lambda x: 1.0 + self.prior_slope * (x - 1)  # noqa: E731
        if lo is None:  # shorter than every timed length
            return self.v[hi] * ratio(j) / ratio(hi)
        if hi is not None:
            t = (j - lo) / (hi - lo)
            return self.v[lo] + t * (self.v[hi] - self.v[lo])
        if len(known) >= 2:  # longer than every timed length: continue the last slope
            a, b = known[-2], known[-1]
            return self.v[b] + max(0.0, (self.v[b] - self.v[a]) / (b - a)) * (j - b)
        return self.v[lo] * ratio(j) / ratio(lo)

    def expected_tokens(self, k: int, kind: str = "") -> float:
        a = min(self.alpha_of(kind), 0.999)
        return (1.0 - a ** (k + 1)) / (1.0 - a)

    def speed(self, k: int, kind: str = "") -> Optional[float]:
        """Expected tokens per second when drafting k (None if unknown)."""
        v = self.verify_seconds(k + 1)
        if v is None:
            return None
        if self.draft_is_free:
            c = 0.0
        elif self.c is not None:
            c = self.c
        else:  # not timed yet: the calibrated ratio, else a guess of a tenth of a target step
            c = (self.prior_draft_ratio or 0.1) * (self.verify_seconds(1) or v)
        return self.expected_tokens(k, kind) / (k * c + v)

    def choose(self, k_cap: Optional[int] = None, kind: str = "") -> int:
        """The draft length with the best expected speed, in [0, min(k_max, k_cap)]."""
        k_top = self.k_max if k_cap is None else max(0, min(self.k_max, k_cap))
        if k_top == 0:
            return 0
        if 1 not in self.v:
            return 0  # time one plain step first: it is the unit everything is judged against
        plain = self.speed(0)
        best_k, best = 0, plain * self.margin
        for k in range(1, k_top + 1):
            s = self.speed(k, kind)
            if s is not None and s > best:
                best_k, best = k, s
        if best_k:
            self.rounds_since_draft, self.probe_every = 0, 16
            return best_k
        # Re-test now and then: acceptance drifts with the text. A model drafter costs a step to
        # probe, so probes back off while they keep failing; a free drafter is probed for free
        # by the engine's shadow check instead.
        self.rounds_since_draft += 1
        if not self.draft_is_free and self.rounds_since_draft >= self.probe_every:
            self.rounds_since_draft = 0
            self.probe_every = min(2 * self.probe_every, 128)
            return 1
        return 0

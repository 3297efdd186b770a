"""Per-generation statistics and the records the generation loop yields."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Tuple, Union


def acceptance_text(accepted: int, drafted: int, past_end: int = 0) -> str:
    """Acceptance for people: "62% (31/50)", or "- (nothing drafted)": a rate of nothing is not 0%.
    `past_end`: accepted drafts the answer's end cut off (`GenerationStats.accepted_past_end`),
    said beside it: "100% (9/9; 7 past the end)"."""
    if not drafted:
        return "- (nothing drafted)"
    rate = f"{accepted / drafted:.0%}"
    if rate == "100%" and accepted < drafted:  # not all were: 99.9% (rounded down), not 100%
        rate = f"{math.floor(1000 * accepted / drafted) / 10:.1f}%"
    elif rate == "0%" and accepted:  # some were: 0.1% (rounded up), not 0%
        rate = f"{math.ceil(1000 * accepted / drafted) / 10:.1f}%"
    return f"{rate} ({accepted}/{drafted}" + (f"; {past_end} past the end)" if past_end else ")")


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


@dataclass
class GenerationStats:
    prompt_tokens: int = 0  # tokens in the prompt
    prefilled_tokens: int = 0  # of which actually processed (the rest reused from the last turn)
    prompt_seconds: float = 0.0  # prompt processing time, target and draft
    # Of prefilled_tokens, those fed within prompt_seconds: the prompt's last token is fed with the
    # first pass, which `seconds` times.
    prompt_timed_tokens: int = 0
    tokens: int = 0  # generated tokens (EOS included when it ended the generation)
    seconds: float = 0.0  # generation time after the prompt
    first_token_seconds: float = 0.0  # the prompt and the first pass: time to the first token (0.0: none)
    rounds: int = 0  # target passes after the prompt (one per round)
    drafted: int = 0  # draft tokens proposed
    # Draft tokens the target accepted: what verification judged, so it counts drafts past a stop
    # string or a closed stream too, which were accepted but never emitted (then > sum(from_draft)).
    accepted: int = 0
    wait_seconds: float = 0.0  # of `seconds`, time the host waited for the device (the rest is the loop's own)
    accept_histogram: dict = field(default_factory=dict)  # accepted-per-round -> rounds (drafting rounds only)
    k_histogram: dict = field(default_factory=dict)  # draft length per round -> rounds (0 = plain step)
    # mx.get_peak_memory() over the generation: it resets MLX's process-wide peak as it starts
    # (and includes the draft model's and head's weights)
    peak_memory_bytes: int = 0  # MLX's peak since the generation began (it resets MLX's process-wide counter)
    target_weights_bytes: int = 0
    draft_weights_bytes: int = 0
    target_kv_bytes: int = 0
    draft_kv_bytes: int = 0
    parked_kv_bytes: int = 0  # earlier conversations' caches kept by the engine's prompt cache
    drafter: str = "none"
    temperature: float = 0.0
    kernels: str = "reference"  # which verification path ran: "metal" or "reference"
    last_k: int = 0  # draft length of the latest round (live display); a tree's node count
    last_tree: bool = False  # the latest round verified a tree (branching), not a chain
    last_lookup: bool = False  # the latest round was drafted by a model drafter's lookup companion
    tree_rounds: int = 0  # rounds that verified a tree
    tree_histogram: dict = field(default_factory=dict)  # nodes per tree round -> rounds
    lookup_rounds: int = 0  # a model drafter's rounds drafted by prompt lookup instead (in rounds)
    lookup_drafted: int = 0  # of `drafted`, tokens those rounds proposed
    lookup_accepted: int = 0  # of `accepted`, tokens of those rounds accepted
    forced_rounds: int = 0  # rounds whose drafts were a grammar's forced tokens (response_format), in rounds
    forced_drafted: int = 0  # of `drafted`, tokens those rounds proposed
    forced_accepted: int = 0  # of `accepted`, tokens of those rounds accepted
    # OpenAI's Predicted Outputs: the prediction's tokens that appear in the answer, in order, and the rest
    prediction_accepted: int = 0
    prediction_rejected: int = 0
    # The drafter's own chain rounds (no tree, no lookup) by draft position i (index i - 1): rounds
    # whose i-th draft the target judged (every earlier one accepted), and those that accepted it.
    step_reached: list = field(default_factory=list)
    step_accepted: list = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def step_acceptance(self) -> List[float]:
        """Per draft position i, the probability that its draft is accepted once the target judges
        it (every earlier draft of the round accepted): EAGLE's n-alpha, n = i - 1."""
        return [a / r for a, r in zip(self.step_accepted, self.step_reached)]

    @property
    def judged_acceptance(self) -> float:
        """Of the drafter's own chain drafts the target judged, the fraction accepted: the
        per-token acceptance (EAGLE's alpha). `acceptance_rate` also counts the drafts after a
        rejection, which nobody judges; for a chain of k with per-token rate a, tokens per pass
        are (1 - a^(k+1)) / (1 - a)."""
        reached = sum(self.step_reached)
        return sum(self.step_accepted) / reached if reached else 0.0

    @property
    def accepted_past_end(self) -> int:
        """Accepted drafts after the answer's end: a stop string found inside a round's accepted
        run ends the text there. They count in the acceptance (the target did accept them), not
        in `tokens`, and so not in tokens per target pass either."""
        return min(self.accepted, max(0, self.rounds + self.accepted - self.tokens))  # (a scoring pass: no token)

    @property
    def tokens_per_target_pass(self) -> float:
        return self.tokens / self.rounds if self.rounds else 0.0

    @property
    def host_seconds_per_round(self) -> float:
        """Host time per target pass: what the loop itself costs while the device works or idles."""
        return (self.seconds - self.wait_seconds) / self.rounds if self.rounds else 0.0

    @property
    def prompt_tokens_per_second(self) -> float:
        """Prompt tokens fed per second of prompt processing; 0.0 when none was fed in it (a
        prompt the caches already held but for its last token)."""
        return self.prompt_timed_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    def record_round(self, k: int, n_accepted: int, *, tree: bool = False, lookup: bool = False,
                     forced: bool = False) -> None:
        self.rounds += 1
        if forced:
            self.forced_rounds += 1
            self.forced_drafted += k
            self.forced_accepted += n_accepted
        if lookup:
            self.lookup_rounds += 1
            self.lookup_drafted += k
            self.lookup_accepted += n_accepted
        self.last_k, self.last_tree, self.last_lookup = k, tree, lookup
        if tree:
            self.tree_rounds += 1
            self.tree_histogram[k] = self.tree_histogram.get(k, 0) + 1
        self.k_histogram[k] = self.k_histogram.get(k, 0) + 1
        if k:
            self.drafted += k
            self.accepted += n_accepted
            self.accept_histogram[n_accepted] = self.accept_histogram.get(n_accepted, 0) + 1
        if k and not tree and not lookup and not forced:
            judged = min(n_accepted + 1, k)
            grow = judged - len(self.step_reached)
            if grow > 0:
                self.step_reached += [0] * grow
                self.step_accepted += [0] * grow
            for i in range(judged):
                self.step_reached[i] += 1
                self.step_accepted[i] += i < n_accepted

    def as_dict(self) -> dict:
        d = asdict(self)
        d["accept_histogram"] = {str(k): v for k, v in sorted(self.accept_histogram.items())}
        d["k_histogram"] = {str(k): v for k, v in sorted(self.k_histogram.items())}
        d["tree_histogram"] = {str(k): v for k, v in sorted(self.tree_histogram.items())}
        d.update(tokens_per_second=self.tokens_per_second, acceptance_rate=self.acceptance_rate,
                 tokens_per_target_pass=self.tokens_per_target_pass, accepted_past_end=self.accepted_past_end,
                 step_acceptance=self.step_acceptance, judged_acceptance=self.judged_acceptance,
                 prompt_tokens_per_second=self.prompt_tokens_per_second,
                 host_seconds_per_round=self.host_seconds_per_round)
        return d

    # Mapping-style access, so `stats["tokens_per_second"]` works like `stats.tokens_per_second`.
    def __getitem__(self, key: str):
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def __contains__(self, key: str) -> bool:
        return key in self.keys()

    def keys(self) -> List[str]:
        return list(self.as_dict().keys())

    def summary_line(self) -> str:
        return (f"{plural(self.tokens, 'token')}, {self.tokens_per_second:.1f} tok/s, acceptance "
                f"{acceptance_text(self.accepted, self.drafted, self.accepted_past_end)}, "
                f"{self.tokens_per_target_pass:.2f} tokens/target pass, "
                f"peak memory {self.peak_memory_bytes / 2**20:.0f} MiB")


@dataclass
class TokenEvent:
    """One generated token, as `Engine.stream` yields it."""

    token: int
    text: str  # new text this token made printable ('' while held back)
    from_draft: bool  # True when an accepted draft token (the target only confirmed it)
    round: int  # index of the round (target pass) that produced it
    draft_len: int  # draft length of that round
    stats: GenerationStats  # live statistics (final once finish_reason is set)
    finish_reason: Optional[str] = None  # "stop" | "length" on the last event
    logprob: Optional[float] = None  # the target's log-probability of `token` (when `logprobs` was asked for)
    top_logprobs: Optional[List[Tuple[int, float]]] = None  # its row's best (token, logprob), best first
    # The first event's only, when `prompt_logprobs` was asked for: (token, log p given the tokens
    # before it, best (token, log p)) per prompt token; the first token's log p is None.
    prompt_logprobs: Optional[List[Tuple[int, Optional[float], List[Tuple[int, float]]]]] = None
    # The last event's, when finish_reason is "stop": the stop string found, or the token of
    # `stop_token_ids` that ended the answer (vLLM's stop_reason); None at the model's EOS.
    stop_reason: Union[str, int, None] = None


@dataclass
class GenerationResult:
    tokens: List[int]
    text: str
    finish_reason: str  # "stop" | "length" | "cancelled" (`cancel` was set before either)
    stats: GenerationStats
    from_draft: List[bool] = field(default_factory=list)
    logprobs: Optional[List[float]] = None  # per token, when asked for (`Engine.stream(logprobs=...)`)
    top_logprobs: Optional[List[List[Tuple[int, float]]]] = None  # per token, its row's best choices
    prompt_logprobs: Optional[list] = None  # per prompt token, when asked for (`TokenEvent.prompt_logprobs`)
    stop_reason: Union[str, int, None] = None  # the stop string or stop token that ended it (`TokenEvent.stop_reason`)

    def __repr__(self) -> str:  # the stats object is long; keep reprs readable
        return f"GenerationResult(tokens={len(self.tokens)}, finish_reason={self.finish_reason!r}, text={self.text[:60]!r})"

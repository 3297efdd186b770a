"""GET /metrics: what the server has done since it started, in Prometheus' text format.

Counters of answered requests, their tokens (as `usage` counts them), what speculation did
(drafted, accepted, target passes), the time spent, errors by status, and the time to the
first token as a histogram; gauges of the queue. Updated on the event loop as requests end.
"""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Dict, List, Optional

from ..stats import GenerationStats

TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)  # seconds


def count_error(app, status: int) -> None:
    """An error answer of `app` (a Starlette app serving an engine), by its HTTP status."""
    state = getattr(getattr(app, "state", None), "mlxspec", None)
    if state is not None:
        state.metrics.errors[status] += 1


class Metrics:
    def __init__(self, model: str, drafter: Optional[str]):
        self.model, self.drafter = model, drafter
        self.requests: Counter = Counter()  # endpoint -> requests answered whole
        self.cancelled = 0  # requests whose client left before the end
        self.errors: Counter = Counter()  # HTTP status -> error answers
        self.totals: Counter = Counter()
        self.ttft = [0] * (len(TTFT_BUCKETS) + 1)  # per bucket (the last: above every bound)
        self.ttft_sum = 0.0

    def answered(self, endpoint: str, usage: dict, runs: List[GenerationStats]) -> None:
        """A request answered whole: its `usage` and its generations' statistics."""
        self.requests[endpoint] += 1
        t = self.totals
        t["prompt_tokens"] += usage["prompt_tokens"]
        t["cached_prompt_tokens"] += usage["prompt_tokens_details"]["cached_tokens"]
        t["generation_tokens"] += usage["completion_tokens"]
        for s in runs:
            t["drafted_tokens"] += s.drafted
            t["accepted_tokens"] += s.accepted
            t["target_passes"] += s.rounds
            t["tree_rounds"] += s.tree_rounds
            t["lookup_rounds"] += s.lookup_rounds
            t["prompt_seconds"] += s.prompt_seconds
            t["generation_seconds"] += s.seconds
            if s.tokens:  # (a prompt only scored generated nothing)
                t["generations"] += 1
                self.ttft[bisect.bisect_left(TTFT_BUCKETS, s.first_token_seconds)] += 1
                self.ttft_sum += s.first_token_seconds

    def embedded(self, tokens: int) -> None:
        """An embeddings request answered whole, of `tokens` input tokens."""
        self.requests["embeddings"] += 1
        self.totals["embedding_tokens"] += tokens

    def render(self, running: bool, waiting: int, limit: int, prompt_cache=None) -> str:
        """The text format; `prompt_cache`: the engine's parked histories (`mlxspec.prompt_cache`)."""
        out: List[str] = []

        def metric(name: str, kind: str, text: str, samples: Dict[str, float]) -> None:
            out.append(f"# HELP mlxspec_{name} {text}")
            out.append(f"# TYPE mlxspec_{name} {kind}")
            out.extend(f"mlxspec_{name}{labels} {_number(v)}" for labels, v in samples.items())

        t = self.totals
        metric("info", "gauge", "The model served and its default drafter.",
               {_labels(model=self.model, drafter=self.drafter or "none"): 1})
        metric("requests_total", "counter", "Requests answered whole, by endpoint.",
               {_labels(endpoint=e): self.requests[e] for e in ("chat", "completion", "responses", "messages",
                                                                  "embeddings")})
        metric("requests_cancelled_total", "counter", "Requests whose client left before the end.",
               {"": self.cancelled})
        metric("errors_total", "counter", "Error answers, by HTTP status.",
               {_labels(status=str(s)): n for s, n in sorted(self.errors.items())} or {_labels(status="400"): 0})
        for name, text in (("prompt_tokens", "Prompt tokens (each prompt once, as usage counts them)."),
                           ("cached_prompt_tokens", "Prompt tokens the caches already held."),
                           ("generation_tokens", "Generated tokens."),
                           ("embedding_tokens", "Input tokens embedded."),
                           ("drafted_tokens", "Draft tokens proposed."),
                           ("accepted_tokens", "Draft tokens the target accepted."),
                           ("target_passes", "Target passes after the prompt (one per round)."),
                           ("tree_rounds", "Rounds that verified a draft tree."),
                           ("lookup_rounds", "Rounds a model drafter's prompt lookup drafted."),
                           ("generations", "Generations run (n and batches run several per request)."),
                           ("prompt_seconds", "Seconds spent on prompts."),
                           ("generation_seconds", "Seconds spent generating after the prompts.")):
            metric(f"{name}_total", "counter", text, {"": t[name]})
        buckets, seen = {}, 0
        for bound, n in zip(TTFT_BUCKETS, self.ttft):
            seen += n
            buckets[_labels(le=_number(bound))] = seen
        buckets[_labels(le="+Inf")] = seen + self.ttft[-1]
        out.append("# HELP mlxspec_time_to_first_token_seconds The prompt and the first pass, per generation.")
        out.append("# TYPE mlxspec_time_to_first_token_seconds histogram")
        out.extend(f"mlxspec_time_to_first_token_seconds_bucket{labels} {v}" for labels, v in buckets.items())
        out.append(f"mlxspec_time_to_first_token_seconds_sum {_number(self.ttft_sum)}")
        out.append(f"mlxspec_time_to_first_token_seconds_count {seen + self.ttft[-1]}")
        metric("requests_running", "gauge", "Requests the engine is running (0 or 1).", {"": int(running)})
        metric("requests_waiting", "gauge", "Requests waiting for the engine.", {"": waiting})
        metric("queue_limit", "gauge", "Requests that may wait (serve --queue).", {"": limit})
        if prompt_cache is not None:
            metric("prompt_cache_parked", "gauge", "Conversations parked for when they come back "
                   "(serve --prompt-cache-size).", {"": len(prompt_cache.parked)})
            metric("prompt_cache_bytes", "gauge", "Memory the parked conversations hold.", {"": prompt_cache.nbytes})
            metric("prompt_cache_evictions_total", "counter", "Parked conversations dropped to make room: one "
                   "that comes back is prefilled whole (a larger --prompt-cache-size keeps more).",
                   {"": prompt_cache.evicted})
        return "\n".join(out) + "\n"


def _labels(**labels: str) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(v: float) -> str:
    return repr(float(v)) if isinstance(v, float) else str(v)

"""A frozen copy of the engine's live statistics, safe to hand from the worker to the UI."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mlxspec.stats import plural


@dataclass(frozen=True)
class StatsView:
    tokens: int = 0
    tokens_per_second: float = 0.0  # own compute time only (see GenerationStats)
    acceptance_rate: float = 0.0
    tokens_per_target_pass: float = 0.0
    last_k: int = 0  # draft length of the latest round (a tree's node count)
    last_tree: bool = False  # the latest round verified a tree
    last_lookup: bool = False  # the latest round was drafted by prompt lookup (a model drafter's companion)
    drafted: int = 0
    prompt_tokens: int = 0
    prefilled_tokens: int = 0  # prompt tokens actually processed (the rest came from the cache)
    seconds: float = 0.0
    peak_memory_bytes: int = 0
    target_kv_bytes: int = 0
    draft_kv_bytes: int = 0
    drafter: str = "none"

    @classmethod
    def of(cls, stats) -> "StatsView":
        """Copy a `mlxspec.stats.GenerationStats` (or None -> zeros)."""
        if stats is None:
            return cls()
        return cls(tokens=stats.tokens, tokens_per_second=stats.tokens_per_second,
                   acceptance_rate=stats.acceptance_rate, tokens_per_target_pass=stats.tokens_per_target_pass,
                   last_k=stats.last_k, last_tree=stats.last_tree,
                   last_lookup=getattr(stats, "last_lookup", False), drafted=stats.drafted, prompt_tokens=stats.prompt_tokens,
                   prefilled_tokens=stats.prefilled_tokens, seconds=stats.seconds,
                   peak_memory_bytes=stats.peak_memory_bytes, target_kv_bytes=stats.target_kv_bytes,
                   draft_kv_bytes=stats.draft_kv_bytes, drafter=stats.drafter)

    def as_dict(self) -> dict:
        return asdict(self)

    def line(self, speculative: bool) -> str:
        """The pane's live line: `NN.N tok/s`, plus draft figures on the speculative side."""
        s = f"{self.tokens_per_second:.1f} tok/s · {plural(self.tokens, 'token')}"
        if speculative:
            accepted = f"{self.acceptance_rate:.0%}" if self.drafted else "-"  # a rate of nothing is not 0%
            s += (f" · accepted {accepted} · {self.tokens_per_target_pass:.2f} tok/pass"
                  f" · last {'lookup ' if self.last_lookup else ''}{'tree' if self.last_tree else 'draft'} "
                  f"{self.last_k}")  # the last round's length: "draft 0" alone read as a count of drafts
        return s


def format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024

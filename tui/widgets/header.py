"""Header: the pair (target, draft or drafter, precision, device) and memory."""

from __future__ import annotations

from typing import Dict, Optional

from rich.text import Text
from textual.widgets import Static

from ..info import PairInfo
from ..stats_view import StatsView, format_bytes


class PairHeader(Static):
    def __init__(self, info: Optional[PairInfo] = None, **kwargs):
        super().__init__(**kwargs)
        self.info = info
        # Per side, the last figures a finished answer measured: a running one's read 0 until it ends.
        self.stats: Dict[str, StatsView] = {}

    def on_mount(self) -> None:
        self._render_text()

    def on_resize(self) -> None:
        self._render_text()

    def set_info(self, info: PairInfo) -> None:
        self.info = info
        self._render_text()

    def set_stats(self, side: str, stats: StatsView) -> None:
        if stats.peak_memory_bytes or side not in self.stats:
            self.stats[side] = stats
            self._render_text()

    def _render_text(self) -> None:
        if self.info is None:
            self.update(Text("mlxspec chat · loading…", style="bold"))
            return
        i = self.info
        kv = sum(s.target_kv_bytes + s.draft_kv_bytes for s in self.stats.values())
        peak = max((s.peak_memory_bytes for s in self.stats.values()), default=0)
        pair = f"target {i.target} · draft {i.draft}"
        machine = f"{i.precision} · {i.device}"
        t = Text()
        t.append("mlxspec chat  ", style="bold")
        t.append(f"{i.name}", style="bold cyan")
        line = f"  {pair} · {machine}"
        if len(t) + len(line) > self.content_size.width > 0:
            # Too narrow for it all: the short facts first, so the cut falls in the long names
            # (a head's note is in the history too).
            line = f"  {machine} · {pair}"
        t.append(line + "\n")
        t.append("memory  ", style="bold")
        t.append(f"weights: target {format_bytes(i.target_weights_bytes)}")
        if i.draft_weights_bytes:
            t.append(f", draft {format_bytes(i.draft_weights_bytes)}")
        t.append(f" · KV {format_bytes(kv)}" + (f" ({i.kv_cache})" if i.kv_cache else "")
                 + f" · peak {format_bytes(peak) if peak else '—'}")
        self.update(t)

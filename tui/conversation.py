"""The conversation both sides hold: one user message per turn, two answers, and the verdict."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from mlxspec.errors import InvalidArgumentError
from mlxspec.files import write_all_atomic
from mlxspec.reasoning import make_splitter, split_whole
from mlxspec.stats import plural

from .stats_view import StatsView

SPEC, VANILLA = "speculative", "vanilla"
FEW_TOKENS = 16  # below this, a turn's speedup is flagged as noise
SIDES = (SPEC, VANILLA)


@dataclass
class Answer:
    text: str = ""
    from_draft: List[bool] = field(default_factory=list)  # per token
    finish_reason: Optional[str] = None  # "stop" | "length" | None when stopped or failed
    stats: StatsView = field(default_factory=StatsView)
    tokens: List[int] = field(default_factory=list)  # the token ids, for the greedy check


@dataclass
class Turn:
    user: str
    answers: Dict[str, Answer]
    temperature: float = 0.0
    stopped: bool = False  # Esc stopped it; the partial answers stay
    same_history: bool = True  # both sides started from the same messages (the chat always gives them so)
    # Answers that differ (greedy, or sampled with the turn's one seed), classified by the worker
    # (`mlxspec.bench.neartie.check_greedy`):
    # {"divergence": "rounding" | "bug" | "unclassified", "position": first differing token,
    #  "tokens": speculative tokens from there on, "reason": the float32 evidence}; None otherwise.
    divergence: Optional[dict] = None

    @property
    def speedup(self) -> Optional[float]:
        """Speculative tok/s ÷ vanilla tok/s, or None when either side has no rate yet."""
        s, v = self.answers[SPEC].stats.tokens_per_second, self.answers[VANILLA].stats.tokens_per_second
        return s / v if s > 0 and v > 0 else None

    @property
    def identical(self) -> bool:
        """The outputs match (when stopped early: the shorter one is a prefix of the other)."""
        a, b = self.answers[SPEC].text, self.answers[VANILLA].text
        if self.stopped:
            n = min(len(a), len(b))
            return a[:n] == b[:n]
        return a == b

    def verdict(self) -> str:
        """One line: the speedup and whether the two outputs agree (sampled ones too: both sides
        sample with one seed, which fixes every token's race, so they write the same text).

        Outputs that differ only after a rounding divergence (float32 ranks the two tokens within
        the working dtype's rounding) read "identical up to rounding (n tokens)", n being the
        speculative answer's tokens from that divergence on.
        """
        s, v = self.answers[SPEC].stats, self.answers[VANILLA].stats
        sp = self.speedup
        head = (f"speedup {sp:.2f}× ({s.tokens_per_second:.1f} vs {v.tokens_per_second:.1f} tok/s)"
                if sp is not None else "speedup n/a (a side produced no tokens)")
        if sp is not None and min(s.tokens, v.tokens) < FEW_TOKENS:
            # one slow step moves a rate over a handful of tokens by tens of per cent
            head += f" · {plural(min(s.tokens, v.tokens), 'token')}: too few to time well"
        kind = f"sampled (T={self.temperature:g})" if self.temperature > 0 else "greedy"
        if self.stopped and not (self.answers[SPEC].text or self.answers[VANILLA].text):
            return "stopped before the first token (nothing to compare)"
        if self.identical:
            same = f"{kind} outputs identical" + (" so far" if self.stopped else "")
        elif not self.same_history:
            same = ("outputs differ, as expected: the two conversations already differed "
                    "(an earlier turn was stopped or parted by rounding)")
        elif self.divergence and self.divergence["divergence"] == "rounding":
            same = f"{kind} outputs identical up to rounding ({self.divergence['tokens']} tokens)"
        else:
            at = first_difference(self.answers[SPEC].text, self.answers[VANILLA].text)
            same = (f"{kind} outputs differ from character {at} (unclassified: {self.divergence['reason']})"
                    if self.divergence and self.divergence["divergence"] == "unclassified"
                    else f"{kind} outputs DIFFER from character {at}")
        return f"{head} · {same}" + (" · stopped" if self.stopped else "")


def hard_breaks(text: str) -> str:
    """`text` for a Markdown file that renders its line breaks as written (as the chat shows them):
    two trailing spaces on each line followed by another within a paragraph; fenced code as is."""
    lines, fence = text.split("\n"), None
    for i, line in enumerate(lines[:-1]):
        mark = line.lstrip()[:3]
        if mark in ("```", "~~~"):
            fence = None if fence == mark else (fence or mark)
        elif fence is None and line.strip() and lines[i + 1].strip():
            lines[i] = line + "  "
    return "\n".join(lines)


def first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def answer_part(text: str, markers: Optional[Tuple[str, str]]) -> str:
    """What a later turn sees of an answer: without its reasoning (a thinking model's block, or
    gpt-oss's analysis channel and harmony's headers), as the server's `content` is. The pane
    shows the whole text."""
    if markers is None:
        return text
    end = text.find(markers[1])
    inside = end >= 0 and markers[0] not in text[:end]  # the template opened the block: it only closes
    return split_whole(make_splitter(markers, inside), text)[1]


class Conversation:
    """System prompt + finished turns. Both sides see one conversation, the one the history shows:
    the speculative answers (their reasoning left out where `markers`, the model's thinking
    markers, say where it is). After a stopped turn (the two sides cut at different tokens) or
    one that parted at a rounding near-tie, the next turn still races on the same prompt."""

    def __init__(self, system: str = "", markers: Optional[Tuple[str, str]] = None):
        self.system = system
        self.markers = markers
        self.turns: List[Turn] = []

    def messages(self, side: str, next_user: Optional[str] = None) -> List[dict]:
        """The message list `side` answers next (the same for both sides)."""
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        for t in self.turns:
            msgs.append({"role": "user", "content": t.user})
            msgs.append({"role": "assistant", "content": answer_part(t.answers[SPEC].text, self.markers)})
        if next_user is not None:
            msgs.append({"role": "user", "content": next_user})
        return msgs

    def clear(self) -> None:
        self.turns.clear()

    def summary(self) -> str:
        """The race over the whole conversation, in a few lines: each side's tokens over its
        generating seconds, the speedup turn by turn, how many outputs agreed, who drafted."""
        turns = self.turns
        if not turns:
            return "no turns yet"
        sampled = sum(t.temperature > 0 for t in turns)
        kinds = ", ".join(part for part in (f"{len(turns) - sampled} greedy" if len(turns) > sampled else "",
                                            f"{sampled} sampled" if sampled else "") if part)
        lines = [f"{plural(len(turns), 'turn')} ({kinds})"]
        rates = {}
        for side in SIDES:
            stats = [t.answers[side].stats for t in turns]
            tokens, seconds = sum(s.tokens for s in stats), sum(s.seconds for s in stats)
            rates[side] = tokens / seconds if seconds > 0 else 0.0
            lines.append(f"{side}: {plural(tokens, 'token')} in {seconds:.1f} s, {rates[side]:.1f} tok/s")
        speedups = [t.speedup for t in turns if t.speedup is not None]
        if speedups and rates[VANILLA] > 0:
            lines.append(f"speedup {rates[SPEC] / rates[VANILLA]:.2f}× over all tokens; per turn median "
                         f"{statistics.median(speedups):.2f}×, from {min(speedups):.2f}× to {max(speedups):.2f}×")
        rounding = sum(1 for t in turns if not t.identical and t.divergence
                       and t.divergence["divergence"] == "rounding")
        same = sum(t.identical for t in turns)
        lines.append(f"outputs identical in {same} of {len(turns)}"
                     + (f", {rounding} more up to rounding" if rounding else "")
                     + ("" if same + rounding == len(turns) else f", {len(turns) - same - rounding} differ "
                        "(see their verdicts)"))
        drafted = sum(t.answers[SPEC].stats.drafted for t in turns)
        accepted = sum(round(t.answers[SPEC].stats.acceptance_rate * t.answers[SPEC].stats.drafted) for t in turns)
        who = Counter(t.answers[SPEC].stats.drafter for t in turns)
        lines.append("drafted by " + ", ".join(f"{name} ({n})" for name, n in who.most_common())
                     + (f"; accepted {accepted / drafted:.0%} of {plural(drafted, 'draft')}" if drafted else ""))
        return "\n".join(lines)

    # -- saving ---------------------------------------------------------------------------
    def as_dict(self, settings: Optional[dict] = None, pair: Optional[dict] = None) -> dict:
        return {
            "pair": pair or {},
            "settings": settings or {},
            "system": self.system,
            "turns": [
                {"user": t.user, "temperature": t.temperature, "stopped": t.stopped,
                 "speedup": t.speedup, "identical": t.identical, "verdict": t.verdict(), "divergence": t.divergence,
                 **{side: {"text": a.text, "finish_reason": a.finish_reason,
                           "from_draft": a.from_draft, "stats": a.stats.as_dict()}
                    for side, a in t.answers.items()}}
                for t in self.turns
            ],
        }

    def to_markdown(self, pair_line: str = "") -> str:
        out = ["# mlxspec chat", ""]
        if pair_line:
            out += [pair_line, ""]
        if self.system:
            out += [f"**System:** {self.system}", ""]
        for i, t in enumerate(self.turns, 1):
            # a turn's own settings: /drafter and /temp can change between turns
            how = "greedy" if t.temperature == 0 else f"T={t.temperature:g}"
            out += [f"## Turn {i}", "", f"**You:** {t.user}", "",
                    f"_{how} · drafter {t.answers[SPEC].stats.drafter}_", ""]
            for side in SIDES:
                a = t.answers[side]
                end = {"length": " (cut at the token limit)"}.get(a.finish_reason, "")
                if t.stopped and a.finish_reason is None:
                    end = " (stopped)"
                out += [f"### {side.capitalize()}{end}", "", hard_breaks(a.text) or "_(empty)_", "",
                        f"_{a.stats.line(side == SPEC)}_", ""]
            out += [f"**Verdict:** {t.verdict()}", ""]
        if self.turns:
            out += ["## Summary", ""] + [f"- {line}" for line in self.summary().splitlines()] + [""]
        return "\n".join(out)

    def save(self, path: str, *, settings: Optional[dict] = None, pair: Optional[dict] = None,
             pair_line: str = "") -> Tuple[Path, Path]:
        """Write PATH.json and PATH.md (a trailing .json or .md on PATH is dropped), both or neither:
        a failed /save leaves an earlier one whole. Returns both paths."""
        js, md = saved_paths(path)
        write_all_atomic({md: self.to_markdown(pair_line) + "\n",
                          js: json.dumps(self.as_dict(settings, pair), indent=2, ensure_ascii=False) + "\n"})
        return js, md


def saved_paths(path: str) -> Tuple[Path, Path]:
    """PATH.json and PATH.md, as /save names them (a trailing .json or .md on PATH is dropped).

    Raises:
        InvalidArgumentError: PATH names a folder (`.`, `~`, `chats/`, one that exists), not a file.
    """
    base = Path(path).expanduser()
    if base.suffix in (".json", ".md"):
        base = base.with_suffix("")
    if base.name in ("", ".", "..") or path.endswith(("/", "\\")) or base.is_dir():
        raise InvalidArgumentError(f"{path!r} is a folder: give a file name in it, e.g. {str(base / 'chat')!r} "
                                   f"(PATH.json and PATH.md are written)")
    return base.with_name(base.name + ".json"), base.with_name(base.name + ".md")


@dataclass
class Saved:
    """A conversation /save wrote, read back: its system prompt, turns, and the pair that answered."""

    path: Path
    system: str
    turns: List[Turn]
    pair: dict


def read_saved(path: str) -> Saved:
    """The conversation in PATH.json (as /save wrote it; PATH, PATH.json or PATH.md may be given).

    Raises:
        InvalidArgumentError: no such file, not JSON, or not the shape /save writes (the message
            says where).
    """
    js, _ = saved_paths(path)
    try:
        doc = json.loads(js.read_text(encoding="utf-8"))
    except OSError as e:
        raise InvalidArgumentError(f"cannot read the saved conversation {str(js)!r}: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidArgumentError(f"{str(js)!r} is not a conversation /save wrote (not JSON: {e})") from None

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise InvalidArgumentError(f"{str(js)!r} is not a conversation /save wrote: {what}")

    need(isinstance(doc, dict) and isinstance(doc.get("turns"), list), "it has no list of turns")
    system = doc.get("system") or ""
    need(isinstance(system, str), "its system prompt is not text")
    turns = []
    for i, t in enumerate(doc["turns"], 1):
        need(isinstance(t, dict) and isinstance(t.get("user"), str), f"turn {i} has no user message")
        answers = {}
        for side in SIDES:
            a = t.get(side)
            need(isinstance(a, dict) and isinstance(a.get("text"), str), f"turn {i} has no {side} answer text")
            from_draft = a.get("from_draft") or []
            need(isinstance(from_draft, list) and all(isinstance(x, bool) for x in from_draft),
                 f"turn {i}'s {side} from_draft is not a list of true/false")
            need(a.get("finish_reason") in (None, "stop", "length"),
                 f"turn {i}'s {side} finish_reason is not stop, length or null")
            answers[side] = Answer(text=a["text"], from_draft=from_draft, finish_reason=a.get("finish_reason"),
                                   stats=_stats(a.get("stats")))
        temperature = t.get("temperature", 0.0)
        need(isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature >= 0,
             f"turn {i}'s temperature is not a number >= 0")
        divergence = t.get("divergence")
        need(divergence is None or _divergence_ok(divergence), f"turn {i}'s divergence is not one the chat writes")
        turns.append(Turn(t["user"], answers, temperature=float(temperature), stopped=bool(t.get("stopped")),
                          divergence=divergence))
    pair = doc.get("pair")
    return Saved(js, system, turns, pair if isinstance(pair, dict) else {})


def _divergence_ok(d) -> bool:
    """A saved `Turn.divergence` holds what the verdict reads: its kind, and for a rounding one the
    tokens from it on, for an unclassified one the reason."""
    if not isinstance(d, dict) or d.get("divergence") not in ("rounding", "bug", "unclassified"):
        return False
    number = isinstance(d.get("tokens"), int) and not isinstance(d.get("tokens"), bool)
    return {"rounding": number, "unclassified": isinstance(d.get("reason"), str)}.get(d["divergence"], True)


def _stats(saved) -> StatsView:
    """A saved answer's figures (those a StatsView has; others, and damaged ones, left at zero)."""
    if not isinstance(saved, dict):
        return StatsView()
    kept = {}
    for f in fields(StatsView):
        value = saved.get(f.name)
        if isinstance(value, type(f.default)) and not (isinstance(value, bool) and not isinstance(f.default, bool)):
            kept[f.name] = value
        elif isinstance(f.default, float) and isinstance(value, int) and not isinstance(value, bool):
            kept[f.name] = float(value)
    return StatsView(**kept)

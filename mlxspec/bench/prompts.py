"""The bench's prompt suite: the builtin one shipped with mlxspec, or a user's JSONL file.

Each line of a suite file is a JSON object with `prompt` (a non-empty string), or `messages` (a
whole conversation in OpenAI's chat format, ending with the turn to answer: a long chat, say), and
optional `id` and `category` strings. The builtin suite (`prompts.jsonl` beside this module) has
four prompts in each of six categories; two of them are input-grounded (the answer
repeats much of the prompt), which is where n-gram drafting pays:

    chat           chat / question answering
    code           code generation
    code-edit      the prompt holds code and asks for an edited version
    summarization  a passage of ~200 words to summarise
    math           reasoning with numbers
    creative       writing
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import List, Optional

from ..errors import InvalidArgumentError, shown
from ..prompts import text_of

CATEGORIES = ("chat", "code", "code-edit", "summarization", "math", "creative")
SHORT_PER_CATEGORY = 8  # prompts in the default (short) suite, spread over the categories


ANSWERED_ROLES = ("user", "tool")  # a conversation's last turn: what the model answers


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    prompt: str  # a conversation's last turn, as text
    chat: str = ""  # a whole conversation, as its JSON (hashable, and kept as the file gave it)

    def messages(self) -> list:
        """The prompt as one user chat message (or the whole conversation), so the model's chat template applies."""
        if self.chat:
            return json.loads(self.chat)
        return [{"role": "user", "content": self.prompt}]


def builtin_suite() -> List[BenchPrompt]:
    """All builtin prompts (24, four per category), in file order."""
    text = resources.files(__package__).joinpath("prompts.jsonl").read_text(encoding="utf-8")
    return parse_suite(text, source="builtin prompts.jsonl")


def load_prompts(path) -> List[BenchPrompt]:
    """Read a user's JSONL suite; raises InvalidArgumentError naming the first bad line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")  # an editor's byte-order mark is no part of line 1
    except OSError as e:
        raise InvalidArgumentError(f"[bench] cannot read prompts file {str(p)!r}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        line = p.read_bytes()[:e.start].count(b"\n") + 1
        raise InvalidArgumentError(f"[bench] prompts file {str(p)!r} is not UTF-8 text (byte {e.start}, line {line}): "
                                   "save it as UTF-8") from None
    return parse_suite(text, source=str(p))


def parse_suite(text: str, *, source: str = "<prompts>") -> List[BenchPrompt]:
    """Parse JSONL text; blank lines are skipped. Missing ids become `line-<n>` (its line number)."""
    out: List[BenchPrompt] = []
    seen = set()
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}, line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InvalidArgumentError(f"[bench] {where}: not valid JSON ({e.msg}); each line must be one JSON object") from None
        if not isinstance(obj, dict):
            raise InvalidArgumentError(f"[bench] {where}: expected a JSON object with a 'prompt' key, got {type(obj).__name__}")
        chat = ""
        if "messages" in obj:
            if "prompt" in obj:
                raise InvalidArgumentError(f"[bench] {where}: give 'prompt' or 'messages', not both")
            prompt, chat = _conversation(obj["messages"], where), json.dumps(obj["messages"], ensure_ascii=False)
        else:
            prompt = obj.get("prompt")
            if not isinstance(prompt, str) or not prompt.strip():
                raise InvalidArgumentError(f"[bench] {where}: 'prompt' must be a non-empty string (or give "
                                           f"'messages', a conversation), got {prompt!r}")
        if isinstance(obj.get("id"), int) and not isinstance(obj["id"], bool):  # "id": 7 names it as well
            obj["id"] = str(obj["id"])
        for key in ("id", "category"):
            if key in obj and not isinstance(obj[key], str):
                kinds = "a string or an integer" if key == "id" else "a string"
                raise InvalidArgumentError(f"[bench] {where}: {key!r} must be {kinds}, got {obj[key]!r}")
        pid = obj.get("id") or f"line-{lineno}"
        if pid in seen:
            raise InvalidArgumentError(f"[bench] {where}: duplicate id {pid!r}; ids must be unique")
        seen.add(pid)
        out.append(BenchPrompt(pid, obj.get("category") or "other", prompt, chat))
    if not out:
        raise InvalidArgumentError(f"[bench] {source}: no prompts found; give one JSON object per line")
    return out


def _conversation(messages, where: str) -> str:
    """Check a conversation before any model loads; its last turn's text. The chat template checks
    the rest (which roles it takes, in which order) when the prompt is encoded."""
    if not isinstance(messages, list) or not messages:
        raise InvalidArgumentError(f"[bench] {where}: 'messages' must be a non-empty list of "
                                   f"{{'role', 'content'}} objects, got {shown(messages)}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidArgumentError(f"[bench] {where}: message {i} must be an object with a string 'role', "
                                       f"got {shown(m)}")
        content = m.get("content")
        if text_of(content) is None and not (content is None and m.get("tool_calls")):
            raise InvalidArgumentError(f"[bench] {where}: message {i}'s content must be a string or a list of "
                                       f"{{'type': 'text', 'text': str}} parts, got {shown(content)}")
    last = messages[-1]
    if last["role"] not in ANSWERED_ROLES:
        raise InvalidArgumentError(f"[bench] {where}: the last message is the turn the model answers, so its role "
                                   f"must be {' or '.join(ANSWERED_ROLES)}, got {last['role']!r}")
    text = text_of(last["content"])
    if not text or not text.strip():
        raise InvalidArgumentError(f"[bench] {where}: the last message's content must be non-empty text")
    return text


def stratified(prompts: List[BenchPrompt], n: int = SHORT_PER_CATEGORY) -> List[BenchPrompt]:
    """Up to n prompts taken round-robin over categories (first-seen order), so all are covered."""
    groups: dict = {}
    for p in prompts:
        groups.setdefault(p.category, []).append(p)
    out: List[BenchPrompt] = []
    depth = 0
    while len(out) < min(n, len(prompts)):
        for items in groups.values():
            if depth < len(items) and len(out) < n:
                out.append(items[depth])
        depth += 1
    return out


def select(prompts: List[BenchPrompt], *, full: bool, limit: Optional[int]) -> List[BenchPrompt]:
    """The prompts a bench runs: the short stratified subset unless `full`, then the first `limit`."""
    chosen = list(prompts) if full else stratified(prompts)
    if limit is not None:
        if limit < 1:
            raise InvalidArgumentError(f"[bench] --limit must be >= 1, got {limit}")
        chosen = chosen[:limit]
    return chosen

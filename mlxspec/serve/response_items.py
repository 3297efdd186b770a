"""The Responses API's input items, as OpenAI stores and lists them.

A stored response keeps the items its request sent as `input` (`as_items`): each an item object
with an id (the client's, or one made here), a string input being one user message. GET
/v1/responses/{id}/input_items lists them a page at a time (`page`: OpenAI's `after`, `before`,
`limit` and `order`, newest first by default). A later request may name any stored item by id
instead of sending it again (`{"type": "item_reference", "id": ...}`, as Codex does); `resolve`
puts the item in its place before the request is read.
"""

from __future__ import annotations

import uuid
from typing import Callable, List, Mapping, Optional

from ..errors import shown
from .errors import invalid

PREFIX = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}
LIMIT, MAX_LIMIT = 20, 100  # OpenAI's default page and largest page


def as_items(given) -> List[dict]:
    """A request's `input` (already accepted by `responses_api.to_chat`) as item objects with ids,
    messages' content as typed parts."""
    if isinstance(given, str):
        given = [{"type": "message", "role": "user", "content": given}]
    out = []
    for item in given:
        kind = item.get("type", "message")
        item = {**item, "type": kind, "id": item.get("id") or PREFIX.get(kind, "item_") + uuid.uuid4().hex[:24]}
        if kind == "message":
            item["content"] = _parts(item.get("content"), item.get("role"))
        if kind in ("message", "function_call", "function_call_output"):
            item.setdefault("status", "completed")
        out.append(item)
    return out


def _parts(content, role) -> list:
    """A message's content as typed parts: an assistant's are output_text, everyone else's input_text."""
    kind = "output_text" if role == "assistant" else "input_text"
    if content is None:
        return []
    if isinstance(content, str):
        content = [{"type": kind, "text": content}]
    parts = [{**p, "type": kind if p.get("type") == "text" else p.get("type")} for p in content]
    return [dict(p, annotations=p.get("annotations", [])) if p["type"] == "output_text" else p for p in parts]


def resolve(given, find: Callable[[str], Optional[dict]]):
    """`input` with each item reference replaced by the stored item it names (`find(id)`);
    a 400 names a reference to nothing stored."""
    if not isinstance(given, list):
        return given
    out = []
    for i, item in enumerate(given):
        if isinstance(item, dict) and item.get("type") == "item_reference":
            found = find(item.get("id")) if isinstance(item.get("id"), str) else None
            if found is None:
                raise invalid(f"input[{i}] refers to item {shown(item.get('id'))}, which no stored response here "
                              "holds (the items of the responses this server keeps can be referred to); send the "
                              "item itself instead", f"input[{i}]")
            item = found
        out.append(item)
    return out


def page(items: List[dict], query: Mapping[str, str]) -> dict:
    """One page of `items` (stored oldest first) for OpenAI's list query: `order` "desc" (the
    default, newest first) or "asc", `limit` 1-100 (default 20), `after` / `before` an item id
    of the list: the page starts just after it / ends just before it, in that order."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid(f"order must be 'asc' or 'desc', got {shown(order)}", "order")
    try:
        limit = int(query.get("limit", LIMIT))
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise invalid(f"limit must be a whole number from 1 to {MAX_LIMIT}, got {shown(query.get('limit'))}", "limit")
    ordered = list(items) if order == "asc" else list(reversed(items))
    ids = [item["id"] for item in ordered]
    for cursor in ("after", "before"):
        if cursor in query and query[cursor] not in ids:
            raise invalid(f"{cursor} must be the id of one of this response's input items, got "
                          f"{shown(query[cursor])}", cursor)
    start = ids.index(query["after"]) + 1 if "after" in query else 0
    end = ids.index(query["before"]) if "before" in query else len(ordered)
    between = ordered[start:end]
    # `before` alone pages back: the items just before it; otherwise the first after `after`
    data = between[-limit:] if "before" in query and "after" not in query else between[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(between) > len(data)}

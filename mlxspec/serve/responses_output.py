"""The Responses API's answer (POST /v1/responses): what the model wrote as output items.

`ResponseBuilder` shapes what the model wrote (reasoning, text, tool calls, as `choice.AnswerReader`
splits them) into output items: a `reasoning` item, a `message` with one `output_text`, and
one `function_call` item per call; streamed, as the Responses' typed events. The request's
side (translating it into a chat request) is `responses_api`.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Callable, List, Optional

from .errors import APIError
from .responses import LogprobStream, figures, sse
from .responses_api import left_out, namespaces, wants_logprobs


class ResponseBuilder:
    """One response's output items, whole or as the Responses' stream events."""

    def __init__(self, model: str, body: dict, remember: Optional[Callable[[dict], None]] = None,
                 token_bytes: Optional[Callable[[int], bytes]] = None):
        """`remember(response)`: called with the whole answered response (`store`). `token_bytes`:
        a token's own bytes, for logprobs when `include` asks for them."""
        self.id = "resp_" + uuid.uuid4().hex[:24]
        self.remember = remember
        self.created = int(time.time())
        self.model = model
        self.body = body
        self.namespace = namespaces(body.get("tools"))
        self.left_out = left_out(body.get("tools"))  # said in the answer: its tools list echoes what was sent
        self.seq = 0
        self.items: List[dict] = []  # finished items
        self.open: Optional[dict] = None  # the item being streamed (reasoning or message)
        self.text = {"reasoning": "", "message": ""}
        # Logprobs (as chat's: every generated token, reasoning and tool-call markup included) go
        # out with the next text delta, and each message's content holds those its deltas carried.
        wanted = token_bytes is not None and wants_logprobs(body)
        self.logprobs = LogprobStream(True, token_bytes) if wanted else None
        self.pending: List[dict] = []  # logprobs out of the stream, not yet on a text delta
        self.carried: List[dict] = []  # those on the open message's deltas

    def tokens(self, events: list) -> None:
        """The engine's events behind the text fed next (their logprobs, when asked for)."""
        if self.logprobs is not None and events:
            out = self.logprobs.feed(events)
            if out:
                self.pending += out["content"]

    # -- whole ---------------------------------------------------------------------------------
    def whole(self, reasoning: str, text: str, calls: list, finish: str, usage: dict, stats, stop_reason=None) -> dict:
        if reasoning:
            self.items.append(self._reasoning_item(reasoning, "completed"))
        if text or not calls:
            self.items.append(self._message_item(text, "completed" if finish != "length" else "incomplete",
                                                 self.pending))
            self.pending = []
        self.items += [self._call_item(c) for c in calls]
        return self._answered(self.response(finish, usage, stats))

    def response(self, finish: Optional[str], usage: Optional[dict], stats, status: Optional[str] = None) -> dict:
        b = self.body
        status = status or ("incomplete" if finish == "length" else "completed")
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
               "model": self.model, "output": list(self.items), "error": None,
               "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
               "instructions": b.get("instructions"), "max_output_tokens": b.get("max_output_tokens"),
               "parallel_tool_calls": b.get("parallel_tool_calls", True),
               "previous_response_id": b.get("previous_response_id"),
               "temperature": b.get("temperature"), "top_p": b.get("top_p"), "tools": b.get("tools") or [],
               "tool_choice": b.get("tool_choice", "auto"), "text": b.get("text") or {"format": {"type": "text"}},
               "metadata": b.get("metadata") or {}, "store": b.get("store") is not False, "truncation": "disabled",
               "top_logprobs": b.get("top_logprobs"),
               "usage": None}
        if usage is not None:
            reasoning = usage["completion_tokens_details"]["reasoning_tokens"]
            out["usage"] = {"input_tokens": usage["prompt_tokens"],
                            "input_tokens_details": {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                                                     "cache_write_tokens": 0},
                            "output_tokens": usage["completion_tokens"],
                            "output_tokens_details": {"reasoning_tokens": reasoning},
                            "total_tokens": usage["total_tokens"]}
        if stats is not None:
            out["mlxspec"] = figures(stats)
            if self.left_out:
                out["mlxspec"]["tools_left_out"] = self.left_out
        return out

    # -- streamed ------------------------------------------------------------------------------
    def event(self, kind: str, **fields) -> dict:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return body

    def start(self, prompt_tokens: int, cached_tokens: int = 0) -> List[bytes]:
        shell = self.response(None, None, None, status="in_progress")
        return _sse([self.event("response.created", response=shell),
                     self.event("response.in_progress", response=shell)])

    def feed(self, reasoning: str, text: str, calls: list) -> List[bytes]:
        """Events for new reasoning, text and whole tool calls (each opens its item as needed)."""
        return _sse(self._feed(reasoning, text, calls))

    def _feed(self, reasoning: str, text: str, calls: list) -> List[dict]:
        out: List[dict] = []
        if reasoning:
            out += self._open("reasoning")
            out.append(self.event("response.reasoning_text.delta", item_id=self.open["id"],
                                  output_index=len(self.items), content_index=0, delta=reasoning))
            self.text["reasoning"] += reasoning
        if text:
            out += self._open("message")
            lp, self.pending = self.pending, []
            self.carried += lp
            out.append(self.event("response.output_text.delta", item_id=self.open["id"], output_index=len(self.items),
                                  content_index=0, delta=text, logprobs=lp))
            self.text["message"] += text
        for call in calls:
            out += self._close()
            item = self._call_item(call)
            index = len(self.items)
            added = dict(item, arguments="", status="in_progress")
            out.append(self.event("response.output_item.added", output_index=index, item=added))
            out.append(self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                                  delta=item["arguments"]))
            out.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                  arguments=item["arguments"]))
            out.append(self.event("response.output_item.done", output_index=index, item=item))
            self.items.append(item)
        return out

    def finish(self, finish: str, usage: dict, stats, stop_reason=None) -> List[bytes]:
        if not self.items and self.open is None:
            out = self._open("message")  # an empty answer is still a message
        else:
            out = []
        out += self._close("incomplete" if finish == "length" else "completed")
        response = self._answered(self.response(finish, usage, stats))
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return _sse(out + [self.event(kind, response=response)])

    def _answered(self, response: dict) -> dict:
        if self.remember is not None:
            self.remember(response)
        return response

    def error(self, e: APIError) -> bytes:
        return sse(self.event("error", code=e.code, message=e.message, param=e.param), "error")

    def _open(self, kind: str) -> List[dict]:
        if self.open is not None and self.open["type"] == kind:
            return []
        out = self._close()
        index = len(self.items)
        if kind == "reasoning":
            self.open = {"type": "reasoning", "id": "rs_" + uuid.uuid4().hex[:24], "summary": [], "content": [],
                         "status": "in_progress"}
            part = {"type": "reasoning_text", "text": ""}
        else:
            self.open = {"type": "message", "id": "msg_" + uuid.uuid4().hex[:24], "status": "in_progress",
                         "role": "assistant", "content": []}
            part = {"type": "output_text", "text": "", "annotations": []}
        self.text[kind] = ""
        self.carried = []
        out.append(self.event("response.output_item.added", output_index=index, item=dict(self.open)))
        out.append(self.event("response.content_part.added", item_id=self.open["id"], output_index=index,
                              content_index=0, part=part))
        return out

    def _close(self, status: str = "completed") -> List[dict]:
        if self.open is None:
            return []
        index, kind, item_id = len(self.items), self.open["type"], self.open["id"]
        text = self.text[kind]
        if kind == "reasoning":
            item = dict(self._reasoning_item(text, "completed"), id=item_id)
            part = item["content"][0]
            done = [self.event("response.reasoning_text.done", item_id=item_id, output_index=index, content_index=0,
                               text=text)]
        else:
            logprobs, self.pending = self.carried + self.pending, []  # with those whose text was held back
            item = dict(self._message_item(text, status, logprobs), id=item_id)
            part = item["content"][0]
            done = [self.event("response.output_text.done", item_id=item_id, output_index=index, content_index=0,
                               text=text, logprobs=logprobs)]
        done.append(self.event("response.content_part.done", item_id=item_id, output_index=index, content_index=0,
                               part=part))
        done.append(self.event("response.output_item.done", output_index=index, item=item))
        self.items.append(item)
        self.open = None
        return done

    # -- items ---------------------------------------------------------------------------------
    @staticmethod
    def _reasoning_item(text: str, status: str) -> dict:
        return {"type": "reasoning", "id": "rs_" + uuid.uuid4().hex[:24], "summary": [],
                "content": [{"type": "reasoning_text", "text": text}], "status": status}

    @staticmethod
    def _message_item(text: str, status: str, logprobs: List[dict] = ()) -> dict:
        return {"type": "message", "id": "msg_" + uuid.uuid4().hex[:24], "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": list(logprobs)}]}

    def _call_item(self, call: dict) -> dict:
        args, name = call["function"]["arguments"], call["function"]["name"]
        item = {"type": "function_call", "id": "fc_" + uuid.uuid4().hex[:24], "call_id": call["id"], "name": name,
                "status": "completed", "arguments": args if isinstance(args, str) else json.dumps(args)}
        if name in self.namespace:
            item["namespace"] = self.namespace[name]
        return item


def _sse(events: List[dict]) -> List[bytes]:
    """Responses stream events: each named by its type."""
    return [sse(e, e["type"]) for e in events]

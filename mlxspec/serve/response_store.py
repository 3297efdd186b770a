"""The Responses API's stored responses (`store`, on by default, as OpenAI's): each answered
response's body, for GET /v1/responses/{id}, and its conversation as chat messages, which a
later request continues with `previous_response_id`. In memory only (a restarted server
knows none), the least recently stored leaving first past `size`.

As OpenAI's, a continued conversation keeps the earlier input and output, not the earlier
`instructions` or tools: a request sends its own.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import List

from ..errors import shown
from ..tools import arguments_object
from .errors import APIError, invalid

SIZE = 256  # responses kept


class ResponseStore:
    def __init__(self, size: int = SIZE):
        self.size = size
        self._items: "OrderedDict[str, tuple]" = OrderedDict()  # id -> (response body, conversation)

    def conversation(self, response_id) -> List[dict]:
        """The chat messages of a stored response's conversation, its answer last."""
        if not isinstance(response_id, str) or response_id not in self._items:
            raise invalid(f"previous response {shown(response_id)} is not stored here: this server keeps the last "
                          f"{self.size} responses it answered with store true, in memory; send the conversation "
                          f"as input instead", "previous_response_id")
        return list(self._items[response_id][1])

    def get(self, response_id: str) -> dict:
        if response_id not in self._items:
            raise APIError(404, f"response {shown(response_id)} is not stored here (the last {self.size} responses "
                           f"answered with store true are, in memory)", param="response_id", code="not_found")
        return self._items[response_id][0]

    def remember(self, response: dict, conversation: List[dict]) -> None:
        """Keep an answered response, with the chat messages it answered (without its instructions)."""
        self._items[response["id"]] = (response, list(conversation) + answer_messages(response["output"]))
        self._items.move_to_end(response["id"])
        while len(self._items) > self.size:
            self._items.popitem(last=False)


def answer_messages(output: List[dict]) -> List[dict]:
    """A response's output items as the chat messages a template renders (reasoning dropped, as
    chat templates drop it): the assistant's text and its tool calls, in one message."""
    text = "".join(part.get("text", "") for item in output if item["type"] == "message" for part in item["content"])
    calls = [{"id": item["call_id"], "type": "function",
              "function": {"name": item["name"], "arguments": arguments_object(item["arguments"])}}
             for item in output if item["type"] == "function_call"]
    message = {"role": "assistant", "content": text or (None if calls else "")}
    return [dict(message, tool_calls=calls) if calls else message]


"""The Responses API's stored responses (`store`, on by default, as OpenAI's): each answered
response's body, for GET /v1/responses/{id}, its conversation as chat messages, which a later
request continues with `previous_response_id`, and its request's input items (GET
/v1/responses/{id}/input_items; any stored item may be referred to by id in a later input);
DELETE /v1/responses/{id} forgets one.
The least recently stored leave first past `size`. In memory only by default (a restarted
server knows none); with a `folder` (`mlxspec serve --responses-dir`) each is also a JSON file
there, written whole or not at all, and a server started on the folder knows them again.

As OpenAI's, a continued conversation keeps the earlier input and output, not the earlier
`instructions` or tools: a request sends its own.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import List, Optional

from ..errors import MlxSpecError, shown
from ..tools import arguments_object
from .errors import APIError, invalid

SIZE = 256  # responses kept
log = logging.getLogger("mlxspec.serve")


class ResponseStore:
    def __init__(self, size: int = SIZE, folder: Optional[Path] = None):
        self.size = size
        self.folder = Path(folder) if folder is not None else None
        # id -> (response body, conversation, the request's input items)
        self._items: "OrderedDict[str, tuple]" = OrderedDict()
        self._count = 0  # responses stored so far, across restarts: a file's place in the order
        if self.folder is not None:
            self._load()

    def _where(self) -> str:
        return f"in {self.folder}" if self.folder is not None else "in memory"

    def conversation(self, response_id) -> List[dict]:
        """The chat messages of a stored response's conversation, its answer last."""
        if not isinstance(response_id, str) or response_id not in self._items:
            raise invalid(f"previous response {shown(response_id)} is not stored here: this server keeps the last "
                          f"{self.size} responses it answered with store true, {self._where()}; send the "
                          f"conversation as input instead", "previous_response_id")
        return list(self._items[response_id][1])

    def get(self, response_id: str) -> dict:
        if response_id not in self._items:
            raise APIError(404, f"response {shown(response_id)} is not stored here (the last {self.size} responses "
                           f"answered with store true are, {self._where()})", param="response_id", code="not_found")
        return self._items[response_id][0]

    def input_items(self, response_id: str) -> List[dict]:
        """The items a stored response's request sent as input (`response_items.as_items`), oldest first."""
        self.get(response_id)  # 404 when it is not stored
        return list(self._items[response_id][2])

    def find_item(self, item_id: str) -> Optional[dict]:
        """A stored response's input or output item of that id (the newest response's first), or None."""
        for response, _, inputs in reversed(self._items.values()):
            for item in list(inputs) + list(response.get("output", [])):
                if item.get("id") == item_id:
                    return item
        return None

    def remember(self, response: dict, conversation: List[dict], inputs: List[dict] = ()) -> None:
        """Keep an answered response, with the chat messages it answered (without its instructions)
        and the input items its request sent."""
        entry = (response, list(conversation) + answer_messages(response["output"]), list(inputs))
        self._items[response["id"]] = entry
        self._items.move_to_end(response["id"])
        self._write(response["id"], entry)
        while len(self._items) > self.size:
            self._unlink(self._items.popitem(last=False)[0])

    def delete(self, response_id: str) -> None:
        """Forget a stored response (and its file)."""
        self.get(response_id)  # 404 when it is not stored
        del self._items[response_id]
        self._unlink(response_id)

    # -- the folder -------------------------------------------------------------------------------

    def _path(self, response_id: str) -> Path:
        return self.folder / f"{response_id}.json"  # ids are ours (resp_ + hex), never a client's text

    def _write(self, response_id: str, entry: tuple) -> None:
        if self.folder is None:
            return
        tmp = None
        self._count += 1
        try:  # a temporary file renamed over the name: a reader never sees half a response
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"order": self._count, "response": entry[0], "conversation": entry[1], "input": entry[2]}, f)
            os.replace(tmp, self._path(response_id))
        except OSError as e:  # a full disk keeps the server answering, from memory
            log.warning("response %s is kept in memory only: writing it to %s failed: %s", response_id, self.folder, e)
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)

    def _unlink(self, response_id: str) -> None:
        if self.folder is not None:
            try:
                self._path(response_id).unlink(missing_ok=True)
            except OSError as e:
                log.warning("could not remove %s: %s", self._path(response_id), e)

    def _load(self) -> None:
        """The folder's responses, oldest first (in the order they were stored; a file's time is
        too coarse for responses a few milliseconds apart), the last `size` of them."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            paths = list(self.folder.glob("resp_*.json"))
        except OSError as e:
            raise MlxSpecError(f"cannot keep stored responses in {self.folder}: {e}") from None
        found = []
        for path in paths:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                order, response, conversation = data["order"], data["response"], data["conversation"]
                inputs = data.get("input", [])  # files written before input items were kept have none
                if response.get("id") != path.stem or not isinstance(conversation, list) or not isinstance(order, int) \
                        or not isinstance(inputs, list):
                    raise ValueError("not a stored response of this server")
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # left as it is, not read
                log.warning("skipping %s: %s", path, e)
                continue
            found.append((order, path.stem, response, conversation, inputs))
        for order, response_id, response, conversation, inputs in sorted(found, key=lambda f: f[:2]):
            self._items[response_id] = (response, conversation, inputs)
            self._count = max(self._count, order)
        while len(self._items) > self.size:
            self._unlink(self._items.popitem(last=False)[0])
        if self._items:
            log.info("%d stored responses read from %s", len(self._items), self.folder)


def answer_messages(output: List[dict]) -> List[dict]:
    """A response's output items as the chat messages a template renders (reasoning dropped, as
    chat templates drop it): the assistant's text and its tool calls, in one message."""
    text = "".join(part.get("text", "") for item in output if item["type"] == "message" for part in item["content"])
    calls = [{"id": item["call_id"], "type": "function",
              "function": {"name": item["name"], "arguments": arguments_object(item["arguments"])}}
             for item in output if item["type"] == "function_call"]
    message = {"role": "assistant", "content": text or (None if calls else "")}
    return [dict(message, tool_calls=calls) if calls else message]

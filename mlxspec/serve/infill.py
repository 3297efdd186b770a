"""llama.cpp's POST /infill, for the editor extensions that complete code at the cursor with it
(llama.vscode, llama.vim, llama.qtcreator, minuet-ai.el).

The text before the cursor (`input_prefix`, then `prompt`: what the line holds so far), the text
after it (`input_suffix`) and other files' text (`input_extra`: `{"filename", "text"}`) are laid
out as llama.cpp lays them out, with the model's own fill-in-the-middle and repository markers
(`FimFormat.encode`, `FimFormat.context`); other files' text is cut from its start to leave the
answer room in the context. The ids are answered by the completions path, ending at the model's
end-of-middle tokens, in llama.cpp's /completion shape: one object, or server-sent events whose
last has `"stop": true` and the timings. `response_fields` picks (and flattens) what comes back.
`n_indent` (the cursor's indentation, which llama.vscode sends) ends the answer before a line
indented less, and `t_max_predict_ms` at the first line end after that much generating (the
engine's `min_indent` and `soft_time_limit`), each with `stop_type` `limit`, as in llama.cpp.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import TYPE_CHECKING, List, Optional, Tuple

from starlette.requests import Request
from starlette.responses import Response

from ..errors import shown
from . import schema
from .body import read_json
from .errors import APIError, invalid
from .generation import guarded
from .fields import INFILL_SAMPLING, OWN
from .ollama import REPEAT_LAST_N, UNBOUNDED
from .responses import figures, sse
from .translated import one_answer

if TYPE_CHECKING:
    from .app import ServerState



@guarded
async def infill(request: Request) -> Response:
    """POST /infill."""
    state: ServerState = request.app.state.mlxspec
    body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
    limit = _limit(body.get("n_predict"), state)
    ids, cut = await asyncio.to_thread(layout, state.engine, body, max(limit, 1))  # (tokenizing: off the loop)
    fmt = state.engine.fim_format
    completion = {key: body[key] for key in (*INFILL_SAMPLING, *OWN) if body.get(key) is not None}
    completion.update(prompt=ids, max_tokens=max(limit, 1), stream=body.get("stream", False),
                      stop_token_ids=list(fmt.ends))
    if body.get("repeat_penalty") is not None:  # llama.cpp's names for mlx-lm's (its look-back: 64 by default)
        completion.update(repetition_penalty=body["repeat_penalty"],
                          repetition_context_size=body.get("repeat_last_n", REPEAT_LAST_N))
    fields = _fields(body.get("response_fields"))
    limits = _line_limits(body)

    def parse(given: dict, defaults) -> schema.GenerationRequest:
        req = schema.parse_completion(given, defaults)
        req.options.update(limits)
        return req

    def builder_of(state: ServerState, req: schema.GenerationRequest, body: dict) -> InfillBuilder:
        return InfillBuilder(state.model_id, fields, warm_only=limit == 0, truncated=cut)

    return await one_answer(request, lambda _: completion, builder_of, "infill", "input_prefix", _renamed,
                            parse=parse, body=body)


def layout(engine, body: dict, max_tokens: int) -> Tuple[List[int], bool]:
    """The prompt's ids, and whether other files' text was cut to fit the context."""
    fmt = engine.fim_format
    if fmt is None:
        raise invalid("this model's vocabulary has no fill-in-the-middle markers, so it was not trained to fill in "
                      "between a prefix and a suffix; serve a code model that was (Qwen2.5-Coder, StarCoder2, "
                      "DeepSeek-Coder, Codestral)", "input_prefix")
    before, after, typed = (_text(body, key) for key in ("input_prefix", "input_suffix", "prompt"))
    fim = fmt.encode(engine.tokenizer, before + typed, after)
    extra = fmt.context(engine.tokenizer, _files(body.get("input_extra")))
    room = len(extra) if engine.context is None else max(0, engine.context - len(fim) - max_tokens)
    keep = min(len(extra), room)  # (their end: the files read last, as llama.cpp keeps)
    return extra[len(extra) - keep:] + fim, keep < len(extra)


def _limit(n_predict, state: ServerState) -> int:
    """The answer's length: llama.cpp's n_predict (-1: until the context ends it; 0: only read the
    prompt, which readies the caches for the next request), the server's --max-tokens if left out."""
    if n_predict is None:
        return state.options.max_tokens
    if isinstance(n_predict, bool) or not isinstance(n_predict, int) or n_predict < -1:
        raise invalid(f"n_predict must be an integer >= -1 (-1: no limit, 0: read the prompt only), got "
                      f"{shown(n_predict)}", "n_predict")
    return (state.engine.context or UNBOUNDED) if n_predict == -1 else n_predict


def _line_limits(body: dict) -> dict:
    """llama.cpp's n_indent and t_max_predict_ms as the engine's min_indent and soft_time_limit;
    each is off where it is not positive, as there (-1 is llama.cpp's default)."""
    out = {}
    n = body.get("n_indent")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise invalid(f"n_indent must be an integer (the spaces or tabs every line after the first needs; 0 or "
                          f"less: no limit), got {shown(n)}", "n_indent")
        if n > 0:
            out["min_indent"] = n
    t = body.get("t_max_predict_ms")
    if t is not None:
        if isinstance(t, bool) or not isinstance(t, (int, float)) or math.isnan(t):
            raise invalid(f"t_max_predict_ms must be a number of milliseconds (after which the answer ends at its next "
                          f"line end; 0 or less: no limit), got {shown(t)}", "t_max_predict_ms")
        if 0 < t < math.inf:
            out["soft_time_limit"] = t / 1e3
    return out


def _text(body: dict, key: str) -> str:
    value = body.get(key, "")
    if not isinstance(value, str):
        raise invalid(f"{key} must be a string, got {shown(value)}", key)
    return value


def _files(chunks) -> List[Tuple[str, str]]:
    if chunks is None:
        return []
    if not isinstance(chunks, list):
        raise invalid(f"input_extra must be a list of {{\"filename\", \"text\"}} objects, got {shown(chunks)}",
                      "input_extra")
    files = []
    for i, chunk in enumerate(chunks):
        where = f"input_extra[{i}]"
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text", ""), str) \
                or not isinstance(chunk.get("filename", "tmp"), str):
            raise invalid(f"{where} must be {{\"filename\": a string, \"text\": a string}}, got {shown(chunk)}", where)
        files.append((chunk.get("filename", "tmp"), chunk.get("text", "")))
    return files


def _fields(fields) -> Optional[List[str]]:
    if fields is None or fields == []:
        return None
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise invalid(f"response_fields must be a list of field names (\"content\", \"timings/prompt_n\"...), got "
                      f"{shown(fields)}", "response_fields")
    return fields


def _renamed(error: APIError) -> APIError:
    """A completions error in /infill's terms."""
    names = {"max_tokens": "n_predict", "repetition_penalty": "repeat_penalty",
             "repetition_context_size": "repeat_last_n"}
    name = names.get(error.param or "")
    return error if name is None else error.named(name)


class InfillBuilder:
    """One answer in llama.cpp's /completion shape, whole or as server-sent events."""

    def __init__(self, model: str, fields: Optional[List[str]], warm_only: bool, truncated: bool):
        self.id = "infill-" + uuid.uuid4().hex[:24]  # for the log
        self.model, self.fields = model, fields
        self.warm_only, self.truncated = warm_only, truncated

    def tokens(self, events: list) -> None:
        """(llama.cpp's /infill answers carry no logprobs here)"""

    def whole(self, reasoning: str, text: str, calls: list, finish: str, usage: dict, stats, stopped_by=None) -> dict:
        return self._picked(self._final("" if self.warm_only else text, finish, usage, stats, stopped_by))

    def start(self, prompt_tokens: int, cached_tokens: int = 0) -> List[bytes]:
        return []

    def feed(self, reasoning: str, text: str, calls: list) -> List[bytes]:
        if not text or self.warm_only:
            return []
        return [sse(self._picked({"index": 0, "content": text, "stop": False}))]

    def finish(self, finish: str, usage: dict, stats, stopped_by=None) -> List[bytes]:
        return [sse(self._picked(self._final("", finish, usage, stats, stopped_by)))]

    @staticmethod
    def error(e: APIError) -> bytes:
        return sse(e.body())

    def _final(self, text: str, finish: str, usage: dict, stats, stopped_by) -> dict:
        generated = 0 if self.warm_only else usage["completion_tokens"]
        word = stopped_by if isinstance(stopped_by, str) else ""
        kind = "limit" if finish == "length" and not self.warm_only else "word" if word else "eos"
        prompt_ms, predicted_ms = stats.prompt_seconds * 1e3, stats.seconds * 1e3
        timings = {"prompt_n": stats.prefilled_tokens, "prompt_ms": prompt_ms,
                   "prompt_per_token_ms": prompt_ms / max(stats.prefilled_tokens, 1),
                   "prompt_per_second": stats.prefilled_tokens / max(stats.prompt_seconds, 1e-9),
                   "predicted_n": generated, "predicted_ms": predicted_ms,
                   "predicted_per_token_ms": predicted_ms / max(generated, 1),
                   "predicted_per_second": generated / max(stats.seconds, 1e-9)}
        return {"index": 0, "content": text, "stop": True, "model": self.model, "tokens_predicted": generated,
                "tokens_evaluated": usage["prompt_tokens"], "has_new_line": "\n" in text,
                "truncated": self.truncated, "stop_type": kind, "stopping_word": word,
                "tokens_cached": usage["prompt_tokens_details"]["cached_tokens"], "timings": timings,
                "mlxspec": figures(stats)}

    def _picked(self, body: dict) -> dict:
        """`response_fields`: those fields alone, a nested one named by its path ("timings/prompt_n")."""
        if self.fields is None:
            return body
        out = {}
        for path in self.fields:
            value = body
            for key in path.split("/"):
                value = value.get(key) if isinstance(value, dict) else None
            if value is not None:
                out[path] = value
        return out

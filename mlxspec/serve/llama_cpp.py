"""llama.cpp's own API: POST /completion, and the request fields and answer shape it shares with
/infill (`infill.py`), and GET /props, for the apps and editor extensions that speak
llama-server's native API (Continue's and SillyTavern's llama.cpp providers, llama.vscode,
llama.vim).

A request is answered by the completions path: `prompt` (a string, or token ids), `n_predict` (-1:
until the context ends it; 0: only read the prompt, which readies the caches), llama.cpp's sampling
fields, `repeat_penalty` over `repeat_last_n` (-1: the whole context, 0: off), `logit_bias` (by
token id) and `json_schema` (a grammar the answer follows). `n_indent` ends the answer before a line
indented less (the cursor's indentation, which llama.vscode sends) and `t_max_predict_ms` at the
first line end after that much generating (the engine's `min_indent` and `soft_time_limit`), each
with `stop_type` `limit`, as in llama.cpp. `n_probs` gives each token's probability and its
position's best alternatives (`completion_probabilities`: the model's own, before temperature and
the sampling filters, as llama.cpp's `post_sampling_probs` false; with it true, `prob` and
`top_probs` of the distribution each token was drawn from) and `return_tokens` the tokens' ids, each
for the tokens that spell the answer's text. The answer is one object, or server-sent events whose
last has `"stop": true` and the timings; `response_fields` picks (and flattens) what comes back.
"""

from __future__ import annotations

import math
import uuid
from typing import TYPE_CHECKING, List, Optional, Tuple

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..dry import BREAKERS, FIELDS as DRY_FIELDS
from ..errors import shown
from ..logprobs import MOST_TOP, is_top_count
from . import schema
from .body import read_json
from .errors import APIError, invalid, unsupported
from .fields import LLAMA_SAMPLING, OWN
from .generation import guarded
from .ollama import REPEAT_LAST_N, UNBOUNDED, random_seed, repeat_window
from .responses import LogprobStream, figures, sse
from .translated import one_answer

if TYPE_CHECKING:
    from .app import ServerState


@guarded
async def completion(request: Request) -> Response:
    """POST /completion."""
    state: ServerState = request.app.state.mlxspec
    body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
    prompt = body.get("prompt")
    ids = isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    if not (isinstance(prompt, str) or ids) or not prompt:
        raise invalid(f"prompt must be a non-empty string or a list of token ids (one prompt per request: llama.cpp's "
                      f"lists of prompts and of mixed pieces are not read here), got {shown(prompt)}", "prompt")
    return await answer(request, body, prompt, n_predict(body.get("n_predict"), state), endpoint="completion",
                        param="prompt")


async def props(request: Request) -> Response:
    """GET /props: what llama-server says of itself, as its clients read it (the context in
    `default_generation_settings.n_ctx`, `total_slots`, the chat template, the model's path)."""
    from .. import __version__

    state: ServerState = request.app.state.mlxspec
    engine, options = state.engine, state.options
    info = getattr(engine, "target_info", None)
    tokenizer = getattr(engine, "tokenizer", None)
    # The defaults a request that leaves a field out gets here (n_predict: the server's --max-tokens).
    params = {"n_predict": options.max_tokens, "seed": -1, **schema.SAMPLING_DEFAULTS,
              "temperature": options.temperature, "post_sampling_probs": False,
              **dict(DRY_FIELDS, dry_sequence_breakers=list(BREAKERS)),
              "repeat_last_n": REPEAT_LAST_N, "repeat_penalty": 1.0,
              "presence_penalty": 0.0, "frequency_penalty": 0.0, "stop": []}
    return JSONResponse({
        "default_generation_settings": {"id": 0, "id_task": -1, "n_ctx": state.context, "speculative": True,
                                        "is_processing": state.queue.running is not None, "params": params},
        "total_slots": 1,  # one request generates at a time
        "model_path": getattr(info, "path", None) or state.model_id, "model_alias": state.model_id,
        "chat_template": getattr(tokenizer, "chat_template", None) or "",
        "bos_token": getattr(tokenizer, "bos_token", None) or "",
        "eos_token": getattr(tokenizer, "eos_token", None) or "",
        "modalities": {"vision": False, "audio": False}, "build_info": f"mlxspec {__version__}", "is_sleeping": False,
        "endpoint_slots": False, "endpoint_props": False, "endpoint_metrics": True})


async def answer(request: Request, body: dict, prompt, limit: int, *, endpoint: str, param: str,
                 truncated: bool = False, stop_token_ids: Optional[List[int]] = None) -> Response:
    """`body`'s llama.cpp fields answered for `prompt` (text or ids) by the completions path, in
    llama.cpp's shape; `limit` is `n_predict`'s, `param` the field a bad prompt is named by."""
    if body.get("grammar"):  # (clients send "" for none: SillyTavern does)
        raise unsupported("grammar (GBNF) is not read here; send json_schema instead (a JSON schema the answer "
                          "follows)", "grammar")
    completion = {key: body[key] for key in (*LLAMA_SAMPLING, *OWN) if body.get(key) is not None}
    random_seed(completion)
    completion.update(prompt=prompt, max_tokens=max(limit, 1), stream=body.get("stream", False))
    if stop_token_ids:
        completion["stop_token_ids"] = stop_token_ids
    if body.get("json_schema") is not None:
        completion["guided_json"] = body["json_schema"]
    if body.get("logit_bias") is not None:
        completion["logit_bias"] = _bias(body["logit_bias"])
    if body.get("repeat_penalty") is not None:  # llama.cpp's names for mlx-lm's (its look-back: 64 by default)
        size = repeat_window(body.get("repeat_last_n", REPEAT_LAST_N), request.app.state.mlxspec.engine.context,
                             "repeat_last_n")
        if size is not None:
            completion.update(repetition_penalty=body["repeat_penalty"], repetition_context_size=size)
    fields = _fields(body.get("response_fields"))
    limits = _line_limits(body)
    (probs, post), ids = _n_probs(body), schema.flag(body, "return_tokens", False)
    if probs:  # (past OpenAI's 20, which parse_completion's logprobs holds to)
        limits.update(logprobs=probs, post_sampling_probs=post)

    def parse(given: dict, defaults) -> schema.GenerationRequest:
        req = schema.parse_completion(given, defaults)
        req.options.update(limits)
        return req

    def builder_of(state: ServerState, req: schema.GenerationRequest, body: dict) -> LlamaBuilder:
        tokens = LogprobStream(True, state.token_bytes) if (probs or ids) and limit else None
        return LlamaBuilder(endpoint, state.model_id, fields, warm_only=limit == 0, truncated=truncated,
                            tokens=tokens, probs=bool(probs), ids=ids, post=post)

    return await one_answer(request, lambda _: completion, builder_of, endpoint, param, _renamed, parse=parse,
                            body=body)


def n_predict(value, state: ServerState) -> int:
    """The answer's length: llama.cpp's n_predict (-1: until the context ends it; 0: only read the
    prompt, which readies the caches for the next request), the server's --max-tokens if left out."""
    if value is None:
        return state.options.max_tokens
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise invalid(f"n_predict must be an integer >= -1 (-1: no limit, 0: read the prompt only), got "
                      f"{shown(value)}", "n_predict")
    return (state.engine.context or UNBOUNDED) if value == -1 else value


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


def _n_probs(body: dict) -> Tuple[int, bool]:
    """llama.cpp's n_probs (0: none), refused past what the engine gives, and post_sampling_probs
    (the probabilities after the sampling chain, as `prob` and `top_probs`, not the model's own)."""
    n = body.get("n_probs")
    n = 0 if n is None else n
    if not is_top_count(n, MOST_TOP):
        raise invalid(f"n_probs must be an integer in 0..{MOST_TOP} (the best tokens listed per position; 0: none), "
                      f"got {shown(n)}", "n_probs")
    return n, schema.flag(body, "post_sampling_probs", False)


def _bias(given) -> dict:
    """llama.cpp's logit_bias, `[[id, bias], ...]` or `{"id": bias}` (a bias of false bans the
    token), as OpenAI's `{"id": bias}` (-100 bans)."""
    pairs = given.items() if isinstance(given, dict) else given if isinstance(given, list) else None
    out = {}
    for pair in pairs if pairs is not None else [None]:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or isinstance(pair[0], bool) \
                or not isinstance(pair[0], (int, str)) or isinstance(pair[0], str) and not pair[0].isdigit():
            raise invalid(f"logit_bias must be [[token id, bias], ...] or {{\"token id\": bias}} (a bias of false bans "
                          f"the token; tokens are named by id here, not by text), got {shown(given)}", "logit_bias")
        out[str(pair[0])] = -100 if pair[1] is False else pair[1]
    return out


def _fields(fields) -> Optional[List[str]]:
    if fields is None or fields == []:
        return None
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise invalid(f"response_fields must be a list of field names (\"content\", \"timings/prompt_n\"...), got "
                      f"{shown(fields)}", "response_fields")
    return fields


def _renamed(error: APIError) -> APIError:
    """A completions error in llama.cpp's terms."""
    names = {"max_tokens": "n_predict", "repetition_penalty": "repeat_penalty", "guided_json": "json_schema"}
    name = names.get(error.param or "")
    return error if name is None else error.named(name)


class LlamaBuilder:
    """One answer in llama.cpp's /completion shape, whole or as server-sent events."""

    def __init__(self, endpoint: str, model: str, fields: Optional[List[str]], warm_only: bool, truncated: bool,
                 tokens: Optional[LogprobStream] = None, probs: bool = False, ids: bool = False, post: bool = False):
        self.id = f"{endpoint}-" + uuid.uuid4().hex[:24]  # for the log
        self.post = post  # post_sampling_probs: `prob` and `top_probs`, linear, as llama.cpp names them
        self.model, self.fields = model, fields
        self.warm_only, self.truncated = warm_only, truncated
        self.stream, self.probs, self.ids = tokens, probs, ids  # the tokens that spell the text, as they go out
        self._ready: list = []  # (event, its bytes, offset) whose text is out, not sent yet

    def tokens(self, events: list) -> None:
        """The events behind the text fed next: their ids and probabilities go out with it."""
        if self.stream is not None:
            self._ready += self.stream.ready(events)

    def whole(self, reasoning: str, text: str, calls: list, finish: str, usage: dict, stats, stopped_by=None) -> dict:
        final = self._final("" if self.warm_only else text, finish, usage, stats, stopped_by)
        return self._picked(dict(final, **self._taken()))

    def start(self, prompt_tokens: int, cached_tokens: int = 0) -> List[bytes]:
        return []

    def feed(self, reasoning: str, text: str, calls: list) -> List[bytes]:
        if not text or self.warm_only:
            return []
        return [sse(self._picked({"index": 0, "content": text, "tokens": [], "stop": False, **self._taken()}))]

    def finish(self, finish: str, usage: dict, stats, stopped_by=None) -> List[bytes]:
        return [sse(self._picked(self._final("", finish, usage, stats, stopped_by)))]

    def _taken(self) -> dict:
        """The ids (`return_tokens`) and `completion_probabilities` (`n_probs`) of the tokens whose
        text is out and not yet sent, as llama.cpp gives them."""
        ready, self._ready = self._ready, []
        out = {"tokens": [ev.token for ev, _, _ in ready]} if self.ids else {}
        if self.probs:
            key, top = ("prob", "top_probs") if self.post else ("logprob", "top_logprobs")

            def entry(token: int, raw: bytes, logprob: float) -> dict:
                return {"id": token, "token": raw.decode("utf-8", "replace"), "bytes": list(raw),
                        key: math.exp(logprob) if self.post else logprob}

            out["completion_probabilities"] = [
                dict(entry(ev.token, raw, ev.logprob),
                     **{top: [entry(t, self.stream.token_bytes(t), lp) for t, lp in ev.top_logprobs]})
                for ev, raw, _ in ready]
        return out

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
        return {"index": 0, "content": text, "tokens": [], "stop": True, "model": self.model,
                "tokens_predicted": generated,
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

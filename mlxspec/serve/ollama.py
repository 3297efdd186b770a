"""Ollama's API (POST /api/chat, /api/generate), served by the chat and completions paths, for the
editors and apps that speak it (GitHub Copilot's and Zed's Ollama providers, Open WebUI, Continue,
the `ollama` client).

A request is translated into a chat or completions body: `options` become the OpenAI-style
fields (`num_predict` -> max_tokens, `repeat_penalty` over `repeat_last_n` -> repetition_penalty
over repetition_context_size), `format` "json" or a schema -> response_format, `think` -> the
template's enable_thinking (or reasoning_effort), an assistant's tool calls get ids and a tool's
answer (`tool_name`) the id of the call it answers. /api/generate is a chat of its `system` and
`prompt`, or with `raw` the prompt as it is, or with `suffix` a fill-in-the-middle completion.
`OllamaBuilder` writes the answer as Ollama does: one JSON object, or (Ollama's default) one per
line, the last with `done` and the counts and durations (nanoseconds). Errors are `{"error": ...}`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..errors import shown
from ..tools import arguments_object
from .errors import APIError, invalid, unsupported
from .fields import OWN
from .responses import figures
from .schema import flag

# The Ollama release whose API these routes follow (/api/version): clients check it before using one.
VERSION = "0.12.0"
# Ollama's options that are OpenAI-style fields here: sampling, length, stops, penalties. The
# chat path checks them (and refuses tfs_z other than off).
OPTIONS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed",
           "stop": "stop", "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
           "num_predict": "max_tokens", "repeat_penalty": "repetition_penalty", "typical_p": "typical_p",
           "tfs_z": "tfs_z", "mirostat": "mirostat", "mirostat_tau": "mirostat_tau", "mirostat_eta": "mirostat_eta"}
REPEAT_LAST_N = 64  # Ollama's default look-back of repeat_penalty
UNBOUNDED = 1 << 30  # num_predict -1 (no limit) and -2 (until the context is full): the context ends it


def to_chat(body: dict, context: Optional[int]) -> Tuple[dict, List[str]]:
    """An /api/chat body -> (the chat completions body that answers it, the options it ignores)."""
    chat, ignored = _common(body, context)
    given = body.get("messages")
    if not isinstance(given, list):
        raise invalid(f"messages must be a list of {{\"role\", \"content\"}} objects, got {shown(given)}",
                      "messages")
    chat["messages"] = _messages(given)
    if body.get("tools") is not None:
        chat["tools"] = body["tools"]
    return chat, ignored


def to_generate(body: dict, context: Optional[int], templated: bool = True) -> Tuple[str, dict, List[str]]:
    """An /api/generate body -> ("chat" or "completion", the body that answers it, ignored options).
    `templated`: the model has a chat template (a base model's prompt is taken as it is, as Ollama's
    "{{ .Prompt }}" template for one does)."""
    out, ignored = _common(body, context)
    for key, why in (("template", "the model's own chat template is used: send raw true with the prompt laid out "
                                  "as you want it"),
                     ("context", "send the conversation to /api/chat, or the whole text with raw true")):
        if body.get(key):  # (Ollama's deprecated `context`: the last answer's token ids)
            raise unsupported(f"{key} is not supported by this server: {why}", key)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise invalid(f"prompt must be a string, got {shown(prompt)}", "prompt")
    if body.get("suffix") is not None or flag(body, "raw", False) or not templated:  # as it is, or filled in
        if out.pop("logprobs", None):  # completions' logprobs: how many alternatives
            out["logprobs"] = out.pop("top_logprobs", 0)
        out["prompt"] = prompt
        if body.get("suffix") is not None:
            out["suffix"] = body["suffix"]
        return "completion", out, ignored
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        raise invalid(f"system must be a string, got {shown(system)}", "system")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return "chat", dict(out, messages=messages), ignored


def loads_only(body: dict, kind: str) -> bool:
    """A request with nothing to answer, which Ollama's clients send to load (or unload) a model."""
    if kind == "chat":
        return body.get("messages") in (None, [])
    return body.get("prompt") in (None, "") and body.get("suffix") is None


def _common(body: dict, context: Optional[int]) -> Tuple[dict, List[str]]:
    """What both routes share: model, stream (Ollama's default: on), options, format, think, logprobs."""
    out: Dict[str, Any] = {key: body[key] for key in ("model", *OWN) if key in body}
    out["stream"] = True if body.get("stream") is None else body["stream"]
    if body.get("images"):
        raise unsupported("images are not supported by this server: its models read text only", "images")
    ignored = _options(body.get("options"), out, context)
    fmt = body.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    elif fmt not in (None, ""):
        raise invalid(f"format must be \"json\" or a JSON schema (an object), got {shown(fmt)}", "format")
    think = body.get("think")
    if isinstance(think, bool):
        out["chat_template_kwargs"] = {"enable_thinking": think}
    elif think in ("low", "medium", "high"):  # gpt-oss's levels
        out["reasoning_effort"] = think
    elif think is not None:
        raise invalid(f"think must be true, false, \"low\", \"medium\" or \"high\", got {shown(think)}", "think")
    if flag(body, "logprobs", False):
        out["logprobs"] = True
    if body.get("top_logprobs") is not None:  # (without logprobs: refused, saying so)
        out["top_logprobs"] = body["top_logprobs"]
    return out, ignored


def _options(options, out: dict, context: Optional[int]) -> List[str]:
    """`options` into `out`'s fields; returns the names not read (Ollama's runner's own settings,
    num_ctx, num_gpu, num_thread...: the model here is loaded once, as `mlxspec serve` was told)."""
    if options is None:
        return []
    if not isinstance(options, dict):
        raise invalid(f"options must be an object (temperature, num_predict, stop...), got {shown(options)}",
                      "options")
    for name, field in OPTIONS.items():
        if options.get(name) is not None:
            out[field] = options[name]
    random_seed(out)
    if out.get("max_tokens") in (-1, -2) and not isinstance(out["max_tokens"], bool):
        out["max_tokens"] = context or UNBOUNDED  # no limit / fill the context: the context ends the answer
    if out.get("repetition_penalty") is not None:
        size = repeat_window(options.get("repeat_last_n", REPEAT_LAST_N), context, "options.repeat_last_n")
        if size is None:
            out.pop("repetition_penalty")
        else:
            out["repetition_context_size"] = size
    return [name for name in options if name not in OPTIONS and name != "repeat_last_n"]


def random_seed(fields: dict) -> None:
    """llama.cpp's and Ollama's seed -1 (their default) is a random seed: no seed here."""
    if fields.get("seed") == -1:
        del fields["seed"]


def repeat_window(last, context: Optional[int], param: str) -> Optional[int]:
    """llama.cpp's and Ollama's repeat_last_n, the tokens repeat_penalty looks back over (-1: the
    whole context, 0: off), as the chat path's repetition_context_size; None when off."""
    if isinstance(last, bool) or not isinstance(last, int) or last < -1:
        raise invalid(f"{param} must be an integer >= -1 (the last tokens repeat_penalty looks back over; -1: the "
                      f"whole context, 0: off), got {shown(last)}", param)
    if last == 0:
        return None
    return (context or UNBOUNDED) if last == -1 else last


def renamed(error: APIError) -> APIError:
    """A chat request's error in Ollama's terms: a field that came from `options` is named so, and
    `format` is the response_format it became."""
    if error.param == "response_format":
        return error.named("format")
    name = {field: name for name, field in OPTIONS.items()}.get(error.param or "")
    return error if name is None else error.named(f"options.{name}")


def _messages(given: list) -> List[dict]:
    """Ollama's messages -> chat messages: calls get ids, and a tool's answer the id of the call it
    answers (the earliest unanswered one of its `tool_name`, else the earliest unanswered)."""
    out: List[dict] = []
    waiting: List[Tuple[str, Any]] = []  # (id, name) of the calls not answered yet
    for i, m in enumerate(given):
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid(f"{at} must be an object with 'role' and 'content', got {shown(m)}", at)
        if m.get("images"):
            raise unsupported(f"{at}.images: images are not supported by this server: its models read text only",
                              f"{at}.images")
        message = {key: m[key] for key in ("role", "content") if key in m}
        calls = m.get("tool_calls")
        if calls and m.get("role") == "assistant" and isinstance(calls, list):
            message["tool_calls"] = [_call(call, f"{at}.tool_calls[{j}]", f"call_{i}_{j}")
                                     for j, call in enumerate(calls)]
            waiting += [(c["id"], c["function"]["name"]) for c in message["tool_calls"]]
        elif calls is not None:
            message["tool_calls"] = calls  # the chat path says what is wrong with them
        if m.get("role") == "tool":
            name = m.get("tool_name", m.get("name"))
            message["tool_call_id"] = _answered(waiting, name, m.get("tool_call_id")) or f"call_{i}"
            if isinstance(name, str):
                message["name"] = name
        out.append(message)
    return out


def _call(call, where: str, default_id: str) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict):
        raise invalid(f"{where} must be {{\"function\": {{\"name\", \"arguments\"}}}}, got {shown(call)}", where)
    name, arguments = fn.get("name"), fn.get("arguments", {})
    if not isinstance(name, str):
        raise invalid(f"{where}.function.name must be the function's name (a string), got {shown(name)}",
                      f"{where}.function.name")
    if not isinstance(arguments, (dict, str)):  # (a string of JSON is read as OpenAI's: the chat path checks it)
        raise invalid(f"{where}.function.arguments must be an object (the call's arguments by name), got "
                      f"{shown(arguments)}", f"{where}.function.arguments")
    return {"id": call.get("id") or default_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _answered(waiting: List[Tuple[str, Any]], name, given=None) -> Optional[str]:
    """The id of the call a tool message answers (`given`: the id it names), taken off `waiting`."""
    if given is not None:
        waiting[:] = [w for w in waiting if w[0] != given]
        return given
    if not waiting:
        return None
    at = next((i for i, (_, called) in enumerate(waiting) if called == name), 0)
    return waiting.pop(at)[0]


def error_response_body(error: APIError) -> dict:
    """An error in Ollama's shape."""
    return {"error": error.message}


def created_at() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def line(body: dict) -> bytes:
    """One object of Ollama's newline-delimited JSON stream."""
    return json.dumps(body, ensure_ascii=False).encode() + b"\n"


class OllamaBuilder:
    """One answer in Ollama's shape: /api/chat's `message` or /api/generate's `response`, whole or
    one object per line."""

    def __init__(self, model: str, route: str, token_text: Optional[Callable[[int], bytes]] = None):
        self.id = f"{route}-" + uuid.uuid4().hex[:24]  # for the log (Ollama's answers have no id)
        self.model, self.chat = model, route == "chat"
        self.began = time.perf_counter_ns()
        self.token_text = token_text  # a token's bytes, for logprobs (None: none asked for)
        self._logprobs: List[dict] = []  # those not sent yet

    def tokens(self, events: list) -> None:
        """The logprobs of new tokens, sent with the next text."""
        if self.token_text is None:
            return
        for ev in events:
            if ev.logprob is not None:
                entry = self._logprob(ev.token, ev.logprob)
                entry["top_logprobs"] = [self._logprob(t, lp) for t, lp in ev.top_logprobs or []]
                self._logprobs.append(entry)

    def _logprob(self, token: int, logprob: float) -> dict:
        raw = self.token_text(token)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}

    def whole(self, reasoning: str, text: str, calls: list, finish: str, usage: dict, stats, stopped_by=None) -> dict:
        return dict(self._part(reasoning, text, calls), **self._done(finish, usage, stats))

    def start(self, prompt_tokens: int, cached_tokens: int = 0) -> List[bytes]:
        return []  # Ollama's stream begins with the first text

    def feed(self, reasoning: str, text: str, calls: list) -> List[bytes]:
        if not (reasoning or text or calls):
            return []
        return [line(dict(self._part(reasoning, text, calls), done=False))]

    def finish(self, finish: str, usage: dict, stats, stopped_by=None) -> List[bytes]:
        return [line(dict(self._part("", "", []), **self._done(finish, usage, stats)))]

    @staticmethod
    def error(e: APIError) -> bytes:
        return line(error_response_body(e))

    def _part(self, reasoning: str, text: str, calls: list) -> dict:
        body: Dict[str, Any] = {"model": self.model, "created_at": created_at()}
        if self.chat:
            message: Dict[str, Any] = {"role": "assistant", "content": text}
            if reasoning:
                message["thinking"] = reasoning
            if calls:
                message["tool_calls"] = [self._call(c, i) for i, c in enumerate(calls)]
            body["message"] = message
        else:
            body["response"] = text
            if reasoning:
                body["thinking"] = reasoning
        if self._logprobs:
            body["logprobs"], self._logprobs = self._logprobs, []
        return body

    def _done(self, finish: str, usage: dict, stats) -> dict:
        return {"done": True, "done_reason": "length" if finish == "length" else "stop",
                "total_duration": time.perf_counter_ns() - self.began, "load_duration": 0,
                "prompt_eval_count": usage["prompt_tokens"], "prompt_eval_duration": int(stats.prompt_seconds * 1e9),
                "eval_count": usage["completion_tokens"], "eval_duration": int(stats.seconds * 1e9),
                "mlxspec": figures(stats)}

    @staticmethod
    def _call(call: dict, index: int) -> dict:
        fn = call["function"]
        return {"id": call.get("id") or "call_" + uuid.uuid4().hex[:24],
                "function": {"index": index, "name": fn["name"], "arguments": arguments_object(fn["arguments"])}}


def loaded(model: str, route: str, unload: bool) -> dict:
    """The answer to a request with nothing to answer: the model is loaded (it always is here)."""
    body = {"model": model, "created_at": created_at(), "done": True, "done_reason": "unload" if unload else "load"}
    body.update({"message": {"role": "assistant", "content": ""}} if route == "chat" else {"response": ""})
    return body


# -- the model ----------------------------------------------------------------------------------------
def model_entry(state, loaded: bool = False) -> dict:
    """The served model as /api/tags lists it (`size`: its weights' bytes on disk) and /api/ps
    (`loaded`: in memory, all of it the GPU's on a Mac)."""
    info = getattr(state.engine, "target_info", None)
    modified = datetime.fromtimestamp(_mtime(info) or state.created, timezone.utc)
    size = int(getattr(info, "weights_bytes", 0) or 0) if loaded else _stored_bytes(info)
    entry = {"name": state.model_id, "model": state.model_id, "modified_at": modified.isoformat(), "size": size,
             "digest": hashlib.sha256(f"{state.model_id}\n{state.fingerprint}".encode()).hexdigest(),
             "details": details(state.engine)}
    return dict(entry, size_vram=size) if loaded else entry


def details(engine) -> dict:
    info = getattr(engine, "target_info", None)
    family = _family(engine)
    gguf = getattr(info, "format", None) == "gguf"
    quant = getattr(info, "quantization", "") or ""
    if gguf and quant.startswith("GGUF "):
        quant = quant.split()[1]  # "GGUF Q4_1 (token_embd Q8_0)" -> "Q4_1", Ollama's way to name it
    return {"parent_model": "", "format": "gguf" if gguf else "safetensors", "family": family,
            "families": [family], "parameter_size": _parameter_size(_parameters(engine)), "quantization_level": quant}


def show(state) -> dict:
    """POST /api/show: what the served model is and can do (clients read its context and capabilities)."""
    engine = state.engine
    family = _family(engine)
    args = getattr(getattr(engine, "target_model", None), "args", None)
    info = {"general.architecture": family, "general.basename": state.model_id,
            "general.parameter_count": _parameters(engine)}
    context = state.context
    if context:
        info[f"{family}.context_length"] = context
    for key, attr in (("embedding_length", "hidden_size"), ("block_count", "num_hidden_layers"),
                      ("attention.head_count", "num_attention_heads"),
                      ("attention.head_count_kv", "num_key_value_heads")):
        if isinstance(getattr(args, attr, None), int):
            info[f"{family}.{key}"] = getattr(args, attr)
    capabilities = ["completion"]
    if state.tool_format is not None:
        capabilities.append("tools")
    if engine.fim_format is not None:
        capabilities.append("insert")
    if state.thinking is not None:
        capabilities.append("thinking")
    target = getattr(getattr(engine, "target_info", None), "ref", None) or state.model_id
    # the defaults a request without options gets, in a Modelfile's words (clients read num_ctx)
    parameters = f"temperature {state.options.temperature:g}\nnum_predict {state.options.max_tokens}"
    if context:
        parameters += f"\nnum_ctx {context}"
    return {"license": "", "modelfile": f"# served by mlxspec\nFROM {target}\n", "parameters": parameters,
            "template": getattr(engine.tokenizer, "chat_template", None) or "", "details": details(engine),
            "model_info": info, "capabilities": capabilities, "modified_at": model_entry(state)["modified_at"]}


def _family(engine) -> str:
    args = getattr(getattr(engine, "target_model", None), "args", None)
    return getattr(args, "model_type", None) or "unknown"


def _parameters(engine) -> int:
    from mlx_lm.utils import get_total_parameters

    model = getattr(engine, "target_model", None)
    return int(get_total_parameters(model)) if model is not None else 0


def _parameter_size(n: int) -> str:
    """Ollama's way to write a parameter count: "135M", "7.6B"."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.{0 if n >= 100 * scale else 1}f}{unit}"
    return str(n)


def _stored_bytes(info) -> int:
    from ..loading.ondisk import weights_bytes_on_disk
    from ..loading.resolve import Resolved

    if info is None:
        return 0
    try:
        return weights_bytes_on_disk(Resolved(info.ref, Path(info.path), info.format, info.source))
    except OSError:  # (moved or deleted since it was loaded)
        return 0


def _mtime(info) -> Optional[float]:
    try:
        return os.stat(info.path).st_mtime if info is not None else None
    except OSError:
        return None

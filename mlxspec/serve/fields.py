"""Request fields a route does not read: named in the log (a typo such as `max_token` would
otherwise fall back to the default unseen), never refused, since clients send vendor extras.
And fields one API names otherwise, sent to another's route: refused, naming the route's own.

`KNOWN` is the union of every endpoint's fields, including those the APIs define that are
accepted and change nothing here (`user`, `metadata`, `store`...). The chat and completions
routes read most of it; the routes that translate another API read only theirs (`READS`).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from ..dry import FIELDS as DRY_FIELDS
from .schema import EXTENSIONS, GUIDED, RENAMED, SAMPLING_DEFAULTS

OPENAI = {  # chat completions, completions and the Responses API (several ignored here on purpose)
    "model", "messages", "prompt", "suffix", "echo", "best_of", "n", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "seed", "stop", "stream", "stream_options", "logprobs", "top_logprobs",
    "logit_bias", "presence_penalty", "frequency_penalty", "response_format", "tools", "tool_choice",
    "parallel_tool_calls", "functions", "function_call", "reasoning_effort", "user", "metadata", "store",
    "service_tier", "modalities", "audio", "prediction", "web_search_options", "verbosity",
    "prompt_cache_key", "safety_identifier",
    "input", "instructions", "max_output_tokens", "previous_response_id", "reasoning", "text", "include",
    "truncation", "background", "conversation", "max_tool_calls", "prompt_cache_retention",
}
ANTHROPIC = {"system", "stop_sequences", "thinking", "top_k", "container", "mcp_servers", "context_management"}
OTHERS = {  # vLLM's, mlx-lm's and llama.cpp's that are read (or refused with a reason) here
    "min_p", "repetition_penalty", "repetition_context_size", "stop_token_ids", "ignore_eos", "min_tokens",
    "include_stop_str_in_output", "continue_final_message", "add_generation_prompt", "chat_template_kwargs",
    "add_special_tokens", "return_token_strs", "with_pieces", "add_special", "parse_special", "content", "tokens",
    *SAMPLING_DEFAULTS, *DRY_FIELDS,
}
OLLAMA = {"options", "format", "think", "keep_alive", "raw", "template", "context", "images", "name", "verbose"}
# What llama.cpp's /completion and /infill read (`llama_cpp.py`, `infill.py`), llama.cpp's own fields among them;
# the rest of llama.cpp's fields (cache_prompt, samplers, t_max_prompt_ms, which llama.cpp does not implement
# either, id_slot...) change nothing here, and the log names them once.
LLAMA_SAMPLING = (*SAMPLING_DEFAULTS, "seed", "stop", "presence_penalty", "frequency_penalty", "ignore_eos",
                  *DRY_FIELDS)
LLAMA_COMPLETION = {"prompt", "n_predict", "stream", "response_fields", "repeat_penalty", "repeat_last_n", "n_indent",
                    "t_max_predict_ms", "json_schema", "grammar", "logit_bias", "n_probs", "post_sampling_probs",
                    "return_tokens", *LLAMA_SAMPLING}
INFILL = {"input_prefix", "input_suffix", "input_extra", *LLAMA_COMPLETION}
OWN = {"speculative", "num_draft", "drafter", "tree", "lookup"}  # the engine's, per request
# What Ollama's /api/chat and /api/generate read (`ollama.py`); `options`' own names are ollama.OPTIONS
OLLAMA_CHAT = {"model", "messages", "tools", "format", "options", "stream", "keep_alive", "think", "logprobs",
               "top_logprobs", *OWN}
OLLAMA_GENERATE = {"model", "prompt", "suffix", "system", "template", "context", "raw", "images", "format", "options",
                   "stream", "keep_alive", "think", "logprobs", "top_logprobs", *OWN}
# What the embeddings routes read (`embeddings.py`): OpenAI's, llama.cpp's (/embedding, and /embeddings
# with `content`) and Ollama's /api/embed and /api/embeddings
EMBEDDINGS = {"model", "input", "encoding_format", "dimensions", "user"}
LLAMA_EMBEDDING = {"model", "content", "input", "embd_normalize"}
OLLAMA_EMBED = {"model", "input", "truncate", "dimensions", "options", "keep_alive"}
KNOWN = frozenset(OPENAI | ANTHROPIC | OTHERS | OLLAMA | INFILL | OWN | set(EXTENSIONS) | set(GUIDED)
                  | set(RENAMED) | EMBEDDINGS | LLAMA_EMBEDDING | OLLAMA_EMBED)
SHOWN = 8  # names per log line: a body of junk keys makes one short line, not a long one
API_PREFIX = "/v1"  # OpenAI's and Anthropic's routes are served with it and without it (`app.py`)
OLLAMA_PREFIX = "/api/"  # Ollama's routes, served as Ollama names them


def api_route(path: str) -> str:
    """The route a request's path names, as the tables here key it: with the /v1 it may be sent without."""
    return path if path.startswith((API_PREFIX + "/", OLLAMA_PREFIX)) else API_PREFIX + path


def _reads() -> dict:
    """What the routes that translate another API's request read (their own fields, and those the
    API defines that are accepted and change nothing here): any other API's field is dropped there."""
    from . import anthropic, responses_api

    messages = set(anthropic.PASSED) | {"messages", "system", "stop_sequences", "tools", "tool_choice", "thinking",
                                        "metadata", "service_tier", "container", "mcp_servers", "context_management"}
    responses = set(responses_api.PASSED) | {
        "input", "instructions", "max_output_tokens", "reasoning", "tools", "tool_choice", "text", "store", "include",
        "previous_response_id", "conversation", "background", "truncation", "metadata", "user", "max_tool_calls",
        "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "service_tier", "stream_options",
        "top_logprobs"}
    return {"/v1/messages": messages, "/v1/messages/count_tokens": messages, "/v1/responses": responses,
            "/v1/responses/input_tokens": responses,
            "/api/chat": OLLAMA_CHAT, "/api/generate": OLLAMA_GENERATE,
            "/api/show": {"model", "name", "verbose"}, "/v1/infill": INFILL | OWN,
            "/v1/completion": LLAMA_COMPLETION | OWN, "/v1/embeddings": EMBEDDINGS | LLAMA_EMBEDDING,
            "/v1/embedding": LLAMA_EMBEDDING, "/api/embed": OLLAMA_EMBED,
            "/api/embeddings": {"model", "prompt", "options", "keep_alive"}}


READS = _reads()


def unread(route: str, body: dict) -> List[str]:
    """The top-level keys of `body` that `route` does not read, in the order sent: those no endpoint
    here reads, and on a route that translates another API (Responses, Anthropic's Messages) the
    other APIs' fields too (`n` or `logit_bias` on /v1/messages)."""
    reads = READS.get(api_route(route))
    return [key for key in body if key not in KNOWN or (reads is not None and key not in reads)]


# Another API's name for what a route reads under its own. Every route knows every API's names (the
# log names only those no route reads), so these would be dropped unseen: a client porting from chat
# completions would get the server's default length for its max_tokens on /v1/responses.
_TO_MESSAGES = {"stop": "stop_sequences", "max_completion_tokens": "max_tokens", "max_output_tokens": "max_tokens",
                "instructions": "system"}
_SYSTEM = "a first message with role \"system\""
_TO_RESPONSES = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens", "messages": "input",
                 "response_format": "text.format", "reasoning_effort": "reasoning.effort", "system": "instructions",
                 "stop_sequences": "stop"}
# (Ollama's own server drops these unseen: a client porting from OpenAI's API would get its defaults)
_TO_OLLAMA = {"max_tokens": "options.num_predict", "max_completion_tokens": "options.num_predict",
              "temperature": "options.temperature", "top_p": "options.top_p", "top_k": "options.top_k",
              "min_p": "options.min_p", "seed": "options.seed", "stop": "options.stop", "response_format": "format",
              "presence_penalty": "options.presence_penalty", "frequency_penalty": "options.frequency_penalty",
              "repetition_penalty": "options.repeat_penalty"}
MOVED = {
    "/v1/chat/completions": {"max_output_tokens": "max_completion_tokens (or max_tokens)", "stop_sequences": "stop",
                             "instructions": _SYSTEM, "system": _SYSTEM},
    "/v1/completions": {"max_output_tokens": "max_tokens", "stop_sequences": "stop"},
    "/v1/responses": _TO_RESPONSES,
    "/v1/responses/input_tokens": _TO_RESPONSES,
    "/v1/messages": _TO_MESSAGES,
    "/v1/messages/count_tokens": _TO_MESSAGES,
    "/api/chat": _TO_OLLAMA,
    "/api/generate": _TO_OLLAMA,
    "/v1/infill": {"max_tokens": "n_predict", "suffix": "input_suffix"},
    "/v1/completion": {"max_tokens": "n_predict", "max_completion_tokens": "n_predict",
                       "repetition_penalty": "repeat_penalty", "response_format": "json_schema"},
}


def moved(route: str, body: dict) -> Optional[Tuple[str, str]]:
    """(field, what `route` reads instead) for the first field of `body` that another API names so
    (null ones are as good as left out), or None."""
    names = MOVED.get(api_route(route), {})
    return next(((key, names[key]) for key in body if key in names and body[key] is not None), None)

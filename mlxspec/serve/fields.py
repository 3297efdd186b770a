"""Request fields no endpoint of this server knows: named in the log (a typo such as `max_token`
would otherwise fall back to the default unseen), never refused, since clients send vendor extras.

The list is the union of every endpoint's fields, including those the APIs define that are
accepted and change nothing here (`user`, `metadata`, `store`...), so one set serves all routes.
"""

from __future__ import annotations

from typing import List

from .schema import EXTENSIONS, GUIDED, RENAMED

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
    "xtc_threshold", "add_special_tokens", "return_token_strs", "with_pieces", "content", "tokens",
}
OWN = {"speculative", "num_draft", "drafter", "tree", "lookup"}  # the engine's, per request
KNOWN = frozenset(OPENAI | ANTHROPIC | OTHERS | OWN | set(EXTENSIONS) | set(GUIDED) | set(RENAMED))
SHOWN = 8  # names per log line: a body of junk keys makes one short line, not a long one


def unknown(body: dict) -> List[str]:
    """The top-level keys of `body` that no endpoint here reads, in the order sent."""
    return [key for key in body if key not in KNOWN]

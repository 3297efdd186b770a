"""What `mlxspec serve` can be told: one dataclass the command line fills and the tests build."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

DEFAULT_MAX_BODY = 8 * 2**20  # bytes; a long conversation in JSON is well under this
# Earlier conversations whose caches `mlxspec serve` has its engine keep (Engine's prompt_cache_size).
DEFAULT_PROMPT_CACHE = 4
# Where a thinking model's reasoning goes: mlx-lm's and vLLM's key, DeepSeek's API's and
# llama.cpp's, or nowhere (left in `content`, markers and all).
REASONING_KEYS = ("reasoning", "reasoning_content", "none")


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"  # loopback only; anything else should come with an api_key
    port: int = 8080
    api_key: Optional[str] = None  # when set, every route but /health and / needs "Authorization: Bearer <api_key>"
    queue: int = 16  # requests that may wait while one generates; more get 429
    max_tokens: int = 512  # for requests that give neither max_tokens nor max_completion_tokens
    temperature: float = 0.0  # for requests that give none (0 = greedy; OpenAI's own default is 1)
    max_body_size: int = DEFAULT_MAX_BODY  # larger request bodies get 413
    shutdown_grace: float = 10.0  # seconds a running request may take to finish after SIGINT/SIGTERM
    client_timeout: float = 30.0  # seconds for a request's head, and between two pieces of its body (0: none)
    allow_origins: Tuple[str, ...] = ()  # web pages' origins (besides this machine's) that may call it; "*": any
    chat_template_args: Optional[dict] = None  # template variables for every chat request (a request's own win)
    reasoning_key: str = "reasoning"  # one of REASONING_KEYS
    model_id: Optional[str] = None  # the name /v1/models lists; default: the pair's name or the target
    responses_dir: Optional[str] = None  # where stored Responses API responses are also written (None: memory only)
    pooling: str = "mean"  # how embeddings pool the hidden states: one of mlxspec.embed.POOLINGS
    log_level: str = "info"

"""The Starlette app: its routes, middleware and error shapes, and the state the routes share.

    POST /v1/chat/completions   POST /v1/completions   POST /v1/responses[/input_tokens]
    POST /v1/messages[/count_tokens]   GET|DELETE /v1/responses/{id}   GET /v1/responses/{id}/input_items
    GET /v1/models[/{id}]   GET /health
    POST /v1/embeddings   POST /tokenize   POST /detokenize   GET /metrics
    (the /v1 routes also without /v1, as mlx-lm's server answers /chat/completions)

Every request is answered on the event loop; the model runs on the queue's worker thread.
A request is checked (schema.py), queued, and answered once its first tokens exist
(generation.py; other APIs' requests as chats, translated.py), so an error the engine finds
before generating (a prompt past the context) is still a 400, not a broken stream. A client
that goes away cancels its job, waiting or running.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import List, Optional

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .. import harmony
from ..embed import check_pooling
from ..errors import InvalidArgumentError, shown as _show
from ..logprobs import token_bytes
from ..once import SaidOnce
from ..reasoning import thinking_markers
from . import embeddings, schema, tokenize
from .auth import BearerAuth
from .body import read_json
from .cors import CrossOrigin, Origins
from .errors import APIError, internal
from .fields import API_PREFIX
from .fingerprint import system_fingerprint
from .generation import openai_route
from .infill import infill
from . import llama_cpp
from .local import LoopbackOnly, is_loopback
from .messages import chat_messages
from .metrics import Metrics, count_error
from . import ollama_routes
from .options import REASONING_KEYS, ServeOptions
from .queue import EngineQueue
from .response_store import ResponseStore
from .translated import (count_message_tokens, count_response_tokens, create_message, create_response,
                         delete_response, get_response, list_input_items)

log = logging.getLogger("mlxspec.serve")
ROUTES_HELP = ("POST /v1/chat/completions, POST /v1/completions, POST /v1/responses[/input_tokens], GET and DELETE "
               "/v1/responses/{id}, GET /v1/responses/{id}/input_items, POST /v1/messages[/count_tokens], "
               "GET /v1/models, "
               "POST /v1/embeddings (each also without /v1), GET /health, POST /tokenize, POST /detokenize, GET "
               "/metrics, llama.cpp's POST /completion, POST /infill, POST /embedding, POST /apply-template and GET "
               f"/props, and Ollama's "
               f"{ollama_routes.ROUTES_TEXT}")


class ServerState:
    """What the routes share: the engine's queue, the options, the name the model is served under."""

    def __init__(self, engine, options: ServeOptions):
        self.engine = engine
        self.options = options
        self.queue = EngineQueue(engine, limit=options.queue)
        self.model_id = options.model_id or getattr(engine, "pair_name", None) or _target_ref(engine) or "mlxspec"
        self.created = int(time.time())
        self.fingerprint = system_fingerprint(engine)
        self.metrics = Metrics(self.model_id, getattr(engine, "default_drafter", None))
        self.responses = ResponseStore(folder=options.responses_dir)  # the Responses API's stored responses
        self._other_names = SaidOnce(32)  # model names other than ours, said once each for the first few
        self._told_fields = SaidOnce(256)  # (route, ignored field names) the log has named
        # Read at start, not on a first request: a template without a known marker makes mlx-lm
        # look through the whole vocabulary.
        self.tool_format = getattr(engine, "tool_format", None)
        tokenizer = getattr(engine, "tokenizer", None)
        # a thinking model's markers: its reasoning is split off (unless the server is told to leave
        # it). Harmony's channels are read either way: their headers are not text, and calls are
        # messages; told to leave the reasoning, it stays in the content (`merged`).
        markers = thinking_markers(tokenizer)
        self.merged = options.reasoning_key == "none"
        self.thinking = markers if not self.merged or markers == harmony.MARKERS else None
        # A token's own bytes, for logprobs (without a tokenizer: its id)
        self.token_bytes = functools.lru_cache(maxsize=65536)(
            lambda t: token_bytes(tokenizer, t) if tokenizer is not None else str(t).encode())

    def model_card(self) -> dict:
        engine = self.engine
        draft = getattr(engine, "draft_info", None)
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "mlxspec",
                "mlxspec": {"target": _target_ref(engine), "draft": getattr(draft, "ref", None),
                            "drafter": getattr(engine, "default_drafter", None),
                            "context": getattr(engine, "context", None),
                            "max_kv_size": getattr(engine, "max_kv_size", None),
                            "kv_bits": getattr(getattr(engine, "kv_quant", None), "bits", None)}}

    @property
    def context(self) -> Optional[int]:
        """The context a request may fill, as clients are told it: the engine's, else (its window
        is shorter than the model's) the context the weights declare."""
        engine = self.engine
        return getattr(engine, "context", None) or getattr(getattr(engine, "target_info", None), "context_length", None)

    def note_model(self, name: Optional[str]) -> None:
        """Any model name is served by the one loaded model; say so once per unknown name."""
        if name and name != self.model_id and self._other_names.first(name):
            log.info("a request named model %s; this server serves %r and answers with it", _show(name), self.model_id)

    def first_told(self, route: str, ignored: List[str]) -> bool:
        """Whether the log has yet to name these ignored fields on this route: a client that sends
        the same extras with every request gets one line, not one per request."""
        return self._told_fields.first((route, frozenset(ignored)))


def _base_url(options: ServeOptions) -> str:
    host = f"[{options.host}]" if ":" in options.host else options.host  # an IPv6 address goes in brackets
    return f"http://{host}:{options.port}"


def make_app(engine, options: Optional[ServeOptions] = None) -> Starlette:
    """The ASGI app serving `engine`; its worker thread starts and stops with the app's lifespan."""
    options = options or ServeOptions()
    if options.reasoning_key not in REASONING_KEYS:
        raise InvalidArgumentError(f"reasoning_key must be one of {', '.join(REASONING_KEYS)}, got "
                                   f"{_show(options.reasoning_key)}")
    check_pooling(options.pooling)
    state = ServerState(engine, options)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        seconds = await asyncio.wrap_future(state.queue.start())  # before uvicorn accepts connections
        log.info("engine warmed up in %.1f s", seconds)
        log.info("serving %r%s (a request naming another model is answered by it too)", state.model_id,
                 f": OpenAI clients' base URL {_base_url(options)}/v1, Anthropic's and Ollama's {_base_url(options)}"
                 if options.port else "")
        try:
            yield
        finally:
            await asyncio.to_thread(state.queue.stop)

    api = [
        ("/chat/completions", openai_route(schema.parse_chat), "POST"),
        ("/completions", openai_route(schema.parse_completion), "POST"),
        ("/responses", create_response, "POST"),
        ("/responses/input_tokens", count_response_tokens, "POST"),
        ("/responses/{response_id}", get_response, "GET"),
        ("/responses/{response_id}", delete_response, "DELETE"),
        ("/responses/{response_id}/input_items", list_input_items, "GET"),
        ("/messages", create_message, "POST"),
        ("/messages/count_tokens", count_message_tokens, "POST"),
        ("/models", list_models, "GET"),
        ("/models/{model_id:path}", get_model, "GET"),
        ("/embeddings", embeddings.openai_embeddings, "POST"),
    ]
    # Under /v1, and without it as mlx-lm's server answers them (clients whose base URL lacks /v1)
    routes = [Route(prefix + path, endpoint, methods=[method])
              for prefix in (API_PREFIX, "") for path, endpoint, method in api]
    routes += [
        Route("/health", health, methods=["GET"]),
        Route("/", root, methods=["GET"]),
        Route("/tokenize", tokenize_route, methods=["POST"]),
        Route("/detokenize", detokenize_route, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/infill", infill, methods=["POST"]),
        Route("/completion", llama_cpp.completion, methods=["POST"]),
        Route("/props", llama_cpp.props, methods=["GET"]),
        Route("/apply-template", apply_template_route, methods=["POST"]),
        Route("/embedding", embeddings.llama_cpp_embedding, methods=["POST"]),
    ]
    routes += [Route(path, endpoint, methods=methods) for path, endpoint, methods in ollama_routes.ROUTES]
    # Outermost first: the host and origin check, then CORS (a preflight carries no API key), then the key.
    origins = Origins(options.allow_origins)
    middleware = [Middleware(CrossOrigin, origins=origins)]
    if options.api_key:
        middleware.append(Middleware(BearerAuth, key=options.api_key))
    if is_loopback(options.host):
        middleware.insert(0, Middleware(LoopbackOnly, origins=origins))
    handlers = {APIError: _api_error, HTTPException: _http_error, Exception: _internal_error}
    app = Starlette(routes=routes, middleware=middleware, exception_handlers=handlers, lifespan=lifespan)
    app.state.mlxspec = state
    return app


# -- the routes that answer at once ------------------------------------------------------------------
async def list_models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [request.app.state.mlxspec.model_card()]})


async def get_model(request: Request) -> Response:
    state: ServerState = request.app.state.mlxspec
    name = request.path_params["model_id"]
    if name != state.model_id:
        raise APIError(404, f"model {_show(name)} does not exist here; this server serves {state.model_id!r}",
                       param="model", code="model_not_found")
    return JSONResponse(state.model_card())


async def tokenize_route(request: Request) -> Response:
    """The model's token ids of a prompt or a chat (vLLM's POST /tokenize, and llama.cpp's)."""
    state: ServerState = request.app.state.mlxspec
    body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
    state.note_model(tokenize.model_param(body))
    return JSONResponse(await asyncio.to_thread(tokenize.tokenize, state.engine, body, chat_messages))


async def apply_template_route(request: Request) -> Response:
    """A chat as the text the model reads (llama.cpp's POST /apply-template)."""
    state: ServerState = request.app.state.mlxspec
    body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
    state.note_model(tokenize.model_param(body))
    return JSONResponse(await asyncio.to_thread(tokenize.apply_template, state.engine, body, chat_messages))


async def detokenize_route(request: Request) -> Response:
    """The text of token ids (vLLM's POST /detokenize)."""
    state: ServerState = request.app.state.mlxspec
    body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
    state.note_model(tokenize.model_param(body))
    return JSONResponse(await asyncio.to_thread(tokenize.detokenize, state.engine, body))


async def metrics(request: Request) -> Response:
    """Prometheus' text format (`serve/metrics.py`)."""
    state: ServerState = request.app.state.mlxspec
    q = state.queue
    return PlainTextResponse(state.metrics.render(q.running is not None, q.waiting, q.limit,
                                                  getattr(state.engine, "prompt_cache", None)),
                             media_type="text/plain; version=0.0.4; charset=utf-8")


async def root(request: Request) -> Response:
    """What this server is (agents probe the base URL before their first request)."""
    from .. import __version__

    state: ServerState = request.app.state.mlxspec
    return JSONResponse({"name": "mlxspec", "version": __version__, "model": state.model_id, "routes": ROUTES_HELP})


async def health(request: Request) -> Response:
    state: ServerState = request.app.state.mlxspec
    q = state.queue
    body = {"status": "shutting_down" if q.closed else "ok", "model": state.model_id,
            "running": q.running is not None, "waiting": q.waiting, "queue": q.limit}
    return JSONResponse(body, status_code=503 if q.closed else 200)


# -- errors ------------------------------------------------------------------------------------------
async def _api_error(request: Request, exc: APIError) -> Response:
    count_error(request.app, exc.status)
    if exc.status >= 500:
        log.warning("%s %s -> %d: %s", request.method, request.url.path, exc.status, exc.message)
    return exc.response()


async def _http_error(request: Request, exc: HTTPException) -> Response:
    count_error(request.app, exc.status_code)
    if exc.status_code == 404:
        message = f"no route {request.url.path}; this server answers {ROUTES_HELP}"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}; this server answers {ROUTES_HELP}"
    else:
        message = str(exc.detail)
    codes = {404: "not_found", 405: "method_not_allowed"}
    return APIError(exc.status_code, message, code=codes.get(exc.status_code),
                    headers=dict(exc.headers or {})).response()


async def _internal_error(request: Request, exc: Exception) -> Response:
    count_error(request.app, 500)
    return internal(exc).response()


def _target_ref(engine) -> Optional[str]:
    info = getattr(engine, "target_info", None)
    return getattr(info, "ref", None)

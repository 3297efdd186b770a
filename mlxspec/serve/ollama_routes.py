"""Ollama's routes (bodies translated by `serve/ollama.py`): /api/chat and /api/generate answered
as chats or completions, whole or as JSON lines; /api/tags, /api/show, /api/ps and /api/version
describe the one model served; /api/embed and /api/embeddings embed text (`serve/embeddings.py`);
Ollama's other routes answer what to do instead. Errors take
Ollama's shape, `{"error": message}`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import shown
from ..prompts import has_chat_template
from . import ollama, schema
from .body import read_json
from .embeddings import ollama_embed, ollama_embeddings
from .errors import APIError
from .generation import guarded_as
from .metrics import count_error
from .translated import one_answer

if TYPE_CHECKING:
    from .app import ServerState

log = logging.getLogger("mlxspec.serve")
# Ollama's routes that manage models: what a client is told there instead.
ELSEWHERE = {"pull": "fetch models with `mlxspec pull NAME` and serve one with `mlxspec serve`"}


_ollama_errors = guarded_as(lambda e: JSONResponse(ollama.error_response_body(e), status_code=e.status,
                                                   headers=e.headers))  # routes whose errors take Ollama's shape


@_ollama_errors
async def chat(request: Request) -> Response:
    """POST /api/chat: a chat, answered by the chat path."""
    return await _answer(request, "chat")


@_ollama_errors
async def generate(request: Request) -> Response:
    """POST /api/generate: a prompt, answered as a chat (or with raw or suffix, a completion)."""
    return await _answer(request, "generate")


async def _answer(request: Request, route: str) -> Response:
    state: ServerState = request.app.state.mlxspec
    body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
    name = body.get("model") if isinstance(body.get("model"), str) and body.get("model") else state.model_id
    if ollama.loads_only(body, route):  # how Ollama's clients load a model (keep_alive 0: unload): it is loaded
        state.note_model(name)
        return JSONResponse(ollama.loaded(name, route, unload=body.get("keep_alive") in (0, "0", "0s")))
    kind = ["chat"]  # or "completion" (/api/generate with raw or suffix), as translated

    def translate(body: dict) -> dict:
        if route == "chat":
            out, ignored = ollama.to_chat(body, state.engine.context)
        else:
            kind[0], out, ignored = ollama.to_generate(body, state.engine.context,
                                                       has_chat_template(state.engine.tokenizer))
        if ignored and state.first_told(f"{request.url.path} options", ignored):
            log.info("%s: ignored options this server does not read (Ollama's runner's settings: the model here is "
                     "loaded once, as mlxspec serve was told): %s", request.url.path, ", ".join(map(shown, ignored)))
        return out

    def parse(chat_body: dict, options) -> schema.GenerationRequest:
        return (schema.parse_chat if kind[0] == "chat" else schema.parse_completion)(chat_body, options)

    def builder_of(state: ServerState, req: schema.GenerationRequest, body: dict) -> ollama.OllamaBuilder:
        return ollama.OllamaBuilder(name, route, state.token_bytes if req.logprobs else None)

    param = "messages" if route == "chat" else "prompt"
    return await one_answer(request, translate, builder_of, f"ollama_{route}", param, ollama.renamed, parse=parse,
                            ndjson=True, body=body)


async def tags(request: Request) -> Response:
    """GET /api/tags: the models here (one)."""
    return JSONResponse({"models": [ollama.model_entry(request.app.state.mlxspec)]})


async def running(request: Request) -> Response:
    """GET /api/ps: the models loaded (the one served, always)."""
    state: ServerState = request.app.state.mlxspec
    return JSONResponse({"models": [dict(ollama.model_entry(state, loaded=True), context_length=state.context)]})


@_ollama_errors
async def show(request: Request) -> Response:
    """POST /api/show: the served model's details, context length and capabilities (any name is
    answered with it, as generation answers any name)."""
    state: ServerState = request.app.state.mlxspec
    body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
    name = body.get("model", body.get("name"))
    if not isinstance(name, str) or not name:
        raise APIError(400, f"model must be the name of a model (this server serves {state.model_id!r}), got "
                       f"{shown(name)}", param="model")
    state.note_model(name)
    return JSONResponse(ollama.show(state))


async def version(request: Request) -> Response:
    """GET /api/version: the Ollama API version these routes follow."""
    return JSONResponse({"version": ollama.VERSION})


async def elsewhere(request: Request) -> Response:
    """Any other /api/ route: Ollama's error, saying what this server answers."""
    rest = request.path_params["rest"]
    if SERVED.get(rest) not in (None, request.method):
        message = f"{request.method} is not allowed on /api/{rest}: send {SERVED[rest]}"
        status = 405
    else:
        why = ELSEWHERE.get(rest, "this server serves one model, chosen when it starts")
        message = f"/api/{rest} is not served here: {why}; its Ollama routes are {ROUTES_TEXT}"
        status = 404
    count_error(request.app, status)
    return JSONResponse({"error": message}, status_code=status)


ROUTES = [("/api/chat", chat, ["POST"]), ("/api/generate", generate, ["POST"]), ("/api/tags", tags, ["GET"]),
          ("/api/show", show, ["POST"]), ("/api/embed", ollama_embed, ["POST"]),
          ("/api/embeddings", ollama_embeddings, ["POST"]), ("/api/ps", running, ["GET"]),
          ("/api/version", version, ["GET"]),
          ("/api/{rest:path}", elsewhere, ["GET", "POST", "PUT", "PATCH", "DELETE"])]
SERVED = {path[len("/api/"):]: methods[0] for path, _, methods in ROUTES[:-1]}  # name -> its method
ROUTES_TEXT = ", ".join(f"{methods[0]} {path}" for path, _, methods in ROUTES[:-1])

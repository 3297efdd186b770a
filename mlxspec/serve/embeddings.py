"""Embeddings in three APIs' shapes, computed by `Engine.embed` on the queue's worker.

    POST /v1/embeddings (and /embeddings)   OpenAI's: unit vectors, as floats or base64 (the
        official client asks for base64 and decodes it), `dimensions` keeps the first N of each,
        normalized again, as OpenAI does for its own models.
    POST /embedding (and /embeddings with `content`)   llama.cpp's: `embd_normalize` (default 2,
        unit length), a bare list of {"index", "embedding": [[...]]}.
    POST /api/embed   Ollama's: unit vectors; an input past the context is cut to it unless
        `truncate` is false. POST /api/embeddings, its older route: one vector, not normalized.

The vectors are the served model's final hidden states pooled (`serve --pooling`: mean by
default). A generative model was not trained for this, so they suit search over text like its
own far less than a model trained for embeddings does; serving one (Qwen3-Embedding with
`--pooling last`) gives its own.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import time
from typing import TYPE_CHECKING, Callable, List, Optional, Tuple

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..embed import normalized
from ..errors import ContextLengthError, IncompatibleModelsError, InvalidArgumentError, shown
from .body import read_json
from .errors import APIError, from_engine, invalid
from .generation import cancel_on_disconnect, gone, guarded, guarded_as

if TYPE_CHECKING:
    from .app import ServerState

ENCODINGS = ("float", "base64")
# An embeddings request runs in slices of about this many tokens, each queued anew behind what
# arrived meanwhile: an indexer sending thousands of documents takes turns with the chats
# instead of holding the model for minutes.
SLICE_TOKENS = 8192


async def embedded(request: Request, body: dict, inputs, param: str, *, normalize: int = 2,
                   truncate: bool = False, dimensions: Optional[int] = None) -> Optional[Tuple[np.ndarray, List[int]]]:
    """(vectors (N, H) float32, tokens per input) of `inputs`, queued as generations are, in slices
    of about SLICE_TOKENS tokens; None when the client left before the answer (counted as gone).
    `dimensions`: the first N of each vector, normalized again (euclidean)."""
    state: ServerState = request.app.state.mlxspec
    state.note_model(body.get("model") if isinstance(body.get("model"), str) else None)
    try:  # every input checked before any runs: a bad one fails the request, not its last slice
        ids = await asyncio.to_thread(state.engine.embedding_inputs, inputs, truncate=truncate)
    except (InvalidArgumentError, ContextLengthError) as e:
        raise _input_error(e, param) from None
    parts = []
    for n, group in enumerate(_slices(ids)):
        call = functools.partial(_vectors, state.engine, group, state.options.pooling, normalize, dimensions)
        part = await _queued(request, call, param, admitted=n > 0)
        if part is None:  # cancelled: the client is gone
            gone(state, f"{request.method} {request.url.path}")
            return None
        parts.append(part)
    tokens = [len(i) for i in ids]
    state.metrics.embedded(sum(tokens))
    return np.concatenate(parts), tokens


def _vectors(engine, group: List[List[int]], pooling: str, normalize: int, dimensions: Optional[int],
             cancel) -> Optional[np.ndarray]:
    """One slice's vectors, on the engine's thread (MLX runs nowhere else); None when cancelled."""
    out = engine.embed(group, pooling=pooling, normalize=normalize if dimensions is None else -1, cancel=cancel)
    if out is None:
        return None
    vectors = out.vectors
    if dimensions is not None:
        if dimensions > vectors.shape[1]:
            raise InvalidArgumentError(f"dimensions must be 1..{vectors.shape[1]} (this model's embeddings have "
                                       f"{vectors.shape[1]}), got {dimensions}")
        vectors = normalized(vectors[:, :dimensions], 2)
    return np.array(vectors, dtype=np.float32)


async def _queued(request: Request, call: Callable, param: str, *, admitted: bool):
    """`call(cancel)`'s result, run in the queue (cancelled if the client goes away: then None)."""
    state: ServerState = request.app.state.mlxspec
    job = state.queue.submit_call(call, admitted=admitted)
    watcher = asyncio.create_task(cancel_on_disconnect(request, state.queue, job))
    try:
        return await job.result()
    except (InvalidArgumentError, ContextLengthError) as e:
        raise _input_error(e, param) from None
    except IncompatibleModelsError as e:  # a model whose logits are not a head over its hidden states
        raise APIError(501, f"this model gives no embeddings: {e}", code="unsupported_model") from None
    except Exception as e:
        raise from_engine(e, param) from e
    finally:
        watcher.cancel()
        state.queue.cancel(job)  # a no-op once done; frees the engine if this task was cancelled


def _slices(ids: List[List[int]]) -> List[List[List[int]]]:
    """Consecutive inputs in groups of at most SLICE_TOKENS tokens (an input longer than that alone)."""
    groups: List[List[List[int]]] = []
    size = SLICE_TOKENS
    for one in ids:
        if size + len(one) > SLICE_TOKENS:
            groups.append([])
            size = 0
        groups[-1].append(one)
        size += len(one)
    return groups


def _input_error(e: Exception, param: str) -> APIError:
    """The engine's message names the input ("input 3 ..."); here under this API's field name."""
    message = str(e)
    if message.startswith("dimensions"):
        return invalid(message, "dimensions")
    if message.startswith("input"):
        message = param + message[len("input"):]
    if isinstance(e, ContextLengthError):
        return APIError(400, message, param=param, code="context_length_exceeded")
    return invalid(message, param)


async def _json(build: Callable[[], object]) -> Response:
    """`build()` as JSON, built and written off the event loop: 2,048 vectors of 4,096 numbers are
    tens of megabytes of text, seconds in which the other clients' streams would wait."""
    def text() -> bytes:  # as Starlette's JSONResponse writes it
        return json.dumps(build(), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()

    return Response(await asyncio.to_thread(text), media_type="application/json")


def _dimensions(body: dict) -> Optional[int]:
    value = body.get("dimensions")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid(f"dimensions must be an integer >= 1 (the first N of each vector, normalized again), got "
                      f"{shown(value)}", "dimensions")
    return value


# -- OpenAI ------------------------------------------------------------------------------------------
@guarded
async def openai_embeddings(request: Request) -> Response:
    """POST /v1/embeddings; /embeddings with llama.cpp's `content` is llama.cpp's route."""
    state: ServerState = request.app.state.mlxspec
    body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
    if "content" in body and "input" not in body:
        return await _llama_cpp(request, body)
    if "input" not in body:
        raise invalid("input is required: a string, a list of token ids, or a list of strings or token-id lists",
                      "input")
    fmt = body.get("encoding_format", "float")
    if fmt not in ENCODINGS:
        raise invalid(f"encoding_format must be one of {', '.join(ENCODINGS)}, got {shown(fmt)}", "encoding_format")
    out = await embedded(request, body, body["input"], "input", dimensions=_dimensions(body))
    if out is None:
        return Response(status_code=499)  # nobody reads it
    rows, tokens = out
    used = sum(tokens)
    return await _json(lambda: {
        "object": "list", "model": state.model_id, "usage": {"prompt_tokens": used, "total_tokens": used},
        "data": [{"object": "embedding", "index": i, "embedding": base64.b64encode(row.astype("<f4").tobytes()).decode()
                  if fmt == "base64" else row.tolist()} for i, row in enumerate(rows)]})


# -- llama.cpp ---------------------------------------------------------------------------------------
@guarded
async def llama_cpp_embedding(request: Request) -> Response:
    """POST /embedding."""
    state: ServerState = request.app.state.mlxspec
    return await _llama_cpp(request, await read_json(request, state.options.max_body_size,
                                                     state.options.client_timeout))


async def _llama_cpp(request: Request, body: dict) -> Response:
    param = "content" if "content" in body else "input"
    if param not in body:
        raise invalid("content is required: a string, a list of token ids, or a list of strings or token-id lists",
                      "content")
    p = body.get("embd_normalize", 2)
    if isinstance(p, bool) or not isinstance(p, int) or p < -1:
        raise invalid(f"embd_normalize must be an integer >= -1 (-1 none, 0 max absolute in the int16 range, 1 "
                      f"taxicab, 2 euclidean, p > 2 p-norm), got {shown(p)}", "embd_normalize")
    out = await embedded(request, body, body[param], param, normalize=p)
    if out is None:
        return Response(status_code=499)  # nobody reads it
    return await _json(lambda: [{"index": i, "embedding": [row]} for i, row in enumerate(out[0].tolist())])


# -- Ollama ------------------------------------------------------------------------------------------
_ollama = guarded_as(lambda e: JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers))


@_ollama
async def ollama_embed(request: Request) -> Response:
    """POST /api/embed."""
    state: ServerState = request.app.state.mlxspec
    body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
    if "input" not in body:
        raise invalid("input is required: a string or a list of strings", "input")
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise invalid(f"truncate must be true or false, got {shown(truncate)}", "truncate")
    t0 = time.perf_counter_ns()
    out = await embedded(request, body, body["input"], "input", truncate=truncate, dimensions=_dimensions(body))
    if out is None:
        return Response(status_code=499)  # nobody reads it
    return await _json(lambda: {"model": _name(body, state), "embeddings": out[0].tolist(),
                                "total_duration": time.perf_counter_ns() - t0, "load_duration": 0,
                                "prompt_eval_count": sum(out[1])})


@_ollama
async def ollama_embeddings(request: Request) -> Response:
    """POST /api/embeddings (Ollama's older route): one prompt, its vector as the model gives it."""
    state: ServerState = request.app.state.mlxspec
    body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise invalid(f"prompt must be a string, got {shown(prompt)}", "prompt")
    if not prompt:  # Ollama answers an empty prompt so
        return JSONResponse({"embedding": []})
    out = await embedded(request, body, prompt, "prompt", normalize=-1, truncate=True)
    if out is None:
        return Response(status_code=499)  # nobody reads it
    return await _json(lambda: {"embedding": out[0][0].tolist()})


def _name(body: dict, state: "ServerState") -> str:
    name = body.get("model")
    return name if isinstance(name, str) and name else state.model_id

"""Other APIs' single answers, each answered as a chat: OpenAI's Responses API (stored for
`previous_response_id`) and Anthropic's Messages API, whole or streamed in their own events, and
what a request of either would count as its prompt's tokens.
`one_answer` serves Ollama's routes (`ollama_routes.py`) and llama.cpp's /infill too.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Callable, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import InvalidArgumentError
from ..prompts import encode_prompt
from ..reasoning import make_splitter
from . import anthropic, response_items, responses_api, responses_output, schema
from .body import read_json
from .choice import AnswerReader, tool_reader
from .errors import APIError, invalid
from .generation import (EventStream, answered, cancel_on_disconnect, closer, first_of, gone, guarded, guarded_as,
                         job_events, kept_alive, parsed, thinking_start, usage_of)
from .options import ServeOptions
from .queue import Job

if TYPE_CHECKING:
    from .app import ServerState

log = logging.getLogger("mlxspec.serve")


async def parsed_as(parse: Callable, translate: Callable, body: dict, options: ServeOptions,
                    rename: Callable) -> schema.GenerationRequest:
    """`body` of another API as the request `parse` reads from `translate(body)`; an error of
    either in that API's terms (`rename`)."""
    try:
        return await parsed(parse, translate(body), options)
    except APIError as e:
        raise rename(e) from None


async def one_answer(request: Request, translate: Callable, builder_of: Callable, endpoint: str, param: str,
                     rename: Callable = lambda e: e, parse: Callable = schema.parse_chat, ndjson: bool = False,
                     body: Optional[dict] = None) -> Response:
    """A request of another API, answered as a chat: `translate` makes its body (read here unless
    given) a chat body (or what `parse` reads), `builder_of(state, req, body)` shapes the answer
    (`tokens` takes each batch of events before its text; whole: `whole`; streamed: `start`,
    `feed`, `finish`, `error`, each giving SSE bytes, or with `ndjson` JSON lines); `rename` puts a
    chat error in its API's terms."""
    state: ServerState = request.app.state.mlxspec
    if body is None:
        body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
    req = await parsed_as(parse, translate, body, state.options, rename)
    state.note_model(req.model)
    job = state.queue.submit(req.prompt, req.options)
    thinking = await thinking_start(state, req)
    splitter = make_splitter(*thinking, merged=state.merged) if thinking is not None else None
    answer = AnswerReader(splitter, tool_reader(state.tool_format, req))
    builder = builder_of(state, req, body)

    async def next_events():
        try:
            return await job_events(job, param)
        except APIError as e:
            raise rename(e) from None

    watcher = asyncio.create_task(cancel_on_disconnect(request, state.queue, job))
    streaming = False
    try:
        if req.stream:
            first = await first_of(next_events())
            streaming = True
            return EventStream(_built_events(state, job, builder, first, req, answer, next_events, endpoint, ndjson),
                               on_close=closer(state, job, builder.id),
                               media_type="application/x-ndjson" if ndjson else "text/event-stream")
        written, end, events = [], None, await next_events()
        while events:
            written.extend(events)
            builder.tokens(events)  # the events behind the text (logprobs)
            end = events[-1] if events[-1].finish_reason else end
            events = await next_events()
        if not job.complete or end is None:  # cancelled: the client is gone
            return gone(state, builder.id)
        answered(state, builder.id, endpoint, req, job)
        reasoning, text, calls = answer.read(written, last=True)
        return JSONResponse(builder.whole(reasoning, text, calls, end.finish_reason,
                                          usage_of(job, req, answer.reasoning_tokens), job.stats[-1], end.stop_reason))
    finally:
        watcher.cancel()
        if not streaming:
            state.queue.cancel(job)


async def _built_events(state: ServerState, job: Job, builder, first: asyncio.Task, req: schema.GenerationRequest,
                        answer: AnswerReader, next_events: Callable, endpoint: str, ndjson: bool):
    """A single answer's stream in its API's events (`one_answer`), after comments while `first`
    (its first events, `first_of`) is awaited (JSON lines have no comments: nothing then)."""
    try:
        if ndjson:
            await first
        else:
            async for comment in kept_alive(first):
                yield comment
        events, end = first.result(), None
        stats = events[0].stats if events else None  # (none: cancelled already)
        # (the whole prompt, and the part of it the caches held)
        prompt = (stats.prompt_tokens, stats.prompt_tokens - stats.prefilled_tokens) if stats else (0, 0)
        for chunk in builder.start(*prompt):
            yield chunk
        while events:
            end = events[-1] if events[-1].finish_reason else end
            builder.tokens(events)
            for chunk in builder.feed(*answer.read(events)):
                yield chunk
            events = await next_events()
        if not job.complete or end is None:  # cancelled without an error: the client is gone
            gone(state, builder.id)
            return
        for chunk in builder.feed(*answer.read(last=True)):
            yield chunk
        used = usage_of(job, req, answer.reasoning_tokens)
        for chunk in builder.finish(end.finish_reason, used, job.stats[-1], end.stop_reason):
            yield chunk
        answered(state, builder.id, endpoint, req, job)
    except APIError as e:  # the engine failed (or the server is stopping) mid-stream
        state.metrics.errors[e.status] += 1
        log.warning("%s: stream ended early: %s", builder.id, e.message)
        yield builder.error(e)


@guarded
async def create_response(request: Request) -> Response:
    """POST /v1/responses: OpenAI's Responses API, answered as a chat (`serve/responses_api.py`);
    answered responses are stored (unless `store` is false) for `previous_response_id`."""
    store = request.app.state.mlxspec.responses
    conversation: list = []
    inputs: list = []
    places: list = []  # of the chat tools in the request's tools, for errors

    def translate(body: dict) -> dict:
        chat, conversation[:], inputs[:] = _response_as_chat(store, body, places)
        return chat

    def builder_of(state, req, body):
        keep = body.get("store") is not False
        # the response echoes the sampling it was answered with: the server's defaults where the body has none
        used = {key: req.options[key] for key in ("temperature", "top_p")}
        return responses_output.ResponseBuilder(state.model_id, dict(body, **used),
                                                (lambda r: store.remember(r, conversation, inputs)) if keep else None,
                                                token_bytes=state.token_bytes)

    return await one_answer(request, translate, builder_of, "responses", "input",
                            lambda e: responses_api.renamed(e, places))


def _response_as_chat(store, body: dict, places: list) -> tuple:
    """A Responses body -> (its chat body, the conversation it continues and adds to, its input
    items); `places` gets where each chat tool was in its tools (`responses_api.renamed`)."""
    places[:] = responses_api.tool_places(body.get("tools"))
    previous = body.get("previous_response_id")
    body = dict(body, input=response_items.resolve(body.get("input"), store.find_item))
    chat, conversation = responses_api.to_chat(body, store.conversation(previous) if previous else [])
    return chat, conversation, response_items.as_items(body["input"])


@guarded
async def count_response_tokens(request: Request) -> Response:
    """POST /v1/responses/input_tokens: {"object": "response.input_tokens", "input_tokens": the
    prompt's tokens}, as a request of the same body counts them (`previous_response_id` included)."""
    state: ServerState = request.app.state.mlxspec
    body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
    places: list = []
    req = await parsed_as(schema.parse_chat, lambda given: _response_as_chat(state.responses, given, places)[0],
                          body, state.options, lambda e: responses_api.renamed(e, places))
    return JSONResponse({"object": "response.input_tokens", "input_tokens": await _prompt_tokens(state, req, "input")})


async def _prompt_tokens(state: ServerState, req: schema.GenerationRequest, param: str) -> int:
    """The tokens of a chat request's prompt, as the engine will encode it (off the event loop)."""
    engine = state.engine
    try:
        ids = await asyncio.to_thread(encode_prompt, req.prompt, engine.tokenizer, engine.vocab_size, req.tools,
                                      req.options.get("chat_template_kwargs"),
                                      req.options.get("continue_final_message", False))
    except InvalidArgumentError as e:
        raise invalid(str(e), param) from None
    return len(ids)


async def get_response(request: Request) -> Response:
    """GET /v1/responses/{id}: a stored response."""
    return JSONResponse(request.app.state.mlxspec.responses.get(request.path_params["response_id"]))


async def list_input_items(request: Request) -> Response:
    """GET /v1/responses/{id}/input_items: a stored response's input items, a page at a time."""
    items = request.app.state.mlxspec.responses.input_items(request.path_params["response_id"])
    return JSONResponse(response_items.page(items, request.query_params))


async def delete_response(request: Request) -> Response:
    """DELETE /v1/responses/{id}: forget a stored response (OpenAI's answer: its id, deleted)."""
    response_id = request.path_params["response_id"]
    request.app.state.mlxspec.responses.delete(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


_anthropic_errors = guarded_as(anthropic.error_response)  # routes whose errors take Anthropic's shape


@_anthropic_errors
async def create_message(request: Request) -> Response:
    """POST /v1/messages: Anthropic's Messages API, answered as a chat (`serve/anthropic.py`)."""
    return await one_answer(request, anthropic.to_chat,
                            lambda state, req, body: anthropic.MessageBuilder(req.model or state.model_id),
                            "messages", "messages", anthropic.renamed)


@_anthropic_errors
async def count_message_tokens(request: Request) -> Response:
    """POST /v1/messages/count_tokens: {"input_tokens": the prompt's tokens}, as a request of it counts them."""
    state: ServerState = request.app.state.mlxspec
    body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
    req = await parsed_as(schema.parse_chat, lambda given: anthropic.to_chat(dict(given, max_tokens=1)), body,
                           state.options, anthropic.renamed)
    return JSONResponse({"input_tokens": await _prompt_tokens(state, req, "messages")})

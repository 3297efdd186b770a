"""The Starlette app: OpenAI routes, server-sent events, auth, body limits, error shapes.

    POST /v1/chat/completions   POST /v1/completions   POST /v1/responses   POST /v1/messages[/count_tokens]
    GET|DELETE /v1/responses/{id}   GET /v1/responses/{id}/input_items   GET /v1/models[/{id}]   GET /health
    POST /tokenize   POST /detokenize   GET /metrics

Every request is answered on the event loop; the model runs on the queue's worker thread.
A request is checked (schema.py), queued, and answered once its first tokens exist, so an
error the engine finds before generating (a prompt past the context) is still a 400, not
a broken stream. A client that goes away cancels its job, waiting or running.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import time
from typing import Callable, List, Optional

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import harmony
from ..errors import InvalidArgumentError, shown as _show
from ..prompts import encode_prompt, text_of
from ..reasoning import ReasoningSplitter, chat_starts_inside, make_splitter, thinking_markers
from ..stats import acceptance_text
from ..logprobs import token_bytes
from ..once import SaidOnce
from ..tools import ToolCallReader
from . import anthropic, fields, response_items, responses_api, schema, tokenize
from .errors import APIError, from_engine, invalid, unsupported
from .fingerprint import system_fingerprint
from .cors import CrossOrigin, Origins
from .local import LoopbackOnly, is_loopback
from .metrics import Metrics
from .response_store import ResponseStore
from .options import REASONING_KEYS, ServeOptions
from .queue import EngineQueue, Job
from .responses import DONE, LogprobStream, Shapes, combined, joined, prompt_logprobs, sse, usage

log = logging.getLogger("mlxspec.serve")
OPEN_PATHS = ("/health", "/")  # answered without the API key (load balancers, scripts and agents probe them)
ROUTES_HELP = ("POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, GET and DELETE "
               "/v1/responses/{id}, GET /v1/responses/{id}/input_items, POST /v1/messages, GET /v1/models, "
               "GET /health, POST /tokenize, POST /detokenize, GET /metrics")


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
    state = ServerState(engine, options)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        seconds = await asyncio.wrap_future(state.queue.start())  # before uvicorn accepts connections
        log.info("engine warmed up in %.1f s", seconds)
        log.info("serving %r%s (a request naming another model is answered by it too)", state.model_id,
                 f": OpenAI clients' base URL {_base_url(options)}/v1, Anthropic's {_base_url(options)}"
                 if options.port else "")
        try:
            yield
        finally:
            await asyncio.to_thread(state.queue.stop)

    routes = [
        Route("/v1/chat/completions", _endpoint(schema.parse_chat), methods=["POST"]),
        Route("/v1/completions", _endpoint(schema.parse_completion), methods=["POST"]),
        Route("/v1/responses", create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
        Route("/v1/messages", create_message, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_message_tokens, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", get_model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/", root, methods=["GET"]),
        Route("/tokenize", tokenize_route, methods=["POST"]),
        Route("/detokenize", detokenize_route, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
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


# -- generation --------------------------------------------------------------------------------------
def _guarded(handler: Callable) -> Callable:
    """A route whose unforeseen failures are a 500 answered here: Starlette re-raises what reaches
    the app-wide handler after answering, and the server then drops the client's keep-alive
    connection."""
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except (APIError, HTTPException):
            raise
        except ClientDisconnect:  # the client left while sending its body: nobody to answer
            return _gone(request.app.state.mlxspec, f"{request.method} {request.url.path}", "while sending its body")
        except Exception as e:
            log.error("%s %s failed", request.method, request.url.path, exc_info=e)
            raise _internal(e) from e

    return endpoint


async def _parsed(parse: Callable, body: dict, options: ServeOptions) -> "schema.GenerationRequest":
    """A body checked on a worker thread: llguidance reads a format's grammar there (31 ms for a
    200-property schema), which on the event loop would hold up every other client's stream."""
    return await asyncio.to_thread(parse, body, options)


def _endpoint(parse: Callable) -> Callable:
    @_guarded
    async def answer(request: Request) -> Response:
        state: ServerState = request.app.state.mlxspec
        body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
        req = await _parsed(parse, body, state.options)
        state.note_model(req.model)
        runs = req.runs()
        job = state.queue.submit(*runs[0], then=tuple(runs[1:]))  # one slot: the choices run back to back
        shapes = Shapes(req.kind, state.model_id, state.options.reasoning_key, state.fingerprint)
        thinking = await _thinking_start(state, req)
        choices = [_Choice(i, prompt, req, state, shapes, thinking) for i, (prompt, _) in enumerate(runs)]
        watcher = asyncio.create_task(_cancel_on_disconnect(request, state.queue, job))
        streaming = False
        try:
            first = await _next(job, req.prompt_param)
            if req.stream:
                streaming = True
                return EventStream(_events(state, job, shapes, first, req, choices),
                                   on_close=_closer(state, job, shapes.id))
            async for index, events in _by_choice(job, first, req.prompt_param):
                choices[index].add(events)
            if not job.complete:  # cancelled: the client is gone
                return _gone(state, shapes.id)
            _done(state, shapes.id, req.kind, req, job)
            return JSONResponse(shapes.completion(_best(choices, req), _usage(job, req), combined(job.stats)))
        finally:
            watcher.cancel()  # a stream's disconnects are watched by StreamingResponse itself
            if not streaming:
                state.queue.cancel(job)  # no-op once done; frees the engine if this task was cancelled

    return answer


def _tool_reader(fmt, req: schema.GenerationRequest) -> Optional[ToolCallReader]:
    """Reads the model's tool calls back when the request showed it tools and its format `fmt` is
    known (a template that renders tools in a format mlx-lm does not know: the calls stay text)."""
    return ToolCallReader(fmt, req.tools) if fmt is not None and req.tools else None


def _read(text: str, splitter: Optional[ReasoningSplitter], reader: Optional[ToolCallReader],
          last: bool = False) -> tuple:
    """(reasoning, answer text, tool calls) of new text: a thinking model's reasoning split off
    first, then the calls read from the answer (`last`: and what either held back to the end)."""
    reasoning = ""
    if splitter is not None:
        reasoning, text = splitter.feed(text)
        if last:
            r, a = splitter.finish()
            reasoning, text = reasoning + r, text + a
    if reader is None:
        return reasoning, text, []
    text, calls = reader.feed(text)
    if last:
        tail, more = reader.finish()
        text, calls = text + tail, calls + more
    return reasoning, text, calls


async def _thinking_start(state: ServerState, req: schema.GenerationRequest) -> Optional[tuple]:
    """A thinking model's chat answers have their reasoning split off: (its markers, whether the
    answer starts inside a block: the chat template opened one at the end of the prompt,
    rendered off the event loop). None when nothing is split."""
    if state.thinking is None or req.kind != "chat":
        return None
    inside = await asyncio.to_thread(chat_starts_inside, req.prompt, state.engine.tokenizer, state.thinking,
                                     req.tools, req.options.get("chat_template_kwargs"),
                                     req.options.get("continue_final_message", False))
    return state.thinking, inside


class _Choice:
    """One choice's answer as its events come: a thinking model's reasoning split off, tool calls
    read, logprobs handed out in step with the text, the prompt first when echoed."""

    def __init__(self, index: int, prompt, req: schema.GenerationRequest, state: ServerState, shapes: Shapes,
                 thinking: Optional[tuple]):
        self.index, self.shapes, self.state = index, shapes, state
        self.splitter = make_splitter(*thinking, merged=state.merged) if thinking is not None else None
        self.reader = _tool_reader(state.tool_format, req)
        self.echo = _echoed(prompt, state) if req.echo else ""
        self.drop = req.score_only  # the prompt was only scored: the token generated with it is not shown
        shown = req.logprobs and not req.ranking_logprobs
        self.logprobs = LogprobStream(shapes.chat, state.token_bytes, len(self.echo)) if shown else None
        self.usage = req.include_usage
        self.prompt_lp: Optional[dict] = None
        self.pieces: list = []
        self.events: list = []
        self.finish: Optional[str] = None
        self.stop_reason = None  # the stop string or stop token that ended it (vLLM's)
        self.stats = None
        self.started = False
        self.called = 0  # tool calls streamed so far

    def add(self, events: list) -> None:
        """A whole answer's events, batch by batch."""
        self._note(events)
        if not self.drop:
            self.pieces.extend(ev.text for ev in events)
            self.events.extend(events)

    @property
    def score(self) -> float:
        """best_of's ranking: the answer's log-probability per token (OpenAI's)."""
        return sum(ev.logprob for ev in self.events) / max(1, len(self.events))

    def whole(self) -> dict:
        reasoning, text, calls = _read("".join(self.pieces), self.splitter, self.reader, last=True)
        lp = self.logprobs.whole(self.events) if self.logprobs is not None else None
        return self.shapes.choice(self.index, self.echo + text, _finish(self.finish, calls), calls,
                                  joined(self.prompt_lp, lp), reasoning, self.stop_reason)

    def stream(self, events: list):
        """The SSE chunks of a streamed answer's events: first the role (chat) or the echoed
        prompt, then reasoning, text and tool calls, and with its last event the finish chunk
        with the choice's figures."""
        self._note(events)
        if not self.started:
            self.started = True
            if self.shapes.chat:
                yield sse(self.shapes.chunk(first=True, include_usage=self.usage, index=self.index))
            if self.echo or self.prompt_lp:
                yield sse(self.shapes.chunk(self.echo, logprobs=self.prompt_lp, include_usage=self.usage,
                                            index=self.index))
        if not self.drop:
            yield from self._deltas(*_read("".join(ev.text for ev in events), self.splitter, self.reader), events)
        if self.finish is not None:
            yield from self._deltas(*_read("", self.splitter, self.reader, last=True))  # what was held back
            yield sse(self.shapes.chunk(finish_reason=_finish(self.finish, self.called), stats=self.stats,
                                        include_usage=self.usage, index=self.index, stop_reason=self.stop_reason))

    def _note(self, events: list) -> None:
        if self.prompt_lp is None and events[0].prompt_logprobs is not None:
            self.prompt_lp = prompt_logprobs(events[0].prompt_logprobs, self.state.token_bytes)
        if events[-1].finish_reason:
            self.finish, self.stats = ("length" if self.drop else events[-1].finish_reason), events[-1].stats
            self.stop_reason = None if self.drop else events[-1].stop_reason

    def _deltas(self, reasoning: str, text: str, calls: list, events=()):
        lp = self.logprobs.feed(events) if self.logprobs is not None and events else None
        if reasoning or text or lp:
            yield sse(self.shapes.chunk(text, include_usage=self.usage, logprobs=lp, reasoning=reasoning,
                                        index=self.index))
        if calls:
            yield sse(self.shapes.chunk(tool_calls=_indexed(calls, self.called), include_usage=self.usage,
                                        index=self.index))
            self.called += len(calls)


def _echoed(prompt, state: ServerState) -> str:
    """The prompt's text, as echo shows it: as sent, or its token ids decoded; for chat messages
    (vLLM's), the last one's content when it is the assistant's (a prefill the answer continues)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        last = prompt[-1]
        return (text_of(last.get("content")) or "") if last.get("role") == "assistant" else ""
    tokenizer = getattr(state.engine, "tokenizer", None)
    return tokenizer.decode(prompt) if tokenizer is not None else ""


def _usage(job: Job, req: schema.GenerationRequest) -> dict:
    return usage(job.stats, req.per_prompt, generated=not req.score_only)


def _best(choices: list, req: schema.GenerationRequest) -> list:
    """The whole answers: each prompt's n best of its best_of by log-probability per token, best
    first, indexed in OpenAI's order (all of them, as generated, without best_of)."""
    if req.per_prompt == req.n:
        return [c.whole() for c in choices]
    out = []
    for first in range(0, len(choices), req.per_prompt):
        group = sorted(choices[first:first + req.per_prompt], key=lambda c: -c.score)[:req.n]
        for c in group:
            c.index = len(out)
            out.append(c.whole())
    return out


async def _by_choice(job: Job, first, prompt_param: str):
    """(choice index, events) for a job's generations in turn: each ends with the event that
    carries its finish_reason (one batch may hold the end of one and the start of the next)."""
    index, events = 0, first
    while events:
        while events:
            cut = next((i + 1 for i, ev in enumerate(events) if ev.finish_reason), len(events))
            yield index, events[:cut]
            if events[cut - 1].finish_reason:
                index += 1
            events = events[cut:]
        events = await _next(job, prompt_param)


def _finish(reason: Optional[str], calls) -> Optional[str]:
    """OpenAI's "tool_calls" when the model stopped after calling tools (a cut answer stays "length")."""
    return "tool_calls" if calls and reason == "stop" else reason


def _indexed(calls: list, start: int) -> list:
    """Stream deltas' calls carry their index among the answer's calls."""
    return [dict(call, index=start + i) for i, call in enumerate(calls)]


async def _next(job: Job, prompt_param: str):
    try:
        return await job.next_events()
    except Exception as e:
        raise from_engine(e, prompt_param) from e


class EventStream(StreamingResponse):
    """Server-sent events that call `on_close(ended)` however they end (done, failed, client gone,
    never started); `ended`: the body ran to its end (the client left after, if at all)."""

    def __init__(self, content, *, on_close: Callable[[bool], None]):
        self.ended = False
        super().__init__(self._watched(content), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def _watched(self, content):
        async for chunk in content:
            yield chunk
        self.ended = True

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close(self.ended)


def _closer(state: ServerState, job: Job, request_id: str) -> Callable[[bool], None]:
    """A stream's `on_close`: its job stops (a no-op once done), and a stream whose client left
    before its end is counted and logged here (Starlette cancels the body where it waits, so
    the body cannot say it)."""
    def close(ended: bool) -> None:
        state.queue.cancel(job)
        if not ended:
            _gone(state, request_id)

    return close


def _gone(state: ServerState, request_id: str, when: str = "before its answer was whole") -> Response:
    """A request whose client went away: counted as cancelled (not answered), logged once."""
    state.metrics.cancelled += 1
    log.info("%s: cancelled: the client went away %s", request_id, when)
    return Response(status_code=499)


async def _events(state: ServerState, job: Job, shapes: Shapes, first, req: schema.GenerationRequest,
                  choices: list):
    """The SSE body: each choice's chunks in turn (`_Choice.stream`), usage, [DONE]. With logprobs
    a chunk carries those of the tokens whose text is out by then (`LogprobStream`)."""
    try:
        async for index, events in _by_choice(job, first, req.prompt_param):
            for chunk in choices[index].stream(events):
                yield chunk
        if not job.complete:  # cancelled without an error: the client is gone
            _gone(state, shapes.id)
            return
        if req.include_usage:
            yield sse(shapes.usage_chunk(_usage(job, req), combined(job.stats)))
        _done(state, shapes.id, req.kind, req, job)
    except APIError as e:  # the engine failed (or the server is stopping) mid-stream
        state.metrics.errors[e.status] += 1
        log.warning("%s: stream ended early: %s", shapes.id, e.message)
        yield sse(e.body())
    yield DONE


# -- other APIs' single answers (OpenAI's Responses, Anthropic's Messages) --------------------------
async def _one_answer(request: Request, translate: Callable, builder_of: Callable, endpoint: str, param: str,
                      rename: Callable = lambda e: e) -> Response:
    """A request of another API, answered as a chat: `translate` makes its body a chat body,
    `builder_of(state, req, body)` shapes the answer (`tokens` takes each batch of events before
    its text; whole: `whole`; streamed: `start`, `feed`, `finish`, `error`, each giving SSE
    bytes); `rename` puts a chat error in its API's terms."""
    state: ServerState = request.app.state.mlxspec
    body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
    try:
        req = await _parsed(schema.parse_chat, translate(body), state.options)
    except APIError as e:
        raise rename(e) from None
    state.note_model(req.model)
    job = state.queue.submit(req.prompt, req.options)
    thinking = await _thinking_start(state, req)
    splitter = make_splitter(*thinking, merged=state.merged) if thinking is not None else None
    reader = _tool_reader(state.tool_format, req)
    builder = builder_of(state, req, body)

    async def next_events():
        try:
            return await _next(job, param)
        except APIError as e:
            raise rename(e) from None

    watcher = asyncio.create_task(_cancel_on_disconnect(request, state.queue, job))
    streaming = False
    try:
        first = await next_events()
        if req.stream:
            streaming = True
            return EventStream(_built_events(state, job, builder, first, req, splitter, reader, next_events, endpoint),
                               on_close=_closer(state, job, builder.id))
        pieces, end, events = [], None, first
        while events:
            pieces.extend(ev.text for ev in events)
            builder.tokens(events)  # the events behind the text (logprobs)
            end = events[-1] if events[-1].finish_reason else end
            events = await next_events()
        if not job.complete or end is None:  # cancelled: the client is gone
            return _gone(state, builder.id)
        _done(state, builder.id, endpoint, req, job)
        reasoning, text, calls = _read("".join(pieces), splitter, reader, last=True)
        return JSONResponse(builder.whole(reasoning, text, calls, end.finish_reason, _usage(job, req), job.stats[-1],
                                          end.stop_reason))
    finally:
        watcher.cancel()
        if not streaming:
            state.queue.cancel(job)


async def _built_events(state: ServerState, job: Job, builder, first, req: schema.GenerationRequest,
                        splitter: Optional[ReasoningSplitter], reader: Optional[ToolCallReader],
                        next_events: Callable, endpoint: str):
    """A single answer's stream in its API's events (`_one_answer`)."""
    stats = first[0].stats if first else None  # (none: cancelled already)
    # (the whole prompt, and the part of it the caches held)
    prompt = (stats.prompt_tokens, stats.prompt_tokens - stats.prefilled_tokens) if stats else (0, 0)
    for chunk in builder.start(*prompt):
        yield chunk
    try:
        events, end = first, None
        while events:
            end = events[-1] if events[-1].finish_reason else end
            builder.tokens(events)
            for chunk in builder.feed(*_read("".join(ev.text for ev in events), splitter, reader)):
                yield chunk
            events = await next_events()
        if not job.complete or end is None:  # cancelled without an error: the client is gone
            _gone(state, builder.id)
            return
        for chunk in builder.feed(*_read("", splitter, reader, last=True)):
            yield chunk
        for chunk in builder.finish(end.finish_reason, _usage(job, req), job.stats[-1], end.stop_reason):
            yield chunk
        _done(state, builder.id, endpoint, req, job)
    except APIError as e:  # the engine failed (or the server is stopping) mid-stream
        state.metrics.errors[e.status] += 1
        log.warning("%s: stream ended early: %s", builder.id, e.message)
        yield builder.error(e)


@_guarded
async def create_response(request: Request) -> Response:
    """POST /v1/responses: OpenAI's Responses API, answered as a chat (`serve/responses_api.py`);
    answered responses are stored (unless `store` is false) for `previous_response_id`."""
    store = request.app.state.mlxspec.responses
    conversation: list = []
    inputs: list = []

    def translate(body: dict) -> dict:
        previous = body.get("previous_response_id")
        body = dict(body, input=response_items.resolve(body.get("input"), store.find_item))
        chat, conversation[:] = responses_api.to_chat(body, store.conversation(previous) if previous else [])
        inputs[:] = response_items.as_items(body["input"])
        return chat

    def builder_of(state, req, body):
        keep = body.get("store") is not False
        return responses_api.ResponseBuilder(state.model_id, body,
                                             (lambda r: store.remember(r, conversation, inputs)) if keep else None,
                                             token_bytes=state.token_bytes)

    return await _one_answer(request, translate, builder_of, "responses", "input", responses_api.renamed)


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


def _anthropic_errors(handler: Callable) -> Callable:
    """A `_guarded` route whose errors take Anthropic's shape (counted like the others)."""
    guarded = _guarded(handler)

    async def route(request: Request) -> Response:
        try:
            return await guarded(request)
        except APIError as e:
            _count_error(request, e.status)
            return anthropic.error_response(e)

    return route


@_anthropic_errors
async def create_message(request: Request) -> Response:
    """POST /v1/messages: Anthropic's Messages API, answered as a chat (`serve/anthropic.py`)."""
    return await _one_answer(request, anthropic.to_chat,
                             lambda state, req, body: anthropic.MessageBuilder(req.model or state.model_id),
                             "messages", "messages")


@_anthropic_errors
async def count_message_tokens(request: Request) -> Response:
    """POST /v1/messages/count_tokens: {"input_tokens": the prompt's tokens}, as a request of it counts them."""
    state: ServerState = request.app.state.mlxspec
    body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
    req = await _parsed(schema.parse_chat, anthropic.to_chat(dict(body, max_tokens=1)), state.options)
    engine = state.engine
    try:
        ids = await asyncio.to_thread(encode_prompt, req.prompt, engine.tokenizer, engine.vocab_size, req.tools,
                                      req.options.get("chat_template_kwargs"),
                                      req.options.get("continue_final_message", False))
    except InvalidArgumentError as e:
        raise invalid(str(e), "messages") from None
    return JSONResponse({"input_tokens": len(ids)})


async def _cancel_on_disconnect(request: Request, queue: EngineQueue, job: Job) -> None:
    """Wait for the client to go away, then cancel its job (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            queue.cancel(job)
            return


def _done(state: ServerState, request_id: str, endpoint: str, req: schema.GenerationRequest, job: Job) -> None:
    """A request answered whole: logged, and counted in the metrics."""
    runs = job.stats
    state.metrics.answered(endpoint, _usage(job, req), runs)
    s = combined(runs)
    log.info("%s: %s%d prompt tokens (%d cached), %d tokens, %.1f tok/s, drafter %s, acceptance %s, "
             "%.2f tokens/target pass", request_id, f"{len(runs)} choices, " if len(runs) > 1 else "",
             s.prompt_tokens, s.prompt_tokens - s.prefilled_tokens, s.tokens, s.tokens_per_second, s.drafter,
             acceptance_text(s.accepted, s.drafted), s.tokens_per_target_pass)


# -- the other routes --------------------------------------------------------------------------------
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
    """The model's token ids of a prompt or a chat (vLLM's POST /tokenize)."""
    state: ServerState = request.app.state.mlxspec
    body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
    state.note_model(tokenize.model_param(body))
    return JSONResponse(await asyncio.to_thread(tokenize.tokenize, state.engine, body, schema.chat_messages))


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
    return PlainTextResponse(state.metrics.render(q.running is not None, q.waiting, q.limit),
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


# -- request bodies, auth, errors --------------------------------------------------------------------
async def read_json(request: Request, limit: int, timeout: float = 0) -> dict:
    """The body as a JSON object; 413 past `limit` bytes (declared or streamed), 400 if not JSON,
    408 when more than `timeout` seconds pass without any of it (0: no limit)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit, f"declares {int(declared)} bytes")
    body = bytearray()
    chunks = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(chunks.__anext__(), timeout or None)
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise APIError(408, f"the request body stalled: nothing of it came for {timeout:g} s "
                                f"(mlxspec serve --client-timeout)", code="request_timeout") from None
        body += chunk
        if len(body) > limit:
            raise _too_large(limit, f"is longer than {limit} bytes")
    if not body.strip():
        raise invalid("the request body is empty: send a JSON object", code="invalid_json")
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise invalid(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:
        raise invalid("the request body nests JSON too deeply", code="invalid_json") from None
    if not isinstance(data, dict):
        raise invalid(f"the request body must be a JSON object, got a JSON {type(data).__name__}", code="invalid_json")
    if (wrong := fields.moved(request.url.path, data)) is not None:
        key, instead = wrong
        raise unsupported(f"{key} is not read at {request.url.path}: send {instead} instead (got {_show(data[key])})",
                          key)
    ignored = fields.unread(request.url.path, data)
    # told to the log, not the client: vendor extras are normal, a typo is not
    if ignored and request.app.state.mlxspec.first_told(request.url.path, ignored):
        more = f" and {len(ignored) - fields.SHOWN} more" if len(ignored) > fields.SHOWN else ""
        log.warning("%s %s: ignored fields this endpoint does not read: %s%s (said once per route and set of "
                    "fields)", request.method, request.url.path,
                    ", ".join(_show(key) for key in ignored[:fields.SHOWN]), more)
    return data


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _too_large(limit: int, what: str) -> APIError:
    return APIError(413, f"the request body {what}; this server accepts at most {limit} bytes "
                    "(mlxspec serve --max-body-size)", code="request_too_large")


class BearerAuth:
    """ASGI middleware: every path but OPEN_PATHS needs `Authorization: Bearer <key>` (or
    Anthropic's `x-api-key: <key>`)."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            headers = Headers(scope=scope)
            scheme, _, token = headers.get("authorization", "").partition(" ")
            token = token.strip() if scheme.lower() == "bearer" else headers.get("x-api-key", "")
            if not hmac.compare_digest(token.encode(), self.key):
                error = APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>' "
                                 "(or 'x-api-key: <key>') with the key the server was started with (--api-key)",
                                 code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                anthropic_path = scope["path"].startswith("/v1/messages")
                await (anthropic.error_response(error) if anthropic_path else error.response())(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _api_error(request: Request, exc: APIError) -> Response:
    _count_error(request, exc.status)
    if exc.status >= 500:
        log.warning("%s %s -> %d: %s", request.method, request.url.path, exc.status, exc.message)
    return exc.response()


async def _http_error(request: Request, exc: HTTPException) -> Response:
    _count_error(request, exc.status_code)
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
    _count_error(request, 500)
    return _internal(exc).response()


def _count_error(request: Request, status: int) -> None:
    state = getattr(request.app.state, "mlxspec", None)
    if state is not None:
        state.metrics.errors[status] += 1


def _internal(exc: Exception) -> APIError:
    return APIError(500, f"internal server error ({type(exc).__name__}); the details are in the server's log",
                    code="internal_error")


def _target_ref(engine) -> Optional[str]:
    info = getattr(engine, "target_info", None)
    return getattr(info, "ref", None)

"""Answering a generation request: OpenAI's chat and text completions, whole or streamed as
server-sent events, and what the other APIs' routes (`translated.py`) share with them: the
body checked off the event loop, the job's events in order, a client that goes away cancelling
its job, and the log line and metrics of an answered request.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Awaitable, Callable, Optional

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..reasoning import chat_starts_inside
from ..stats import acceptance_text
from . import schema
from .body import read_json
from .choice import Choice, best
from .errors import APIError, from_engine, internal
from .metrics import count_error
from .options import ServeOptions
from .queue import EngineQueue, Job
from .responses import DONE, Shapes, combined, prompt_only, sse, usage

if TYPE_CHECKING:
    from .app import ServerState

log = logging.getLogger("mlxspec.serve")
# A stream whose first tokens take longer than HEADERS_AFTER seconds (queued behind another request,
# a long prompt's prefill) starts without them, and sends an SSE comment every KEEPALIVE_EVERY
# seconds until they come: a client's read timeout then does not fire while nothing is wrong.
# An error by HEADERS_AFTER (a prompt past the context, say) is still a plain error answer.
HEADERS_AFTER = 5.0
KEEPALIVE_EVERY = 5.0
KEEPALIVE = b": waiting for the first tokens\n\n"


def guarded(handler: Callable) -> Callable:
    """A route whose unforeseen failures are a 500 answered here: Starlette re-raises what reaches
    the app-wide handler after answering, and the server then drops the client's keep-alive
    connection."""
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except (APIError, HTTPException):
            raise
        except ClientDisconnect:  # the client left while sending its body: nobody to answer
            return gone(request.app.state.mlxspec, f"{request.method} {request.url.path}", "while sending its body")
        except Exception as e:
            log.error("%s %s failed", request.method, request.url.path, exc_info=e)
            raise internal(e) from e

    return endpoint


def guarded_as(to_response: Callable[[APIError], Response]) -> Callable:
    """`guarded`, with the route's refusals answered in its API's shape by `to_response` (and
    counted like the others)."""
    def decorate(handler: Callable) -> Callable:
        inner = guarded(handler)

        async def route(request: Request) -> Response:
            try:
                return await inner(request)
            except APIError as e:
                count_error(request.app, e.status)
                return to_response(e)

        return route

    return decorate


async def parsed(parse: Callable, body: dict, options: ServeOptions) -> "schema.GenerationRequest":
    """A body checked on a worker thread: llguidance reads a format's grammar there (31 ms for a
    200-property schema), which on the event loop would hold up every other client's stream."""
    return await asyncio.to_thread(parse, body, options)


def openai_route(parse: Callable) -> Callable:
    """POST /v1/chat/completions or /v1/completions (`parse` reads its body): every choice of the
    request queued as one job, answered whole or streamed."""
    @guarded
    async def answer(request: Request) -> Response:
        state: ServerState = request.app.state.mlxspec
        body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
        req = await parsed(parse, body, state.options)
        state.note_model(req.model)
        runs = req.runs()
        job = state.queue.submit(*runs[0], then=tuple(runs[1:]))  # one slot: the choices run back to back
        shapes = Shapes(req.kind, state.model_id, state.options.reasoning_key, state.fingerprint)
        thinking = await thinking_start(state, req)
        choices = [Choice(i, prompt, req, state, shapes, thinking) for i, (prompt, _) in enumerate(runs)]
        watcher = asyncio.create_task(cancel_on_disconnect(request, state.queue, job))
        streaming = False
        try:
            if req.stream:
                first = await first_of(job_events(job, req.prompt_param))
                streaming = True
                return EventStream(sse_events(state, job, shapes, first, req, choices),
                                   on_close=closer(state, job, shapes.id))
            first = await job_events(job, req.prompt_param)
            async for index, events in by_choice(job, first, req.prompt_param):
                choices[index].add(events)
            if not job.complete:  # cancelled: the client is gone
                return gone(state, shapes.id)
            answered(state, shapes.id, req.kind, req, job)
            whole = best(choices, req)  # read first: their reasoning tokens are counted as they are read
            return JSONResponse(shapes.completion(whole, usage_of(job, req, reasoning_of(choices)),
                                                  combined(runs_of(job, req))))
        finally:
            watcher.cancel()  # a stream's disconnects are watched by StreamingResponse itself
            if not streaming:
                state.queue.cancel(job)  # no-op once done; frees the engine if this task was cancelled

    return answer


async def thinking_start(state: ServerState, req: schema.GenerationRequest) -> Optional[tuple]:
    """A thinking model's chat answers have their reasoning split off: (its markers, whether the
    answer starts inside a block: the chat template opened one at the end of the prompt,
    rendered off the event loop). None when nothing is split."""
    if state.thinking is None or req.kind != "chat":
        return None
    inside = await asyncio.to_thread(chat_starts_inside, req.prompt, state.engine.tokenizer, state.thinking,
                                     req.tools, req.options.get("chat_template_kwargs"),
                                     req.options.get("continue_final_message", False))
    return state.thinking, inside


def usage_of(job: Job, req: schema.GenerationRequest, reasoning: int = 0) -> dict:
    """The request's `usage`; `reasoning`: its answers' reasoning tokens (`AnswerReader`)."""
    return usage(job.stats, req.per_prompt, generated=not req.score_only, reasoning=reasoning)


def reasoning_of(choices: list) -> int:
    """The reasoning tokens of a request's choices, as far as they have been read."""
    return sum(c.answer.reasoning_tokens for c in choices)


def runs_of(job: Job, req: schema.GenerationRequest) -> list:
    """The job's generations as reported: a scored prompt's without the token it did not return."""
    return [prompt_only(s) for s in job.stats] if req.score_only else job.stats


async def first_of(events: Awaitable) -> asyncio.Task:
    """A stream's first events as a task, awaited up to HEADERS_AFTER: one that has failed by then
    raises here, before the stream's headers go out."""
    task = asyncio.ensure_future(events)
    await asyncio.wait({task}, timeout=HEADERS_AFTER)
    if task.done():
        task.result()
    return task


async def kept_alive(task: asyncio.Task):
    """SSE comments, one every KEEPALIVE_EVERY seconds, until `task` is done (cancelled if the
    stream ends first: the client left)."""
    try:
        while not task.done():
            if not (await asyncio.wait({task}, timeout=KEEPALIVE_EVERY))[0]:
                yield KEEPALIVE
    finally:
        task.cancel()  # a no-op once done


async def by_choice(job: Job, first, prompt_param: str):
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
        events = await job_events(job, prompt_param)


async def job_events(job: Job, prompt_param: str):
    try:
        return await job.next_events()
    except Exception as e:
        raise from_engine(e, prompt_param) from e


class EventStream(StreamingResponse):
    """Server-sent events (or Ollama's JSON lines) that call `on_close(ended)` however they end
    (done, failed, client gone, never started); `ended`: the body ran to its end (the client left
    after, if at all)."""

    def __init__(self, content, *, on_close: Callable[[bool], None], media_type: str = "text/event-stream"):
        self.ended = False
        super().__init__(self._watched(content), media_type=media_type,
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


def closer(state: ServerState, job: Job, request_id: str) -> Callable[[bool], None]:
    """A stream's `on_close`: its job stops (a no-op once done), and a stream whose client left
    before its end is counted and logged here (Starlette cancels the body where it waits, so
    the body cannot say it)."""
    def close(ended: bool) -> None:
        state.queue.cancel(job)
        if not ended:
            gone(state, request_id)

    return close


def gone(state: ServerState, request_id: str, when: str = "before its answer was whole") -> Response:
    """A request whose client went away (or that a forced quit cut off): counted as cancelled
    (not answered), logged once."""
    state.metrics.cancelled += 1
    if state.queue.closed:
        log.info("%s: cut off %s: the server is stopping", request_id, when)
    else:
        log.info("%s: cancelled: the client went away %s", request_id, when)
    return Response(status_code=499)


async def sse_events(state: ServerState, job: Job, shapes: Shapes, first: asyncio.Task,
                     req: schema.GenerationRequest, choices: list):
    """The SSE body: comments while `first` (the first events, `first_of`) is awaited, then each
    choice's chunks in turn (`Choice.stream`), usage, [DONE]. With logprobs a chunk carries those
    of the tokens whose text is out by then (`LogprobStream`)."""
    try:
        async for comment in kept_alive(first):
            yield comment
        async for index, events in by_choice(job, first.result(), req.prompt_param):
            for chunk in choices[index].stream(events):
                yield chunk
        if not job.complete:  # cancelled without an error: the client is gone
            gone(state, shapes.id)
            return
        if req.include_usage:
            yield sse(shapes.usage_chunk(usage_of(job, req, reasoning_of(choices)), combined(runs_of(job, req))))
        answered(state, shapes.id, req.kind, req, job)
    except APIError as e:  # the engine failed (or the server is stopping) mid-stream
        state.metrics.errors[e.status] += 1
        log.warning("%s: stream ended early: %s", shapes.id, e.message)
        yield sse(e.body())
    yield DONE


async def cancel_on_disconnect(request: Request, queue: EngineQueue, job: Job) -> None:
    """Wait for the client to go away, then cancel its job (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            queue.cancel(job)
            return


def answered(state: ServerState, request_id: str, endpoint: str, req: schema.GenerationRequest, job: Job) -> None:
    """A request answered whole: logged, and counted in the metrics."""
    runs, used = runs_of(job, req), usage_of(job, req)
    state.metrics.answered(endpoint, used, runs)
    s = combined(runs)
    # the prompt as `usage` counts it: once per prompt, not once per choice
    log.info("%s: %s%d prompt tokens (%d cached), %d tokens, %.1f tok/s, drafter %s, acceptance %s, "
             "%.2f tokens/target pass", request_id, f"{len(runs)} choices, " if len(runs) > 1 else "",
             used["prompt_tokens"], used["prompt_tokens_details"]["cached_tokens"], s.tokens, s.tokens_per_second,
             s.drafter, acceptance_text(s.accepted, s.drafted, s.accepted_past_end), s.tokens_per_target_pass)

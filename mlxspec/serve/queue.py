"""One engine, one worker thread, requests in arrival order, each cancellable.

The engine is not thread-safe and MLX keeps per-thread streams, so every call into the
engine (warm-up included) happens on one long-lived worker thread; the event loop only
submits jobs and reads their events. A job's events cross threads through a deque: the
worker appends, and wakes the loop only when the loop is not already due to look, and at
most once per FLUSH_SECONDS (the end of a job wakes it at once). Every wake-up takes the
GIL from the engine's host work, so a stream's text goes out in batches of a few tokens
rather than one write per token; the first batch goes out as soon as it exists.

A waiting job can be cancelled at once (it never reaches the engine); a running one is
cancelled between two tokens: the worker closes the engine's generator, which leaves
its caches consistent for the next job.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import math
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from ..device import clear_streams, is_gpu
from ..errors import MlxSpecError
from ..stats import GenerationStats, TokenEvent
from .errors import APIError, shutting_down

log = logging.getLogger("mlxspec.serve")
WAITING, RUNNING, DONE = "waiting", "running", "done"
FLUSH_SECONDS = 0.02  # a job's events reach the event loop at most this often (50 batches/s), its end at once


def warmup_temperatures() -> tuple:
    """Greedy and sampled verification compile different kernels on a GPU; on the CPU nothing
    compiles, and the greedy passes alone seed the cost model. (Ranks following a sharded
    server's rank 0 warm up with the same passes.)"""
    return (0.0, 1.0) if is_gpu() else (0.0,)


@dataclass
class _End:
    stats: Optional[List[GenerationStats]] = None  # per generation run to its end, copies, final
    error: Optional[BaseException] = None
    complete: bool = False  # every generation reached its finish_reason (none was cut short by a cancel)
    value: Any = None  # a call's result (`EngineQueue.submit_call`)


class Job:
    """One request's generations (several for OpenAI's `n` or a batch of prompts, run back to
    back in one slot of the queue): their arguments, their events, and how to stop them.
    Each generation's last event carries a finish_reason and its own final copy of the stats."""

    def __init__(self, prompt, options: Dict[str, Any], loop: asyncio.AbstractEventLoop, then: tuple = (),
                 call: Optional[Callable[[threading.Event], Any]] = None):
        self.runs = [(prompt, options), *then]  # (prompt, Engine.stream options) per generation
        self.call = call  # instead of generations: run on the engine's thread, given the cancel event
        self.state = WAITING
        self.stats: Optional[List[GenerationStats]] = None  # final statistics per generation, once the job has ended
        # Once the job has ended: whether every generation ran to its end. A cancelled one still
        # has stats (what it did before it stopped), so their count does not say it.
        self.complete = False
        self._loop = loop
        self._items: deque = deque()  # TokenEvents, then one _End; appended by the worker
        self._wake = asyncio.Event()
        self._notified = False  # a wake-up is on its way to the loop (the worker sets it, the loop clears it)
        self._flush_at = 0.0  # time.monotonic() before which the worker does not wake the loop for tokens
        self._ending = False  # the worker has put the end: nothing waits for the window any more
        self._cancel = threading.Event()
        self._cancel_error: Optional[APIError] = None
        self._end: Optional[_End] = None

    # -- worker side -----------------------------------------------------------------------------
    def _put(self, item) -> None:
        end = isinstance(item, _End)
        self._ending = self._ending or end
        self._items.append(item)  # first, so a consumer that missed the wake-up still sees it
        if end or (not self._notified and time.monotonic() >= self._flush_at):
            self._notified = True
            try:
                self._loop.call_soon_threadsafe(self._wake.set)
            except RuntimeError:  # the event loop is closed (a forced quit): nobody is listening
                pass

    # -- event-loop side -------------------------------------------------------------------------
    async def next_events(self) -> Optional[List[TokenEvent]]:
        """The events produced since the last call (waits for one); None once the job has ended.

        Returns at most once per FLUSH_SECONDS while the job runs. Raises the engine's exception
        (or the APIError the job was cancelled with) after the events that came before it.
        """
        while True:
            # Let tokens gather; an end cuts it short. A token's wake-up cannot: one sent for the
            # window before may still be on its way (the loop busy), and would end this one early.
            while not self._ending and time.monotonic() < self._flush_at:
                await self._wait(self._flush_at)
            self._notified = False  # before draining: an append after this point wakes us again
            events = []
            while self._items:
                item = self._items.popleft()
                if isinstance(item, _End):
                    self._end, self.stats, self.complete = item, item.stats, item.complete
                else:
                    events.append(item)
            if events:
                self._flush_at = time.monotonic() + FLUSH_SECONDS
                return events
            if self._end is not None:
                if self._end.error is not None:
                    raise self._end.error
                return None
            await self._wait(self._flush_at)

    async def result(self) -> Any:
        """A call's result, once it has run (raises its exception, or the cancel's APIError)."""
        while await self.next_events() is not None:
            pass
        return self._end.value

    async def _wait(self, until: float) -> None:
        """Wait for the worker's wake-up, and at most until `until` (a time.monotonic()) if that is ahead."""
        delay = until - time.monotonic()
        timer = self._loop.call_later(delay, self._wake.set) if delay > 0 else None
        await self._wake.wait()
        self._wake.clear()
        if timer is not None:
            timer.cancel()

    def _stop(self, error: Optional[APIError]) -> None:
        """Ask the worker to stop this running job between two tokens (EngineQueue.cancel)."""
        if not self._cancel.is_set() and self.state != DONE:
            self._cancel_error = error
            self._cancel.set()


class EngineQueue:
    """Runs jobs one at a time on the engine, in submission order, at most `limit` waiting.

    Args:
        engine: an mlxspec Engine (or anything with its `stream`, `reset` and `last_stats`).
        limit: jobs that may wait while one runs; `submit` refuses more (429).
    """

    def __init__(self, engine, *, limit: int = 16):
        self.engine = engine
        self.limit = limit
        self.running: Optional[Job] = None
        self.closed = False  # shutting down: new jobs are refused (503)
        self._jobs: "queue.Queue[Optional[Job]]" = queue.Queue()
        self._waiting: List[Job] = []
        self._lock = threading.Lock()  # job state changes: worker vs event loop
        self._thread: Optional[threading.Thread] = None
        self._mean_seconds = 2.0  # running mean of a job's duration, for Retry-After
        self.ready: Future = Future()  # the warm-up's seconds, once the worker has warmed the engine up
        # A sharded target that lost its other ranks cannot run again: the queue closes, and the
        # server is told (`on_fatal`, from the worker thread) to stop
        self.fatal: Optional[APIError] = None
        self.on_fatal: Optional[Callable[[], None]] = None

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # -- lifecycle (event-loop thread) ---------------------------------------------------------
    def start(self) -> Future:
        """Start the worker thread; it warms the engine up first. Returns `ready`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="mlxspec-engine", daemon=True)
            self._thread.start()
        return self.ready

    def submit(self, prompt, options: Dict[str, Any], then: tuple = ()) -> Job:
        """Queue a generation (and the (prompt, options) generations `then`, run right after it in
        the same slot); raises APIError 429 when `limit` jobs wait already, 503 when closed."""
        return self._enqueue(lambda loop: Job(prompt, options, loop, then))

    def submit_call(self, call: Callable[[threading.Event], Any], *, admitted: bool = False) -> Job:
        """Queue `call(cancel)` (other work on the engine: embeddings), in line with the
        generations; `await job.result()` gives what it returned. Refused as `submit` is, unless
        `admitted`: the next slice of a request already taken, which a full queue must not cut off."""
        return self._enqueue(lambda loop: Job(None, {}, loop, call=call), limited=not admitted)

    def _enqueue(self, make: Callable[[asyncio.AbstractEventLoop], Job], limited: bool = True) -> Job:
        if self.closed:
            raise shutting_down()
        with self._lock:
            # With no job running, the first in line is about to run (the worker has yet to take
            # it): it waits for no slot, so `--queue 1` accepts one running and one waiting.
            ahead = len(self._waiting) - (self.running is None)
            if limited and ahead >= self.limit:
                retry = self.retry_after()
                raise APIError(429, f"the server is busy: {ahead} requests wait for the model already "
                               f"(--queue {self.limit}); retry after about {retry} s", code="queue_full",
                               headers={"Retry-After": str(retry)})
            job = make(asyncio.get_running_loop())
            self._waiting.append(job)
        self._jobs.put(job)
        return job

    def cancel(self, job: Job, error: Optional[APIError] = None) -> None:
        """Stop `job`: a waiting one leaves the queue now (its slot frees at once), a running one
        stops between two tokens; no-op once done. `error` is what its client gets (None when
        the client is gone and nobody reads it)."""
        with self._lock:
            if job.state == WAITING:
                self._waiting.remove(job)
                job.state = DONE
                job._put(_End(error=error))
                return
        job._stop(error)

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: the jobs ahead times the mean job duration."""
        return max(1, min(600, math.ceil(self._mean_seconds * (len(self._waiting) + 1))))

    def shutdown(self, grace: float) -> None:
        """Refuse new jobs, answer waiting ones 503, give the running one `grace` seconds to finish."""
        if self.closed:
            return
        running = self._close()
        if running is not None:
            log.info("shutting down: the running request has %.0f s to finish", grace)
            asyncio.get_running_loop().call_later(grace, self.cancel, running, shutting_down())

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel everything and end the worker thread (blocking; idempotent; any thread)."""
        running = self._close()
        if running is not None:
            self.cancel(running, shutting_down())
        if self._thread is not None and self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join(timeout)

    def _close(self) -> Optional[Job]:
        """Refuse new jobs and answer the waiting ones 503; returns the running job, if any."""
        self.closed = True
        for job in list(self._waiting):
            self.cancel(job, shutting_down())
        return self.running

    # -- the worker thread -----------------------------------------------------------------------
    def _work(self) -> None:
        try:
            self._warm_up()
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                with self._lock:
                    if job.state != WAITING:
                        continue  # cancelled while it waited
                    self._waiting.remove(job)
                    job.state = RUNNING
                    self.running = job
                t0 = time.perf_counter()
                try:
                    end = self._run(job)
                except Exception as e:  # a bug here must not leave the client waiting forever
                    log.exception("the worker failed on a request")
                    end = _End(error=e)
                self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * (time.perf_counter() - t0)
                with self._lock:
                    job.state = DONE
                    self.running = None
                job._put(end)
                if self.fatal is not None:
                    self._close()
                    if self.on_fatal is not None:
                        self.on_fatal()
                    return
        finally:
            clear_streams()

    def _warm_up(self) -> None:
        temperatures = warmup_temperatures()
        try:
            log.info("warming the engine up (every pass shape once, so no request pays for compilation)")
            t0 = time.perf_counter()
            self.engine.warmup(temperatures=temperatures)
            if hasattr(self.engine, "prepare_grammar"):  # so no response_format request waits for it
                try:
                    self.engine.prepare_grammar()
                except Exception as e:  # e.g. a slow (Python) tokenizer: response_format requests say so
                    log.warning("structured output unavailable: %s", e)
            self.ready.set_result(time.perf_counter() - t0)
        except BaseException as e:
            self.ready.set_exception(e)
            raise

    def _run(self, job: Job) -> _End:
        """Stream the job's generations into it, one after another; stop between tokens when cancelled."""
        if job.call is not None:
            try:
                value = job.call(job._cancel)
            except Exception as e:
                return _End(error=self._failed(e))
            stopped = job._cancel.is_set()
            return _End(error=job._cancel_error if stopped else None, complete=not stopped, value=value)
        done: List[GenerationStats] = []
        finished = 0  # generations that reached their finish_reason
        for prompt, options in job.runs:
            events = last = None
            try:
                # `cancel` also stops a long prompt between two chunks (a client gone before its first token)
                events = self.engine.stream(prompt, cancel=job._cancel, **options)  # checks the arguments first
                for last in events:
                    if last.finish_reason:  # its own final copy: the engine's object is not read across threads
                        last = dataclasses.replace(last, stats=copy.deepcopy(last.stats))
                    job._put(last)
                    if last.finish_reason or job._cancel.is_set():
                        break
            except Exception as e:
                return _End(done, error=self._failed(e))
            finally:
                if events is not None:
                    events.close()  # the engine's own cleanup: caches consistent for the next job
            ended = last is not None and bool(last.finish_reason)
            finished += ended
            done.append(last.stats if ended else
                        copy.deepcopy(last.stats if last is not None else self.engine.last_stats))
            if job._cancel.is_set():
                break
        return _End(done, error=job._cancel_error if job._cancel.is_set() else None,
                    complete=finished == len(job.runs))

    def _failed(self, e: Exception) -> Exception:
        """What a job that raised `e` answers; a broken sharded target also closes the queue."""
        if getattr(getattr(self.engine, "coord", None), "broken", False):
            self.fatal = e = APIError(503, f"{e}: a sharded target cannot run without every rank, so this "
                                           f"server stops; restart every rank", code="distributed_error")
        elif not isinstance(e, MlxSpecError):  # an unforeseen failure: log it, start the next job clean
            log.error("the engine failed on a request", exc_info=e)
            self.engine.reset()
        return e

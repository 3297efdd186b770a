"""The queue's hand-over of events from the worker thread to the event loop: batched, in order, ends at once."""

import asyncio
import math
import threading
import time
import types

import pytest

from mlxspec.serve import queue as q
from mlxspec.serve.errors import APIError
from mlxspec.stats import GenerationStats, TokenEvent


def _event(i: int) -> TokenEvent:
    return TokenEvent(i, str(i), False, i, 0, GenerationStats())


async def _consume(job):
    """Every batch next_events returns, with the time it came, until the job ends."""
    batches = []
    while (events := await job.next_events()) is not None:
        batches.append((time.monotonic(), [ev.token for ev in events]))
    return batches, time.monotonic()


def _produce(job, n: int, period: float, hold: threading.Event = None) -> None:
    for i in range(n):
        job._put(_event(i))
        time.sleep(period)
    if hold is not None:
        hold.wait()
    job._put(q._End(stats=GenerationStats()))


class CountingLoop:
    """An event loop that counts the worker's wake-ups (each takes the GIL from the engine's thread)."""

    def __init__(self, loop):
        self.loop, self.wakeups = loop, 0

    def call_soon_threadsafe(self, *args):
        self.wakeups += 1
        return self.loop.call_soon_threadsafe(*args)

    def __getattr__(self, name):
        return getattr(self.loop, name)


def test_events_arrive_in_order_batched_at_most_once_per_flush_interval():
    async def main():
        loop = CountingLoop(asyncio.get_running_loop())
        job = q.Job("p", {}, loop)
        t0 = time.monotonic()
        worker = threading.Thread(target=_produce, args=(job, 200, 0.001))
        worker.start()
        batches, _ = await _consume(job)
        worker.join()
        return batches, time.monotonic() - t0, loop.wakeups

    batches, elapsed, wakeups = asyncio.run(main())
    assert [t for _, tokens in batches for t in tokens] == list(range(200))
    assert len(batches) <= math.ceil(elapsed / q.FLUSH_SECONDS) + 1
    assert wakeups <= len(batches) + 1  # one per batch at most, and the end's: not one per token
    gaps = [b[0] - a[0] for a, b in zip(batches, batches[1:])]
    # The last batch came with the end, which does not wait for the window; 0.9: timer resolution.
    assert len(gaps) >= 2 and all(gap >= q.FLUSH_SECONDS * 0.9 for gap in gaps[:-1])


def test_the_first_tokens_and_the_end_are_not_held_back(monkeypatch):
    monkeypatch.setattr(q, "FLUSH_SECONDS", 30.0)  # a window no test would wait out

    async def main():
        job = q.Job("p", {}, asyncio.get_running_loop())
        hold = threading.Event()
        worker = threading.Thread(target=_produce, args=(job, 3, 0.0, hold))
        worker.start()
        first = await asyncio.wait_for(job.next_events(), 10)  # the first batch goes out at once
        hold.set()
        t_end = time.monotonic()
        rest = await asyncio.wait_for(job.next_events(), 10)  # the end cuts the window short
        done = await asyncio.wait_for(job.next_events(), 10)
        worker.join()
        return first, rest, done, time.monotonic() - t_end

    first, rest, done, waited = asyncio.run(main())
    assert [ev.token for ev in first + (rest or [])] == [0, 1, 2] and done is None
    assert waited < 10


def test_a_consumer_already_waiting_is_woken_by_the_first_token(monkeypatch):
    monkeypatch.setattr(q, "FLUSH_SECONDS", 30.0)

    async def main():
        job = q.Job("p", {}, asyncio.get_running_loop())
        waiting, hold = threading.Event(), threading.Event()

        def produce():
            waiting.wait(10)
            time.sleep(0.05)  # the consumer is parked in next_events by now
            job._put(_event(0))
            hold.wait(20)  # no end, no second token: only the first token's wake-up can reach it
            job._put(q._End(stats=GenerationStats()))

        worker = threading.Thread(target=produce)
        worker.start()
        waiting.set()
        try:
            return await asyncio.wait_for(job.next_events(), 10)
        finally:
            hold.set()
            await asyncio.to_thread(worker.join)

    assert [ev.token for ev in asyncio.run(main())] == [0]


def test_a_token_put_inside_the_window_goes_out_when_the_window_closes(monkeypatch):
    """The worker does not wake the loop for a token inside the window; the loop's own timer
    for the window's end does, even when nothing else comes."""
    monkeypatch.setattr(q, "FLUSH_SECONDS", 0.2)

    async def main():
        job = q.Job("p", {}, asyncio.get_running_loop())
        got_first, hold = threading.Event(), threading.Event()

        def produce():
            job._put(_event(0))
            got_first.wait(10)
            time.sleep(0.05)  # inside the window the first batch opened
            job._put(_event(1))
            hold.wait(20)
            job._put(q._End(stats=GenerationStats()))

        worker = threading.Thread(target=produce)
        worker.start()
        try:
            first = await asyncio.wait_for(job.next_events(), 10)
            t_first = time.monotonic()
            got_first.set()
            second = await asyncio.wait_for(job.next_events(), 10)
            return first, second, time.monotonic() - t_first
        finally:
            hold.set()
            await asyncio.to_thread(worker.join)

    first, second, after = asyncio.run(main())
    assert [ev.token for ev in first + second] == [0, 1]
    assert after >= q.FLUSH_SECONDS * 0.9  # (timer resolution) held for the window, then sent


def test_the_queue_limit_counts_waiting_jobs_not_the_one_about_to_run():
    # The worker is not started, so every job stays where submit put it: as just after
    # submission, before the idle worker has taken the first.
    async def main(running):
        queue = q.EngineQueue(engine=None, limit=1)
        if running:
            queue.running = q.Job("busy", {}, asyncio.get_running_loop())
        accepted = [queue.submit("a", {})]
        with pytest.raises(APIError) as refused:
            while len(accepted) < 5:
                accepted.append(queue.submit("b", {}))
        return len(accepted), refused.value

    for running, expected in ((False, 2), (True, 1)):  # idle: one to run + one waiting; busy: one waiting
        n, error = asyncio.run(main(running))
        assert n == expected
        assert error.status == 429 and "1 requests wait" in error.message


def test_a_call_admitted_already_is_queued_past_the_limit_a_new_one_is_not():
    async def main():
        queue = q.EngineQueue(engine=None, limit=1)
        queue.running = q.Job("busy", {}, asyncio.get_running_loop())
        queue.submit("a", {})  # the one place that may wait is taken
        with pytest.raises(APIError) as refused:
            queue.submit_call(lambda cancel: None)
        job = queue.submit_call(lambda cancel: None, admitted=True)  # the next slice of a request taken
        return refused.value, job, queue.waiting

    refused, job, waiting = asyncio.run(main())
    assert refused.status == 429 and job.call is not None and waiting == 2


def test_the_worker_times_its_warm_up_and_keeps_a_running_mean_of_its_jobs():
    async def main():
        queue = q.EngineQueue(engine=types.SimpleNamespace(warmup=lambda **kw: time.sleep(0.1)))
        t0 = time.monotonic()
        warm = await asyncio.wrap_future(queue.start())
        warm_wall = time.monotonic() - t0
        queue._mean_seconds = 10.0
        t0 = time.monotonic()
        job = queue.submit_call(lambda cancel: time.sleep(0.5))
        await job.result()
        took = time.monotonic() - t0
        queue.stop()
        return warm, warm_wall, queue._mean_seconds, took

    warm, warm_wall, mean, took = asyncio.run(main())
    assert 0.1 <= warm <= warm_wall
    assert 0.8 * 10.0 + 0.2 * 0.5 <= mean <= 0.8 * 10.0 + 0.2 * took  # a fifth of the new job's time


def test_retry_after_is_the_jobs_ahead_times_the_mean_job_within_1_to_600_s():
    async def main():
        queue = q.EngineQueue(engine=None, limit=8)  # not started: the jobs stay where submit put them
        queue.running = q.Job("busy", {}, asyncio.get_running_loop())
        for _ in range(3):
            queue.submit("a", {})
        said = {}
        for mean in (2.5, 0.0, 1000.0):
            queue._mean_seconds = mean
            said[mean] = queue.retry_after()
        return said

    assert asyncio.run(main()) == {2.5: 10, 0.0: 1, 1000.0: 600}  # 2.5 s x (3 waiting + the running one)


def test_stopping_a_queue_never_started_is_a_no_op():
    queue = q.EngineQueue(engine=None)
    queue.stop()
    assert queue.closed and queue.running is None

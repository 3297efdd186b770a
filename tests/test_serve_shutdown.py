"""SIGINT/SIGTERM: stop accepting, finish (or, past the grace period, cancel) the running stream, exit 0."""

import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from serve_helpers import TIMEOUT, free_port, server_process, stop_process, wait_until

TESTS = Path(__file__).resolve().parent
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def start(grace: float, per_token: float):
    port = free_port()
    proc = server_process([str(TESTS / "serve_tiny.py"), str(port), str(grace), str(per_token)], port)
    return proc, f"http://127.0.0.1:{port}"


def sse_events_from(lines):
    """The data lines of an SSE stream; None stands for [DONE]."""
    return [None if line == "data: [DONE]" else line for line in lines if line.startswith("data: ")]


def refused(url) -> bool:
    try:
        httpx.get(f"{url}/health", timeout=1)
        return False
    except httpx.ConnectError:
        return True
    except (httpx.ReadError, httpx.RemoteProtocolError):
        # The kernel queued the connection just before the listening socket closed: it is reset
        # unanswered, which is not being served either (a crash still fails the exit-code check).
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_lets_the_running_stream_finish_then_exits_0(sig):
    proc, url = start(grace=30, per_token=0.02)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 60, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT) as r:
        lines = r.iter_lines()
        next(lines)
        proc.send_signal(sig)
        wait_until(lambda: refused(url), "the server stops accepting connections")
        events = sse_events_from(lines)
    log = stop_process(proc)
    assert proc.returncode == 0, log
    assert events[-1] is None and ('"finish_reason":"length"' in events[-2] or '"finish_reason":"stop"' in events[-2])
    assert "Traceback" not in log


def test_past_the_grace_period_the_stream_is_cancelled_and_waiting_requests_get_503():
    proc, url = start(grace=0.5, per_token=0.05)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000, "stream": True}
    waiting = {}

    def second():
        waiting["r"] = httpx.post(f"{url}/v1/completions", json={"prompt": "next", "max_tokens": 4}, timeout=TIMEOUT)

    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT) as r:
        lines = r.iter_lines()
        next(lines)
        t = threading.Thread(target=second, daemon=True)
        t.start()
        time.sleep(0.3)  # the second request is queued behind the stream
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        events = sse_events_from(lines)
        took = time.monotonic() - t0
    t.join(TIMEOUT)
    log = stop_process(proc)
    assert proc.returncode == 0, log
    assert events[-1] is None and '"code":"shutting_down"' in events[-2], events[-3:]
    assert took < 10  # 1000 tokens at 50 ms would take 50 s
    assert waiting["r"].status_code == 503 and waiting["r"].json()["error"]["code"] == "shutting_down"


def test_a_signal_while_warming_up_ends_the_server_at_once():
    import os
    import subprocess

    root = str(TESTS.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, str(TESTS), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, str(TESTS / "serve_slow_warmup.py"), str(free_port())], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:  # its warm-up takes a minute
        lines.append(line)
        if "warming up" in line:
            break
    time.sleep(0.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=20)
    log = "".join(lines) + proc.stdout.read()
    assert time.monotonic() - t0 < 10 and proc.returncode == 130, log
    assert "interrupted while warming up" in log and "Traceback" not in log


def test_a_second_ctrl_c_cuts_the_stream_off_quietly_and_exits_130():
    proc, url = start(grace=30, per_token=0.05)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT) as r:
        lines = r.iter_lines()
        next(lines)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        try:
            for _ in lines:
                pass
        except httpx.HTTPError:
            pass  # the connection is cut: that is what a forced quit does
    log = stop_process(proc)
    assert proc.returncode == 130, log
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log
    assert "ERROR" not in log, log  # uvicorn's "returned without completing response": the cut was asked for
    assert "a second Ctrl-C" in log


def test_a_sharded_target_that_lost_its_ranks_stops_the_server_with_a_503():
    """Once the group is broken no request can run: the one that found it gets a 503 saying so,
    and the server stops (it used to say it kept serving, then hang the next request)."""
    from types import SimpleNamespace

    from mlxspec.distributed import DistributedError
    from serve_helpers import running_server, tiny_engine

    class Orphan:
        def __init__(self, engine):
            self.engine, self.coord = engine, SimpleNamespace(active=False, broken=False, is_main=True)

        def __getattr__(self, name):
            return getattr(self.engine, name)

        def stream(self, prompt, **kw):
            self.coord.broken = True
            raise DistributedError("rank 0: lost the other ranks while waiting for a target pass to start")

    with running_server(Orphan(tiny_engine())) as (url, server):
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                           "max_tokens": 4}, timeout=TIMEOUT)
        assert r.status_code == 503 and r.json()["error"]["code"] == "distributed_error"
        said = r.json()["error"]["message"]
        assert "lost the other ranks" in said and "restart every rank" in said
        wait_until(lambda: server.should_exit, "the server stops on its own")
        assert server.mlxspec.queue.closed and server.mlxspec.queue.fatal is not None


@pytest.mark.parametrize("force_exit", [None, False, True])
def test_only_a_forced_quit_silences_the_app_s_cancellation_and_lifespan_traceback(force_exit):
    """A second Ctrl-C cancels what runs, as asked: no traceback for it. Without one (or before the
    server exists), a cancellation or a failed lifespan shutdown is a fault that uvicorn must see whole."""
    import asyncio
    from types import SimpleNamespace

    from mlxspec.serve.server import _QuietWhenForced

    failed = {"type": "lifespan.shutdown.failed", "message": "Traceback: ..."}
    started = {"type": "lifespan.startup.complete", "extra": 1}

    class App:
        state = SimpleNamespace()

        async def __call__(self, scope, receive, send):
            await send(dict(failed))
            await send(dict(started))
            raise asyncio.CancelledError

    quiet, sent = _QuietWhenForced(App()), []
    quiet.server = None if force_exit is None else SimpleNamespace(force_exit=force_exit)

    async def send(message):
        sent.append(message)

    if force_exit:
        asyncio.run(quiet({"type": "lifespan"}, None, send))
    else:
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(quiet({"type": "lifespan"}, None, send))
    assert sent == [{"type": failed["type"]} if force_exit else failed, started]


def test_a_forced_quit_drops_only_uvicorn_s_error_for_the_cut_response():
    import logging
    from types import SimpleNamespace

    from mlxspec.serve.server import _ForcedCut

    server = SimpleNamespace(force_exit=False)
    cut = _ForcedCut(server)

    def record(text):
        return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, text, None, None)

    unfinished, other = record("ASGI callable returned without completing response."), record("Exception in ASGI")
    assert cut.filter(unfinished) and cut.filter(other)  # without a forced quit it is a fault: logged
    server.force_exit = True
    assert not cut.filter(unfinished) and cut.filter(other)

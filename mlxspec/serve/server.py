"""Run the app under uvicorn: bind, serve, and stop cleanly on SIGINT/SIGTERM with exit status 0.

On the first signal the server stops accepting connections, answers waiting requests 503,
and gives the running one `shutdown_grace` seconds to finish before cancelling it (a
stream then ends with an error event and `[DONE]`). A second SIGINT quits at once (exit status
130). A signal while the engine warms up, before anything is served, ends the process at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import sys
import threading
from typing import Optional

import uvicorn

from ..distributed import is_distributed
from ..errors import InvalidArgumentError
from .app import make_app
from .local import is_loopback
from .options import ServeOptions
from .timeouts import head_timeout_protocol

log = logging.getLogger("mlxspec.serve")


class Server(uvicorn.Server):
    """uvicorn's server, plus: the first signal drains the engine's queue; signals are not re-raised.

    (uvicorn re-raises a caught SIGINT/SIGTERM after shutting down, so the process would end
    with 130 or by the signal; a server that stopped as asked exits 0.)
    """

    def __init__(self, config: uvicorn.Config, state):
        super().__init__(config)
        self.mlxspec = state
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        self.mlxspec.queue.on_fatal = lambda: self._loop.call_soon_threadsafe(self._stop_broken)
        await super().startup(sockets=sockets)

    def _stop_broken(self) -> None:
        """The engine cannot run again (`EngineQueue.fatal`): stop serving (the queue refuses already)."""
        log.error("%s", self.mlxspec.queue.fatal.message)
        self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig, frame) -> None:
        # Still warming up (seconds to minutes, one pass at a time on the worker thread, which cannot
        # be interrupted mid-pass): nothing is served or written yet, so end now. Not with several
        # ranks: they warm up in lockstep with this one, and are released after the warm-up.
        if not self.started and not is_distributed(self.mlxspec.engine):
            print("\ninterrupted while warming up", file=sys.stderr, flush=True)
            os._exit(128 + sig)
        first = not self.should_exit
        super().handle_exit(sig, frame)
        if first:
            self.drain()

    def drain(self) -> None:
        """Stop taking requests; the running one gets `shutdown_grace` seconds (thread-safe)."""
        if self._loop is not None:
            grace = self.mlxspec.options.shutdown_grace
            self._loop.call_soon_threadsafe(self.mlxspec.queue.shutdown, grace)


def build_server(engine, options: ServeOptions) -> Server:
    """The app for `engine` inside a uvicorn server that is ready to `run()`."""
    app = make_app(engine, options)
    quiet = _QuietWhenForced(app)
    config = uvicorn.Config(quiet, host=options.host, port=options.port, log_level=options.log_level,
                            lifespan="on", timeout_graceful_shutdown=options.shutdown_grace + 5,
                            http=head_timeout_protocol(options.client_timeout))
    server = quiet.server = Server(config, app.state.mlxspec)
    return server


class _QuietWhenForced:
    """The app, but a second Ctrl-C's cancellation of what runs is not logged as its failure
    (uvicorn logs a traceback per cancelled request and for the lifespan)."""

    def __init__(self, app):
        self.app, self.server = app, None
        self.state = app.state  # the app's, as uvicorn's config.app is read for it

    async def __call__(self, scope, receive, send):
        async def told(message):  # Starlette sends the lifespan's cancellation as a traceback to log
            if self.forced and message.get("type") == "lifespan.shutdown.failed":
                message = {"type": message["type"]}
            await send(message)

        try:
            await self.app(scope, receive, told if scope.get("type") == "lifespan" else send)
        except asyncio.CancelledError:
            if not self.forced:
                raise

    @property
    def forced(self) -> bool:
        return self.server is not None and self.server.force_exit


class _ForcedCut(logging.Filter):
    """Drops uvicorn's error for the stream a second Ctrl-C cut off: the cut is what was asked for
    (and serve() says so as it exits)."""

    def __init__(self, server: Server):
        super().__init__()
        self.server = server

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.server.force_exit and record.getMessage().startswith("ASGI callable returned without"))


def serve(engine, options: ServeOptions) -> int:
    """Serve until SIGINT/SIGTERM; returns 0 once stopped (130 after a second Ctrl-C cut it short)."""
    warning = bind_warning(options.host, options.api_key)
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    server = build_server(engine, options)
    cut = _ForcedCut(server)
    logging.getLogger("uvicorn.error").addFilter(cut)
    try:
        server.run()
    finally:
        server.mlxspec.queue.stop()  # after a forced quit, lifespan shutdown did not run
        logging.getLogger("uvicorn.error").removeFilter(cut)
    if server.force_exit:
        print("stopped at once (a second Ctrl-C): the running request was cut off", file=sys.stderr)
        return 130
    return 0 if server.started and server.mlxspec.queue.fatal is None else 1


def check_address(host: str, port: int) -> None:
    """Whether the server could listen on host:port, asked before minutes of loading a model
    (uvicorn says "address already in use" only once the model is loaded and warmed up).
    InvalidArgumentError saying why not. Binds and closes at once, as uvicorn binds (SO_REUSEADDR)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise InvalidArgumentError(f"--host {host!r}: no such address here ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        hint = (" (another server is listening there: stop it or choose another --port)"
                if e.errno == errno.EADDRINUSE else
                " (ports below 1024 need privileges: choose another --port)" if e.errno == errno.EACCES else "")
        raise InvalidArgumentError(f"cannot listen on {host}:{port}: {e.strerror or e}{hint}") from None
    finally:
        sock.close()


def bind_warning(host: str, api_key: Optional[str]) -> Optional[str]:
    """A warning when the server is reachable beyond this machine without an API key, else None."""
    if api_key or is_loopback(host):
        return None
    return (f"serving on {host} without --api-key: anyone who can reach this port can use the model; "
            f"pass --api-key KEY (or bind 127.0.0.1)")

"""Shared helpers for the chat TUI tests: tiny engines and waiting for a turn to end."""

from __future__ import annotations

import asyncio
import functools
import time

from mlxspec.engine import Engine
from tests.tiny import make_llama, make_tokenizer

_MODELS = {}


def tiny_engine(draft: bool = True, **kwargs) -> Engine:
    """A fresh engine (own caches) over tiny random models built once per session."""
    if not _MODELS:
        _MODELS.update(tokenizer=make_tokenizer(), target=make_llama(0), draft=make_llama(1, layers=1))
    m = _MODELS
    return Engine(m["target"], m["tokenizer"], m["draft"] if draft else None, **kwargs)


async def until(done, timeout: float, failure: str, step: float) -> None:
    """Poll `done()` every `step` seconds; AssertionError(failure) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(failure)
        await asyncio.sleep(step)


async def wait_idle(app, pilot, timeout: float = 30.0) -> None:
    """Wait until the current turn has finished and its messages are handled."""
    await pilot.pause()
    await until(lambda: not app.busy, timeout, f"the turn did not finish within {timeout} s", 0.02)
    await pilot.pause()


async def send(app, pilot, text: str, *, wait: bool = True, timeout: float = 10.0) -> None:
    """Type `text` and press Enter; with `wait`, until its turn (if any) has finished.

    The Submitted message reaches the app's handler a few message hops after the key, and a
    pause does not always cover them: the handler clears the prompt first (and a message's turn
    is busy from then on), so wait for that before waiting for the turn."""
    prompt = app.query_one("#prompt")
    prompt.value = text
    await pilot.press("enter")
    await until(lambda: not prompt.value, timeout, f"{text!r} was not submitted within {timeout} s", 0.01)
    if wait:
        await wait_idle(app, pilot)


def async_test(fn):
    """Run an async test with asyncio.run (no pytest async plugin needed)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        asyncio.run(fn(*args, **kwargs))

    return run

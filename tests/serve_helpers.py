"""A real `mlxspec serve` (uvicorn, loopback, a free port) in a background thread, for the tests.

Also engines that let a test hold or slow the generation (GatedEngine) and a tiny model
whose logits can be turned into NaN (PoisonableLlama), so queueing, disconnects and
engine errors can be tested without timing luck.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Iterator, List, Optional

import mlx.core as mx
from mlx_lm.models import llama

import tiny
from mlxspec.engine import Engine
from mlxspec.serve import ServeOptions, build_server

TIMEOUT = 30.0  # seconds any one client call may take before the test fails instead of hanging


def tiny_engine(seed: int = 0, **kw) -> Engine:
    """A tiny random llama (separate head, so different prompts give different text) with the byte tokenizer."""
    return Engine(tiny.make_llama(seed, tie_embeddings=False), tiny.make_tokenizer(), **kw)


@contextlib.contextmanager
def scripted_server(model_id: str = "s") -> Iterator[tuple]:
    """A served `tiny.ScriptedModel` with the tools template; yields (base_url, say): `say(text,
    messages, tools=None)` makes the model answer `text` to exactly that conversation."""
    from mlxspec.prompts import encode_prompt

    tok = tiny.make_tokenizer(tiny.TOOLS_TEMPLATE)
    model = tiny.ScriptedModel()
    end = [tiny.SPECIALS.index("<|im_end|>")]
    with running_server(Engine(model, tok, drafter="ngram"), model_id=model_id) as (url, _):
        def say(text, messages, tools=None):
            model.say(tok.encode(text, add_special_tokens=False) + end,
                      len(encode_prompt(messages, tok, tiny.VOCAB, tools=tools)))
        yield url, say


@contextlib.contextmanager
def running_server(engine, **options) -> Iterator[tuple]:
    """Serve `engine` on 127.0.0.1 at a free port; yields (base_url, server). Stops it on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    options.setdefault("log_level", "warning")
    server = build_server(engine, ServeOptions(host="127.0.0.1", port=port, **options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(TIMEOUT)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_process(argv: List[str], port: int, *, timeout: float = 60, **env) -> subprocess.Popen:
    """Start `python ARGV...` (a server on `port`) with this checkout importable; wait for /health."""
    import httpx

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]), **env)
    proc = subprocess.Popen([sys.executable, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)

    def up():
        assert proc.poll() is None, proc.stdout.read()
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(up, "the server answers /health", timeout=timeout)
    except BaseException:
        proc.kill()
        raise
    return proc


def stop_process(proc: subprocess.Popen) -> str:
    """Wait for the process to end (kill it after TIMEOUT); return what it printed."""
    try:
        proc.wait(TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.stdout.read()


def openai_client(base_url: str, api_key: str = "unused", **kw):
    import openai

    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=TIMEOUT, **kw)


def scrape_metrics(url: str, headers: Optional[dict] = None) -> dict:
    """GET /metrics as {sample name with its labels: value}, its text format checked on the way."""
    import httpx

    r = httpx.get(f"{url}/metrics", headers=headers or {}, timeout=TIMEOUT)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse_metrics(r.text)


def parse_metrics(text: str) -> dict:
    """Prometheus' text format as {sample name with its labels: value}, its comment lines checked."""
    import re

    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.fullmatch(r"# (HELP|TYPE) mlxspec_\w+ .+", line), line
            continue
        name, value = line.rsplit(" ", 1)
        samples[name] = float(value)
    return samples


def wait_until(predicate, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


class GatedEngine:
    """An engine whose generations wait for `gate` before their first token, optionally sleep per
    token, and record how many tokens each produced before it ended (`produced`)."""

    def __init__(self, engine, *, per_token_seconds: float = 0.0):
        self.engine = engine
        self.gate = threading.Event()
        self.gate.set()
        self.per_token_seconds = per_token_seconds
        self.started = 0  # generations that reached the gate
        self.max_tokens: List[int] = []  # each generation's max_tokens, in the order the engine got them
        self.produced: List[int] = []  # tokens yielded by each ended generation

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def stream(self, prompt, **kw):
        events = self.engine.stream(prompt, **kw)  # argument errors are raised here, as the engine does
        self.max_tokens.append(kw.get("max_tokens"))
        return self._held(events)

    def _held(self, events):
        self.started += 1
        assert self.gate.wait(TIMEOUT), "the test never opened the gate"
        n = 0
        try:
            for ev in events:
                n += 1
                yield ev
                if self.per_token_seconds:
                    time.sleep(self.per_token_seconds)
        finally:
            events.close()
            self.produced.append(n)


class PoisonableLlama(llama.Model):
    """A llama whose logits are NaN while `poisoned` is set (to make the engine raise NumericalError)."""

    poisoned = False

    def __call__(self, inputs, cache=None, **kw):
        out = super().__call__(inputs, cache=cache, **kw)
        return out * mx.array(float("nan")) if self.poisoned else out


def poisonable_engine() -> Engine:
    model = tiny.make_llama(0, tie_embeddings=False)
    model.__class__ = PoisonableLlama
    return Engine(model, tiny.make_tokenizer())


def iter_sse(response) -> Iterator[Optional[dict]]:
    """The JSON bodies of an httpx streaming response's server-sent events, as they come; None stands for [DONE]."""
    return sse_bodies(response.iter_lines())


def sse_bodies(lines) -> Iterator[Optional[dict]]:
    """The JSON bodies of server-sent events' `data:` lines; None stands for [DONE]."""
    import json

    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            yield None if data == "[DONE]" else json.loads(data)


def built_events(chunks: List[bytes]) -> List[Optional[dict]]:
    """The JSON bodies of the server-sent events an answer's builder wrote (its SSE bytes)."""
    return list(sse_bodies(line for chunk in chunks for line in chunk.decode().splitlines()))


def usage_body(prompt: int, cached: int, completion: int) -> dict:
    """The chat path's usage (the fields the other APIs' builders and the metrics read)."""
    return {"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens": completion}


def sse_events(response) -> List[Optional[dict]]:
    """All of `iter_sse(response)`."""
    return list(iter_sse(response))

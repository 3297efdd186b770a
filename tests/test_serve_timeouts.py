"""Clients that connect and stall are disconnected; slow answers are not."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from serve_helpers import TIMEOUT, GatedEngine, running_server, tiny_engine

LIMIT = 0.6  # seconds the test server gives a client


@pytest.fixture(scope="module")
def server():
    engine = GatedEngine(tiny_engine(), per_token_seconds=0.05)  # answers that take longer than LIMIT
    with running_server(engine, model_id="t", client_timeout=LIMIT) as (url, _):
        yield url


def connect(url) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=TIMEOUT)
    return s


def closed_after(s: socket.socket) -> float:
    """Seconds until the server closes the connection (reading what it sends meanwhile)."""
    t0 = time.monotonic()
    while s.recv(4096):
        pass
    return time.monotonic() - t0


@pytest.mark.parametrize("sent", [b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"])
def test_a_head_that_never_completes_is_cut_off(server, sent):
    with connect(server) as s:
        s.sendall(sent)
        assert LIMIT * 0.8 < closed_after(s) < LIMIT + 5


def test_a_body_that_stalls_gets_408(server):
    with connect(server) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"messages\":")
        answer = b""
        t0 = time.monotonic()
        while chunk := s.recv(4096):
            answer += chunk
            if b"request_timeout" in answer:
                break
        assert time.monotonic() - t0 < LIMIT + 5
    assert answer.startswith(b"HTTP/1.1 408") and b"--client-timeout" in answer


def test_answers_longer_than_the_limit_and_kept_alive_connections_are_served(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}  # about 1 s of tokens
    with httpx.Client(timeout=TIMEOUT) as client:
        for _ in range(2):  # the same connection, the second time after an answer
            t0 = time.monotonic()
            r = client.post(f"{server}/v1/chat/completions", json=body)
            assert r.status_code == 200 and time.monotonic() - t0 > LIMIT
        with client.stream("POST", f"{server}/v1/chat/completions", json=dict(body, stream=True)) as streamed:
            assert streamed.read().rstrip().endswith(b"data: [DONE]")


def test_a_timeout_of_zero_waits_for_any_client():
    """--client-timeout 0 waits forever: a head that comes late, on a new or a kept-alive connection, is answered."""
    with running_server(tiny_engine(), model_id="t", client_timeout=0) as (url, _):
        with connect(url) as s:
            for _ in range(2):
                time.sleep(0.3)  # a client slower than the event loop's next turn
                s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert read_answer(s).startswith(b"HTTP/1.1 200")


def read_answer(s: socket.socket) -> bytes:
    """One whole answer (head and its Content-Length of body), however the bytes are split."""
    answer = b""
    while b"\r\n\r\n" not in answer and (chunk := s.recv(4096)):
        answer += chunk
    head = answer.split(b"\r\n\r\n")[0].lower()
    length = int(head.split(b"content-length:")[1].split(b"\r\n")[0]) if b"content-length:" in head else 0
    while len(answer) < len(head) + 4 + length and (chunk := s.recv(4096)):
        answer += chunk
    return answer

"""One engine, many clients: arrival order, 429 past the queue, disconnects, and a load test."""

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from serve_helpers import (TIMEOUT, GatedEngine, openai_client, running_server, scrape_metrics, sse_events,
                           tiny_engine, wait_until)

HI = [{"role": "user", "content": "hi"}]


def chat(url, body, timeout=TIMEOUT):
    return httpx.post(f"{url}/v1/chat/completions", json={"messages": HI, "max_tokens": 4, **body}, timeout=timeout)


def test_queue_overflow_is_429_with_retry_after_and_order_is_kept():
    engine = GatedEngine(tiny_engine())
    engine.gate.clear()
    with running_server(engine, queue=2) as (url, server):
        queue = server.mlxspec.queue
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(chat, url, {"max_tokens": 2})]
            wait_until(lambda: engine.started == 1, "the first request holds the engine")
            for i in (1, 2):  # two more wait: the queue is full
                futures.append(pool.submit(chat, url, {"max_tokens": 2 + i}))
                wait_until(lambda: queue.waiting == i, f"request {i} waits")
            r = chat(url, {})
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["code"] == "queue_full" and "--queue 2" in r.json()["error"]["message"]
            assert r.json()["error"]["type"] == "rate_limit_error"  # OpenAI's, for a 429
            health = httpx.get(f"{url}/health", timeout=TIMEOUT)
            h = health.json()
            assert health.status_code == 200 and (h["status"], h["running"], h["waiting"], h["queue"]) == \
                ("ok", True, 2, 2)
            m = scrape_metrics(url)
            assert (m["mlxspec_requests_running"], m["mlxspec_requests_waiting"]) == (1, 2)
            engine.gate.set()
            results = [f.result(TIMEOUT) for f in futures]
        assert [r.status_code for r in results] == [200, 200, 200]
        assert engine.max_tokens == [2, 3, 4]  # run in arrival order
        assert chat(url, {}).status_code == 200  # and the queue has room again


def test_disconnect_mid_stream_cancels_and_the_next_request_is_clean():
    engine = GatedEngine(tiny_engine(), per_token_seconds=0.01)
    body = {"messages": HI, "max_tokens": 1000, "stream": True}
    with running_server(engine) as (url, server):
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT) as r:
            lines = r.iter_lines()
            seen = [line for line, _ in zip(lines, range(6))]  # role chunk + a few tokens, then hang up
            assert any("content" in line for line in seen)
        wait_until(lambda: engine.produced, "the cancelled generation ends")
        assert engine.produced[0] < 1000  # it stopped early: 1000 tokens would take 10 s
        wait_until(lambda: server.mlxspec.queue.running is None, "the engine is free")
        engine.per_token_seconds = 0.0
        after = openai_client(url).chat.completions.create(model="m", messages=HI, max_tokens=24)
    fresh = tiny_engine().generate(HI, max_tokens=24)
    assert after.choices[0].message.content == fresh.text


def test_health_is_503_once_the_server_is_stopping():
    with running_server(tiny_engine()) as (url, server):
        assert httpx.get(f"{url}/health", timeout=TIMEOUT).json()["running"] is False
        server.mlxspec.queue.closed = True  # as a signal's shutdown leaves it, while connections drain
        r = httpx.get(f"{url}/health", timeout=TIMEOUT)
        server.mlxspec.queue.closed = False
    assert r.status_code == 503 and r.json()["status"] == "shutting_down"  # a balancer sends no more


def test_a_client_that_gives_up_during_a_long_prompt_stops_its_prefill():
    import tiny

    engine = tiny_engine()
    gate = engine.target.model = tiny.GatedPrefill(engine.target.model, 4)
    with running_server(engine) as (url, server):
        engine.target.prefill_step = 4
        gate.armed = True
        long = [{"role": "user", "content": "tell me about rivers " * 10}]
        with pytest.raises(httpx.ReadTimeout):  # gives up while the prompt is being fed
            httpx.post(f"{url}/v1/chat/completions", json={"messages": long, "max_tokens": 8}, timeout=0.5)
        assert gate.entered.is_set()
        queue = server.mlxspec.queue
        wait_until(lambda: queue.running is not None and queue.running._cancel.is_set(), "the job is cancelled")
        gate.release.set()
        wait_until(lambda: queue.running is None, "the engine is free")
        assert len(engine.target.tokens) == 4  # the chunk under way finished; no other was fed
        gate.armed = False
        after = openai_client(url).chat.completions.create(model="m", messages=long, max_tokens=8)
    assert after.choices[0].message.content == tiny_engine().generate(long, max_tokens=8).text


def test_a_client_that_gives_up_while_waiting_leaves_the_queue():
    engine = GatedEngine(tiny_engine())
    engine.gate.clear()
    with running_server(engine, queue=4) as (url, server):
        queue = server.mlxspec.queue
        holder = threading.Thread(target=chat, args=(url, {}), daemon=True)
        holder.start()
        wait_until(lambda: engine.started == 1, "the first request holds the engine")
        with pytest.raises(httpx.ReadTimeout):
            chat(url, {}, timeout=0.5)  # waits behind it, then gives up
        wait_until(lambda: queue.waiting == 0, "the abandoned request leaves the queue")
        engine.gate.set()
        holder.join(TIMEOUT)
        assert chat(url, {}).status_code == 200
        assert engine.started == 2  # the abandoned request never reached the engine
        m = scrape_metrics(url)
    assert m["mlxspec_requests_cancelled_total"] == 1 and not any(k.startswith("mlxspec_errors_total") and v
                                                                 for k, v in m.items())  # cancelled, not failed


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/api/chat"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_is_counted_and_logged_as_cancelled_not_answered(path, stream, caplog):
    engine = GatedEngine(tiny_engine(), per_token_seconds=0.02)
    body = {"messages": HI, "max_tokens": 1000, "stream": stream}
    if path == "/api/chat":  # Ollama's name for the limit
        body["options"] = {"num_predict": body.pop("max_tokens")}
    with running_server(engine) as (url, server), caplog.at_level(logging.INFO, logger="mlxspec.serve"):
        if stream:  # reads a few events, then hangs up
            with httpx.stream("POST", f"{url}{path}", json=body, timeout=TIMEOUT) as r:
                assert len([line for line, _ in zip(r.iter_lines(), range(6))]) == 6
        else:  # gives up waiting for the answer
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{url}{path}", json=body, timeout=0.5)
        wait_until(lambda: engine.produced, "the cancelled generation ends")
        assert engine.produced[0] < 1000
        wait_until(lambda: scrape_metrics(url)["mlxspec_requests_cancelled_total"] == 1, "the request counts as cancelled")
        m = scrape_metrics(url)
    assert sum(v for k, v in m.items() if k.startswith("mlxspec_requests_total")) == 0
    assert m["mlxspec_generation_tokens_total"] == 0 == m["mlxspec_generations_total"]
    assert len([r for r in caplog.records if "the client went away" in r.getMessage()]) == 1


def _prompts():
    topics = ["rivers", "tea", "stars", "clocks", "bread", "ships", "moss", "glass", "bees", "salt"]
    return [(c, r, f"Client {c} asks about {topics[r]} ({c * 10 + r}).") for c in range(8) for r in range(10)]


def _options(c, r):
    """A mix of endpoints, streaming, speculation settings and lengths, all greedy."""
    kind = "chat" if (c + r) % 2 == 0 else "completion"
    extra = [{}, {"speculative": False}, {"num_draft": 2}, {"num_draft": "auto"}][(c * 3 + r) % 4]
    return kind, (c + r) % 3 == 0, dict(max_tokens=8 + (c + 2 * r) % 17, **extra)


def test_load_8_clients_x_10_requests_answered_in_full_and_unmixed():
    """Every answer equals the same request run alone on a fresh engine, whatever the interleaving."""
    engine = tiny_engine()
    with running_server(engine, queue=16) as (url, server):
        client = openai_client(url)

        def one(c, r, text):
            kind, stream, opts = _options(c, r)
            extra = {k: opts.pop(k) for k in ("speculative", "num_draft") if k in opts}
            if kind == "chat":
                call = client.chat.completions.create
                kw = dict(messages=[{"role": "user", "content": text}])
                piece = (lambda ch: ch.choices[0].delta.content or "") if stream else None
            else:
                call = client.completions.create
                kw = dict(prompt=text)
                piece = (lambda ch: ch.choices[0].text) if stream else None
            res = call(model="m", stream=stream, extra_body=extra, **kw, **opts)
            if stream:
                return "".join(piece(ch) for ch in res if ch.choices)
            return res.choices[0].message.content if kind == "chat" else res.choices[0].text

        def client_loop(c):
            return [(c, r, one(c, r, text)) for (cc, r, text) in _prompts() if cc == c]

        with ThreadPoolExecutor(8) as pool:
            answers = [a for f in [pool.submit(client_loop, c) for c in range(8)] for a in f.result(120)]

    assert len(answers) == 80
    reference = tiny_engine()  # one at a time, in a fixed order, straight on the engine
    for c, r, got in answers:
        kind, _, opts = _options(c, r)
        text = _prompts()[c * 10 + r][2]
        prompt = [{"role": "user", "content": text}] if kind == "chat" else text
        assert got == reference.generate(prompt, **opts).text, f"client {c} request {r}"
    assert len({a[2] for a in answers}) > 60  # the prompts really give different answers


def test_stream_and_usage_events_per_client_are_not_interleaved():
    engine = tiny_engine()
    with running_server(engine) as (url, _):
        def one(i):
            body = {"prompt": f"stream {i}", "max_tokens": 12, "stream": True, "stream_options": {"include_usage": True}}
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=TIMEOUT) as r:
                return i, sse_events(r)

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(one, range(8)))
    reference = tiny_engine()
    for i, events in results:
        assert events[-1] is None and len({e["id"] for e in events[:-1]}) == 1
        text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
        expected = reference.generate(f"stream {i}", max_tokens=12)
        assert text == expected.text
        assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == expected.stats.tokens


@pytest.mark.parametrize("route, body, last", [
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 4, "stream": True}, "data: [DONE]"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 4, "stream": True}, "event: response.incomplete"),
    ("/v1/messages", {"model": "m", "messages": HI, "max_tokens": 4, "stream": True}, "event: message_stop"),
])
def test_a_stream_whose_first_tokens_are_slow_is_kept_alive_with_comments(monkeypatch, route, body, last):
    """Queued behind another request or in a long prefill, a stream answers at once and sends SSE
    comments until its first tokens, so that a client's read timeout does not fire."""
    from mlxspec.serve import generation

    monkeypatch.setattr(generation, "HEADERS_AFTER", 0.05)
    monkeypatch.setattr(generation, "KEEPALIVE_EVERY", 0.05)
    engine = GatedEngine(tiny_engine())
    engine.gate.clear()
    with running_server(engine) as (url, _):
        with httpx.stream("POST", url + route, json=body, timeout=TIMEOUT) as r:  # returns once the headers came
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            lines = r.iter_lines()
            assert next(lines) == ": waiting for the first tokens" and engine.produced == []
            engine.gate.set()
            rest = [line for line in lines if line]
    events = [line for line in rest if not line.startswith(":")]
    assert rest[rest.index(events[0]):] == events  # comments only before the first event
    assert last in events and len(events) > 3


def test_an_ollama_stream_whose_first_tokens_are_slow_sends_only_json_lines(monkeypatch):
    """Ollama's streams have no comments: a slow start sends the headers, then nothing until the
    first tokens (its clients read every line as JSON)."""
    from mlxspec.serve import generation

    monkeypatch.setattr(generation, "HEADERS_AFTER", 0.05)
    monkeypatch.setattr(generation, "KEEPALIVE_EVERY", 0.05)
    engine = GatedEngine(tiny_engine())
    engine.gate.clear()
    body = {"model": "m", "messages": HI, "options": {"num_predict": 4}}
    with running_server(engine) as (url, _):
        with httpx.stream("POST", url + "/api/chat", json=body, timeout=TIMEOUT) as r:
            assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
            time.sleep(0.3)  # several keep-alive periods
            assert engine.produced == []
            engine.gate.set()
            lines = list(r.iter_lines())
    bodies = [json.loads(line) for line in lines]
    assert bodies[-1]["done"] is True and len(bodies) > 1

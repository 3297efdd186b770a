"""Web pages in a browser: preflights, CORS headers, and which origins may read answers."""

from __future__ import annotations

import httpx
import pytest

from serve_helpers import TIMEOUT, running_server, sse_events, tiny_engine

KEY = "sk-test"
HOSTED = "https://chat.example.com"
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server():
    with running_server(tiny_engine(), model_id="tiny", api_key=KEY, allow_origins=(HOSTED,)) as (url, _):
        yield url


def preflight(url, origin, **extra):
    headers = {"Origin": origin, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os", **extra}
    return httpx.options(f"{url}/v1/chat/completions", headers=headers, timeout=TIMEOUT)


@pytest.mark.parametrize("origin", ["http://localhost:3000", "http://127.0.0.1:5173", HOSTED])
def test_an_allowed_page_s_preflight_is_answered_without_the_key(server, origin):
    r = preflight(server, origin)
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == origin and "Origin" in r.headers["vary"]
    assert "POST" in r.headers["access-control-allow-methods"]
    assert r.headers["access-control-allow-headers"] == "authorization, content-type, x-stainless-os"
    assert "access-control-allow-private-network" not in r.headers
    r = preflight(server, origin, **{"Access-Control-Request-Private-Network": "true"})
    assert r.headers["access-control-allow-private-network"] == "true"
    r = httpx.options(f"{server}/v1/models", headers={"Origin": origin, "Access-Control-Request-Method": "GET"},
                      timeout=TIMEOUT)
    assert r.status_code == 204 and "access-control-allow-headers" not in r.headers  # none asked for


@pytest.mark.parametrize("origin", ["http://localhost:3000", HOSTED])
def test_an_allowed_page_reads_answers_and_errors(server, origin):
    auth = {"Origin": origin, "Authorization": f"Bearer {KEY}"}
    r = httpx.post(f"{server}/v1/chat/completions", json=BODY, headers=auth, timeout=TIMEOUT)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
    assert r.headers["access-control-expose-headers"] == "Retry-After"  # a page may read a 429's
    odd = dict(auth, **{"Access-Control-Request-Method": "POST"})  # only an OPTIONS request is a preflight
    r = httpx.post(f"{server}/v1/chat/completions", json=BODY, headers=odd, timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["choices"]
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=dict(BODY, stream=True), headers=auth,
                      timeout=TIMEOUT) as streamed:
        assert streamed.headers["access-control-allow-origin"] == origin
        assert sse_events(streamed)[-1] is None  # [DONE]
    r = httpx.post(f"{server}/v1/chat/completions", json=BODY, headers={"Origin": origin}, timeout=TIMEOUT)
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == origin  # the page sees why


@pytest.mark.parametrize("origin", ["https://attacker.example", "null", "https://chat.example.com.attacker.example",
                                    "http://[bad"])
def test_other_pages_are_refused_before_any_cors_header(server, origin):
    for r in (preflight(server, origin),
              httpx.post(f"{server}/v1/chat/completions", json=BODY, timeout=TIMEOUT,
                         headers={"Origin": origin, "Authorization": f"Bearer {KEY}"})):
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_host"
        assert "access-control-allow-origin" not in r.headers and "--allow-origin" in r.json()["error"]["message"]


def test_clients_that_are_not_browsers_get_no_cors_headers(server):
    r = httpx.post(f"{server}/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {KEY}"},
                   timeout=TIMEOUT)
    assert r.status_code == 200 and not any(h.startswith("access-control-") for h in r.headers)


def test_any_origin_when_told_so():
    with running_server(tiny_engine(), model_id="tiny", allow_origins=("*",)) as (url, _):
        for origin in ("https://anything.example", "null"):
            assert preflight(url, origin).headers["access-control-allow-origin"] == origin
            r = httpx.post(f"{url}/v1/chat/completions", json=BODY, headers={"Origin": origin}, timeout=TIMEOUT)
            assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin

"""A server bound to this machine answers only requests addressed to it (no web page of another
origin, no DNS rebinding), and what clients send cannot grow its memory or its log."""

from __future__ import annotations

import logging

import httpx
import pytest

from serve_helpers import TIMEOUT, running_server, scrape_metrics, tiny_engine
from mlxspec.serve.local import is_loopback

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server():
    with running_server(tiny_engine(), model_id="tiny") as (url, state):
        yield url, state


def chat(url, **kw):
    return httpx.post(f"{url}/v1/chat/completions", json={"messages": HI, "max_tokens": 2}, timeout=TIMEOUT, **kw)


@pytest.mark.parametrize("headers,why", [
    ({"Host": "attacker.example:8080"}, "addressed to host 'attacker.example:8080'"),  # DNS rebinding
    ({"Origin": "https://attacker.example"}, "from a web page of 'https://attacker.example'"),
    ({"Origin": "null"}, "from a web page of 'null'"),  # a sandboxed frame or a file: page
])
def test_requests_not_addressed_to_this_machine_are_refused(server, headers, why):
    for r in (chat(server[0], headers=headers), httpx.get(f"{server[0]}/v1/models", headers=headers)):
        assert r.status_code == 403 and why in r.json()["error"]["message"]
        assert r.json()["error"]["code"] == "forbidden_host"
    anthropic = httpx.post(f"{server[0]}/v1/messages", headers=headers, timeout=TIMEOUT,
                           json={"model": "tiny", "max_tokens": 2, "messages": HI})
    assert anthropic.status_code == 403 and anthropic.json()["type"] == "error"  # Anthropic's shape on its route
    assert anthropic.json()["error"]["type"] == "permission_error" and why in anthropic.json()["error"]["message"]
    # a preflight too: the check comes before CORS, so such a page is never told what it may send
    preflight = httpx.options(f"{server[0]}/v1/chat/completions", timeout=TIMEOUT,
                              headers={**headers, "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 403 and why in preflight.json()["error"]["message"]
    assert not any(k.lower().startswith("access-control-") for k in preflight.headers)


def test_refusals_are_counted_in_the_metrics(server):
    def refused():
        return scrape_metrics(server[0]).get('mlxspec_errors_total{status="403"}', 0)

    before = refused()
    assert httpx.get(f"{server[0]}/v1/models", headers={"Origin": "https://x.example"}, timeout=TIMEOUT).status_code == 403
    assert refused() == before + 1


@pytest.mark.parametrize("headers", [{}, {"Origin": "http://localhost:3000"}, {"Host": "localhost:1"},
                                     {"Origin": "http://127.0.0.1:5173"}, {"Host": "[::1]:8080"}])
def test_this_machine_s_clients_and_pages_are_served(server, headers):
    assert chat(server[0], headers=headers).status_code == 200


def test_loopback_names():
    assert all(map(is_loopback, ["localhost", "127.0.0.1", "127.3.2.1", "::1", "[::1]", "app.localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "192.168.1.5", "localhost.example", "attacker.example", ""]))


def test_model_names_are_logged_short_and_remembered_only_so_many(server, caplog):
    url, srv = server
    state = srv.mlxspec
    with caplog.at_level(logging.INFO, logger="mlxspec.serve"):
        for i in range(40):
            r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 1, "model": f"m{i}" + "x" * 5000},
                           timeout=TIMEOUT)
            assert r.status_code == 200
    assert len(state._other_names) == 32
    assert all(len(rec.getMessage()) < 300 for rec in caplog.records)


def test_a_wrong_method_or_path_has_an_error_code_and_says_what_is_served(server):
    from mlxspec.serve.app import ROUTES_HELP

    r = httpx.get(f"{server[0]}/v1/chat/completions", timeout=TIMEOUT)
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert r.json()["error"]["message"] == \
        f"GET is not allowed on /v1/chat/completions; this server answers {ROUTES_HELP}"
    assert r.headers["allow"] == "POST"  # (Starlette's header, kept)
    r = httpx.get(f"{server[0]}/v1/nothing", timeout=TIMEOUT)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert r.json()["error"]["message"] == f"no route /v1/nothing; this server answers {ROUTES_HELP}"


def test_a_huge_bad_value_is_not_echoed_whole(server):
    r = httpx.post(f"{server[0]}/v1/chat/completions", json={"messages": HI, "max_tokens": "9" * 100000},
                   timeout=TIMEOUT)
    assert r.status_code == 400 and len(r.json()["error"]["message"]) < 300
    body = '{"messages": [{"role": "user", "content": "hi"}], "stop": ["ok", "\\ud800"]}'  # JSON's escape
    r = httpx.post(f"{server[0]}/v1/chat/completions", content=body, timeout=TIMEOUT,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "stop string 1 is not valid Unicode" in r.json()["error"]["message"]


def test_the_host_check_comes_before_cors_even_for_an_allowed_page():
    # A page let in with --allow-origin, but a request addressed to another host (a rebound name):
    # refused before CORS could answer its preflight
    with running_server(tiny_engine(), model_id="tiny", allow_origins=("https://app.example",)) as (url, _):
        headers = {"Host": "attacker.example:8080", "Origin": "https://app.example",
                   "Access-Control-Request-Method": "POST"}
        r = httpx.options(f"{url}/v1/chat/completions", headers=headers, timeout=TIMEOUT)
        ok = httpx.options(f"{url}/v1/chat/completions", headers={**headers, "Host": "127.0.0.1"}, timeout=TIMEOUT)
    assert r.status_code == 403 and "addressed to host 'attacker.example:8080'" in r.json()["error"]["message"]
    assert ok.headers["access-control-allow-origin"] == "https://app.example"  # the page itself is let in

"""GET /metrics: Prometheus' text format, its counters the sums of what the answers said."""

import logging

import httpx

from serve_helpers import TIMEOUT, running_server, scrape_metrics, sse_events, tiny_engine

ASK = [{"role": "user", "content": "Tell me about rivers and the sea."}]


def test_the_counters_add_up_what_the_answers_said(caplog):
    caplog.set_level(logging.INFO, logger="mlxspec.serve")
    with running_server(tiny_engine(drafter="ngram"), model_id="t") as (url, _):
        before = scrape_metrics(url)
        assert before["mlxspec_requests_total{endpoint=\"chat\"}"] == 0
        assert before['mlxspec_info{model="t",drafter="ngram"}'] == 1
        # (a fixed num_draft: something is drafted whatever the cost model makes of this machine's timings)
        answers = [httpx.post(f"{url}/v1/chat/completions", json={"messages": ASK, "max_tokens": 24, "n": 2,
                                                                  "num_draft": 3}, timeout=TIMEOUT).json(),
                   httpx.post(f"{url}/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 16},
                              timeout=TIMEOUT).json()]
        body = {"messages": ASK, "max_tokens": 12, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT) as r:
            answers.append(sse_events(r)[-2])
        # a prompt only scored (echo, max_tokens 0): no token returned, so no generation reported or counted
        answers.append(httpx.post(f"{url}/v1/completions", json={"prompt": "The sea", "max_tokens": 0, "echo": True,
                                                                  "logprobs": 0}, timeout=TIMEOUT).json())
        scored = answers[-1]["mlxspec"]
        assert answers[-1]["usage"]["completion_tokens"] == 0
        assert scored["target_passes"] == scored["tokens_per_second"] == scored["tokens_per_target_pass"] == 0
        assert scored["seconds"] == scored["first_token_seconds"] == 0 and scored["prompt_seconds"] > 0
        assert httpx.post(f"{url}/v1/completions", json={"prompt": ""}, timeout=TIMEOUT).status_code == 400
        assert httpx.get(f"{url}/v1/nothing", timeout=TIMEOUT).status_code == 404
        m = scrape_metrics(url)
    assert m['mlxspec_requests_total{endpoint="chat"}'] == 2 and m['mlxspec_requests_total{endpoint="completion"}'] == 2
    for key, total in (("prompt_tokens", "prompt_tokens"), ("generation_tokens", "completion_tokens")):
        assert m[f"mlxspec_{key}_total"] == sum(a["usage"][total] for a in answers)
    # the log says the prompt as usage counts it: once, not once per choice
    first = answers[0]["usage"]
    said = f"2 choices, {first['prompt_tokens']} prompt tokens ({first['prompt_tokens_details']['cached_tokens']} cached)"
    assert any(said in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert not any("1 choices" in r.getMessage() for r in caplog.records)  # a single answer's log names none
    figures = [a["mlxspec"] for a in answers]
    assert m["mlxspec_drafted_tokens_total"] == sum(f["drafted"] for f in figures) > 0
    assert m["mlxspec_accepted_tokens_total"] == sum(f["accepted"] for f in figures)
    assert m["mlxspec_target_passes_total"] == sum(f["target_passes"] for f in figures)
    assert m["mlxspec_generations_total"] == 4 == m["mlxspec_time_to_first_token_seconds_count"]
    assert m['mlxspec_time_to_first_token_seconds_bucket{le="+Inf"}'] == 4
    buckets = [v for k, v in m.items() if k.startswith("mlxspec_time_to_first_token_seconds_bucket")]
    assert buckets == sorted(buckets)  # cumulative
    assert m['mlxspec_errors_total{status="400"}'] == 1 and m['mlxspec_errors_total{status="404"}'] == 1
    assert m["mlxspec_requests_running"] == 0 and m["mlxspec_queue_limit"] == 16
    assert m["mlxspec_requests_cancelled_total"] == 0  # the stream was read to its end


def test_metrics_need_the_api_key_when_one_is_set():
    with running_server(tiny_engine(), model_id="t", api_key="k") as (url, _):
        assert httpx.get(f"{url}/metrics", timeout=TIMEOUT).status_code == 401
        assert httpx.get(f"{url}/v1/models", timeout=TIMEOUT).status_code == 401
        m = scrape_metrics(url, {"Authorization": "Bearer k"})
    assert m['mlxspec_errors_total{status="401"}'] == 2  # refused by the middleware, counted all the same

"""GET /metrics: Prometheus' text format, its counters the sums of what the answers said."""

import logging
import types

import httpx
import pytest

from mlxspec.serve.metrics import TTFT_BUCKETS, Metrics
from mlxspec.stats import GenerationStats
from serve_helpers import (TIMEOUT, parse_metrics, running_server, scrape_metrics, sse_events, tiny_engine,
                           usage_body)

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


def test_the_rendered_sums_histogram_and_gauges_are_what_was_recorded():
    m = Metrics('my "model"\\ v2\n', None)
    ttfts = [0.01, TTFT_BUCKETS[1], TTFT_BUCKETS[1] - 0.01, 2 * TTFT_BUCKETS[-1]]  # one on a bound, one past all
    runs = [GenerationStats(tokens=5, drafted=4 + i, accepted=2 + i, rounds=3 + i, tree_rounds=i, lookup_rounds=2 * i,
                            prompt_seconds=0.5 + i, seconds=1.25 + i, first_token_seconds=t)
            for i, t in enumerate(ttfts)]
    m.answered("chat", usage_body(10, 4, 20), runs[:3])
    scored = GenerationStats(prompt_seconds=0.25)  # a prompt only scored
    m.answered("completion", usage_body(7, 0, 5), runs[3:] + [scored])
    m.embedded(9)
    m.embedded(3)
    parked = types.SimpleNamespace(parked=[1, 2], nbytes=4096, evicted=3)
    s = parse_metrics(m.render(running=True, waiting=2, limit=5, prompt_cache=parked))
    assert s['mlxspec_info{model="my \\"model\\"\\\\ v2\\n",drafter="none"}'] == 1  # escaped as Prometheus says
    assert [s[f'mlxspec_requests_total{{endpoint="{e}"}}'] for e in ("chat", "completion", "embeddings")] == [1, 1, 2]
    assert s['mlxspec_errors_total{status="400"}'] == 0  # a series from the start, so rates work
    want = {"prompt_tokens": 17, "cached_prompt_tokens": 4, "generation_tokens": 25, "embedding_tokens": 12,
            "drafted_tokens": 4 + 5 + 6 + 7, "accepted_tokens": 2 + 3 + 4 + 5, "target_passes": 3 + 4 + 5 + 6,
            "tree_rounds": 0 + 1 + 2 + 3, "lookup_rounds": 0 + 2 + 4 + 6, "generations": 4,
            "prompt_seconds": 0.5 + 1.5 + 2.5 + 3.5 + 0.25, "generation_seconds": 1.25 + 2.25 + 3.25 + 4.25}
    assert {k: s[f"mlxspec_{k}_total"] for k in want} == pytest.approx(want)
    below = [sum(t <= bound for t in ttfts) for bound in TTFT_BUCKETS]  # cumulative: le, "less or equal"
    assert [s[f'mlxspec_time_to_first_token_seconds_bucket{{le="{b!r}"}}'] for b in TTFT_BUCKETS] == below
    assert s['mlxspec_time_to_first_token_seconds_bucket{le="+Inf"}'] == 4 == \
        s["mlxspec_time_to_first_token_seconds_count"]
    assert s["mlxspec_time_to_first_token_seconds_sum"] == pytest.approx(sum(ttfts))
    assert (s["mlxspec_requests_running"], s["mlxspec_requests_waiting"], s["mlxspec_queue_limit"]) == (1, 2, 5)
    assert (s["mlxspec_prompt_cache_parked"], s["mlxspec_prompt_cache_bytes"],
            s["mlxspec_prompt_cache_evictions_total"]) == (2, 4096, 3)
    m.errors[429] += 2
    s = parse_metrics(m.render(running=False, waiting=0, limit=5))
    assert s['mlxspec_errors_total{status="429"}'] == 2 and 'mlxspec_errors_total{status="400"}' not in s
    assert s["mlxspec_requests_running"] == 0 and not any(k.startswith("mlxspec_prompt_cache") for k in s)

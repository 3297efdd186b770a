"""llama.cpp's POST /completion (Continue's and SillyTavern's llama.cpp providers): a prompt, as text
or token ids, answered as plain decoding answers it, in llama.cpp's shape, whole or streamed; its
json_schema, limits and errors."""

import json

import httpx
import pytest

from serve_helpers import TIMEOUT, running_server, sse_events, tiny_engine
from test_grammar import MOOD

PROMPT = "Rivers run to the sea because"


@pytest.fixture(scope="module")
def served():
    with running_server(tiny_engine(drafter="ngram"), model_id="t") as (url, _):
        yield url, tiny_engine()


def post(url, **body):
    return httpx.post(f"{url}/completion", json=body, timeout=TIMEOUT)


def test_a_prompt_is_answered_as_plain_decoding_answers_it(served):
    url, ref = served
    want = ref.generate(PROMPT, max_tokens=24, speculative=False)
    r = post(url, prompt=PROMPT, n_predict=24).json()
    assert r["content"] == want.text and r["stop"] and r["tokens_predicted"] == want.stats.tokens
    assert r["tokens_evaluated"] == want.stats.prompt_tokens and r["model"] == "t"
    assert r["stop_type"] == {"length": "limit", "stop": "eos"}[want.finish_reason]
    assert r["timings"]["predicted_n"] == want.stats.tokens and "mlxspec" in r
    ids = ref.tokenizer.encode(PROMPT)
    assert post(url, prompt=ids, n_predict=24).json()["content"] == want.text  # token ids: the same prompt
    with httpx.stream("POST", f"{url}/completion", json={"prompt": PROMPT, "n_predict": 24, "stream": True},
                      timeout=TIMEOUT) as s:
        events = sse_events(s)
    assert "".join(e["content"] for e in events) == want.text
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    sampled = post(url, prompt=PROMPT, n_predict=16, temperature=0.9, seed=7, top_k=40).json()
    assert sampled["content"] == ref.generate(PROMPT, max_tokens=16, temperature=0.9, seed=7, top_k=40).text
    picked = post(url, prompt=PROMPT, n_predict=4, response_fields=["content", "timings/predicted_n"]).json()
    assert set(picked) == {"content", "timings/predicted_n"} and picked["timings/predicted_n"] == 4


def test_a_json_schema_is_followed_and_time_ends_the_answer_at_a_line(served):
    url, ref = served
    schema = MOOD["json_schema"]["schema"]
    r = post(url, prompt="The weather today:", n_predict=40, json_schema=schema).json()
    mood = json.loads(r["content"])
    assert set(mood) == {"ok", "mood"} and mood["mood"] in ("calm", "stormy", "grey")
    assert r["content"] == ref.generate("The weather today:", max_tokens=40, response_format=MOOD).text
    whole = ref.generate(PROMPT, max_tokens=120, speculative=False, logit_bias={3 + 10: 4.0}).text  # lines
    assert "\n" in whole
    # (llama.cpp's logit_bias: pairs, or an object; false bans a token)
    assert post(url, prompt=PROMPT, n_predict=120, logit_bias={"13": 4.0}).json()["content"] == whole
    first = whole.encode()[0] + 3  # the answer's first token (the byte tokenizer's ids follow 3 specials)
    banned = post(url, prompt=PROMPT, n_predict=120, logit_bias=[[13, 4.0], [first, False]]).json()["content"]
    assert banned != whole and banned == ref.generate(PROMPT, max_tokens=120, logit_bias={13: 4.0, first: -100}).text
    r = post(url, prompt=PROMPT, n_predict=120, logit_bias=[[13, 4.0]], t_max_predict_ms=1e-6).json()
    assert (r["content"], r["stop_type"]) == (whole[: whole.index("\n") + 1], "limit")


@pytest.mark.parametrize("body, param, says", [
    ({"prompt": ["two", "prompts"]}, "prompt", "one prompt per request"),
    ({"prompt": ""}, "prompt", "prompt must be a non-empty string"),
    ({"n_predict": 8}, "prompt", "prompt must be"),
    ({"prompt": PROMPT, "grammar": "root ::= \"yes\""}, "grammar", "send json_schema instead"),
    ({"prompt": PROMPT, "json_schema": "an object"}, "json_schema", "json_schema"),
    ({"prompt": PROMPT, "n_predict": -5}, "n_predict", "n_predict must be an integer >= -1"),
    ({"prompt": PROMPT, "n_indent": "4"}, "n_indent", "n_indent must be an integer"),
    ({"prompt": PROMPT, "max_tokens": 4}, "max_tokens", "send n_predict instead"),
    ({"prompt": PROMPT, "logit_bias": [["Hello", 1.0]]}, "logit_bias", "tokens are named by id here"),
    ({"prompt": PROMPT, "logit_bias": {"13": 500}}, "logit_bias", "logit_bias"),
])
def test_bad_requests_are_refused_naming_the_field(served, body, param, says):
    url, _ = served
    r = post(url, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"], error


def test_props_say_the_context_the_slots_and_the_template(served):
    url, ref = served
    p = httpx.get(f"{url}/props", timeout=TIMEOUT).json()
    settings = p["default_generation_settings"]
    assert settings["n_ctx"] == ref.context and p["total_slots"] == 1 and not settings["is_processing"]
    assert settings["params"]["n_predict"] == 512 and settings["params"]["temperature"] == 0.0  # the server's defaults
    assert p["chat_template"] == ref.tokenizer.chat_template and p["model_alias"] == "t"
    assert p["modalities"] == {"vision": False, "audio": False} and p["build_info"].startswith("mlxspec ")

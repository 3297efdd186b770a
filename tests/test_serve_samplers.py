"""Typical-p and XTC through every API that names them: OpenAI-style chat and completions (mlx-lm's
server's and TGI's fields), llama.cpp's /completion (SillyTavern's) and Ollama's options
(typical_p). Each answer is the engine's own for those settings, and differs from the answer
without them, so the field was read; bad values are a 400 naming the field."""

import httpx
import pytest

from serve_helpers import TIMEOUT, running_server, tiny_engine

ASK = [{"role": "user", "content": "Tell me about rivers"}]
PROMPT = "Rivers run to the sea because"
SAMPLED = {"temperature": 0.5, "seed": 3}
FILTERS = [{"typical_p": 0.4}, {"xtc_probability": 1.0, "xtc_threshold": 0.02}, {"top_n_sigma": 0.5},
           {"typical_p": 0.8, "xtc_probability": 0.5, "xtc_threshold": 0.02}]


@pytest.fixture(scope="module")
def served():
    with running_server(tiny_engine(drafter="ngram"), model_id="t") as (url, _):
        yield url, tiny_engine()


def post(url, path, body):
    return httpx.post(f"{url}{path}", json=body, timeout=TIMEOUT)


@pytest.mark.parametrize("filters", FILTERS)
def test_openai_routes_sample_with_them(served, filters):
    url, ref = served
    want = ref.generate(ASK, max_tokens=24, **SAMPLED, **filters).text
    assert want != ref.generate(ASK, max_tokens=24, **SAMPLED).text  # the filters change this answer
    r = post(url, "/v1/chat/completions", {"messages": ASK, "max_tokens": 24, **SAMPLED, **filters})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == want
    r = post(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 24, **SAMPLED, **filters})
    assert r.json()["choices"][0]["text"] == ref.generate(PROMPT, max_tokens=24, **SAMPLED, **filters).text


@pytest.mark.parametrize("filters", FILTERS)
def test_llama_cpp_s_completion_samples_with_them(served, filters):
    url, ref = served
    want = ref.generate(PROMPT, max_tokens=24, **SAMPLED, **filters).text
    assert want != ref.generate(PROMPT, max_tokens=24, **SAMPLED).text
    r = post(url, "/completion", {"prompt": PROMPT, "n_predict": 24, **SAMPLED, **filters})
    assert r.status_code == 200, r.text
    assert r.json()["content"] == want


def test_props_say_their_defaults_and_ollama_s_typical_p_is_read(served):
    url, ref = served
    params = httpx.get(f"{url}/props", timeout=TIMEOUT).json()["default_generation_settings"]["params"]
    assert (params["typical_p"], params["xtc_probability"], params["xtc_threshold"]) == (1.0, 0.0, 0.1)
    r = post(url, "/api/chat", {"model": "t", "messages": ASK, "stream": False,
                                "options": {"num_predict": 24, "temperature": 0.5, "seed": 3, "typical_p": 0.4}})
    assert r.status_code == 200, r.text
    assert r.json()["message"]["content"] == ref.generate(ASK, max_tokens=24, **SAMPLED, typical_p=0.4).text


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": 2}),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2}),
    ("/completion", {"prompt": PROMPT, "n_predict": 2}),
])
@pytest.mark.parametrize("field,value,says", [
    ("typical_p", 0, "(0, 1]"), ("typical_p", "high", "(0, 1]"), ("xtc_probability", 1.5, "[0, 1]"),
    ("xtc_threshold", 0.7, "[0, 0.5]"), ("xtc_threshold", -1, "[0, 0.5]"), ("top_n_sigma", "wide", "finite number"),
])
def test_bad_values_are_a_400_naming_the_field(served, path, body, field, value, says):
    r = post(served[0], path, {**body, field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and says in err["message"] and field in err["message"]


DRY = {"dry_multiplier": 2.0, "dry_allowed_length": 1, "dry_sequence_breakers": ["\n"]}
REPEATS = "ab ab ab ab ab ab ab ab"


def test_dry_is_read_by_the_openai_routes_and_llama_cpp_s(served):
    url, ref = served
    want = ref.generate(REPEATS, max_tokens=24, **DRY).text
    assert want != ref.generate(REPEATS, max_tokens=24).text  # DRY changes this answer
    r = post(url, "/v1/completions", {"prompt": REPEATS, "max_tokens": 24, **DRY})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == want
    # text-generation-webui's and TabbyAPI's breakers: one string
    r = post(url, "/completion", {"prompt": REPEATS, "n_predict": 24, **DRY, "dry_sequence_breakers": '"\\n"'})
    assert r.json()["content"] == want
    chat = ref.generate(ASK, max_tokens=24, **SAMPLED, **DRY).text
    r = post(url, "/v1/chat/completions", {"messages": ASK, "max_tokens": 24, **SAMPLED, **DRY})
    assert r.json()["choices"][0]["message"]["content"] == chat
    params = httpx.get(f"{url}/props", timeout=TIMEOUT).json()["default_generation_settings"]["params"]
    assert params["dry_multiplier"] == 0.0 and params["dry_sequence_breakers"] == ["\n", ":", "\"", "*"]


@pytest.mark.parametrize("field,value,says", [
    ("dry_multiplier", -1, ">= 0"), ("dry_base", 0.5, ">= 1"), ("dry_allowed_length", 0, ">= 1"),
    ("dry_penalty_last_n", -5, ">= -1"), ("dry_sequence_breakers", [1], "strings"),
])
def test_bad_dry_settings_are_a_400_naming_the_field(served, field, value, says):
    for path, body in (("/v1/chat/completions", {"messages": ASK, "max_tokens": 2}),
                       ("/completion", {"prompt": PROMPT, "n_predict": 2})):
        r = post(served[0], path, {**body, "dry_multiplier": 0.8, field: value})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == field and says in err["message"]


MIROSTAT = {"mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2}


def test_mirostat_is_read_by_ollama_s_options_llama_cpp_s_and_the_openai_routes(served):
    url, ref = served
    want = ref.generate(ASK, max_tokens=24, **SAMPLED, **MIROSTAT).text
    assert want != ref.generate(ASK, max_tokens=24, **SAMPLED).text  # mirostat changes this answer
    r = post(url, "/api/chat", {"model": "t", "messages": ASK, "stream": False,
                                "options": {"num_predict": 24, "temperature": 0.5, "seed": 3, **MIROSTAT}})
    assert r.status_code == 200, r.text
    assert r.json()["message"]["content"] == want
    r = post(url, "/v1/chat/completions", {"messages": ASK, "max_tokens": 24, **SAMPLED, **MIROSTAT})
    assert r.json()["choices"][0]["message"]["content"] == want
    r = post(url, "/completion", {"prompt": PROMPT, "n_predict": 24, **SAMPLED, "mirostat": 1})
    assert r.json()["content"] == ref.generate(PROMPT, max_tokens=24, **SAMPLED, mirostat=1).text
    params = httpx.get(f"{url}/props", timeout=TIMEOUT).json()["default_generation_settings"]["params"]
    assert (params["mirostat"], params["mirostat_tau"], params["mirostat_eta"]) == (0, 5.0, 0.1)


@pytest.mark.parametrize("field,value,says", [
    ("mirostat", 3, "0 (off), 1 or 2"), ("mirostat_tau", -1, ">= 0"), ("mirostat_eta", "fast", ">= 0"),
])
def test_bad_mirostat_settings_are_a_400_naming_the_field(served, field, value, says):
    for path, body in (("/v1/chat/completions", {"messages": ASK, "max_tokens": 2}),
                       ("/completion", {"prompt": PROMPT, "n_predict": 2})):
        r = post(served[0], path, {**body, field: value})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == field and says in err["message"]
    r = post(served[0], "/api/chat", {"model": "t", "messages": ASK, "stream": False, "options": {field: value}})
    assert r.status_code == 400 and says in r.text


def test_the_openai_client_sends_them_in_extra_body_whole_and_streamed(served):
    from serve_helpers import openai_client

    url, ref = served
    extra = {"xtc_probability": 0.5, "xtc_threshold": 0.02, "typical_p": 0.8, **DRY}
    want = ref.generate(ASK, max_tokens=24, **SAMPLED, **extra).text
    client = openai_client(url)
    r = client.chat.completions.create(model="t", messages=ASK, max_tokens=24, temperature=0.5, seed=3,
                                       extra_body=extra)
    assert r.choices[0].message.content == want
    chunks = client.chat.completions.create(model="t", messages=ASK, max_tokens=24, temperature=0.5, seed=3,
                                            stream=True, extra_body={**MIROSTAT, "mirostat_tau": 2.0})
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.generate(ASK, max_tokens=24, **SAMPLED, **{**MIROSTAT, "mirostat_tau": 2.0}).text

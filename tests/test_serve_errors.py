"""Bad input never crashes or hangs the server: every refusal is an OpenAI error object with a status."""

import json
import logging

import httpx
import pytest

from mlxspec.serve.errors import APIError
from mlxspec.serve.schema import MAX_CHOICES, MAX_STOP, parse_chat, parse_completion
from serve_helpers import (TIMEOUT, GatedEngine, iter_sse, openai_client, poisonable_engine, running_server,
                           scrape_metrics)

HI = [{"role": "user", "content": "hi"}]
LIMIT = 64 * 1024  # --max-body-size of the test server


@pytest.fixture(scope="module")
def server():
    engine = poisonable_engine()
    with running_server(engine, model_id="tiny", max_body_size=LIMIT) as (url, _):
        yield url, engine


def post(url, path, body=None, *, content=None, headers=None):
    return httpx.post(f"{url}{path}", json=body, content=content, headers=headers, timeout=TIMEOUT)


def assert_error(r, status, *, param=None, code=None, says=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and "Traceback" not in err["message"]
    assert err["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    if says is not None:
        assert says in err["message"]
    return err


CHAT_CASES = [
    ({"messages": HI, "temperature": "hot"}, "temperature", "finite number"),
    ({"messages": HI, "temperature": -1}, "temperature", ">= 0"),
    ({"messages": HI, "temperature": True}, "temperature", "number"),
    ({"messages": HI, "temperature": 2.5}, "temperature", "in 0..2"),  # OpenAI's range
    ({"messages": HI, "top_p": 0}, "top_p", "(0, 1]"),
    ({"messages": HI, "top_k": 1.5}, "top_k", "integer"),
    ({"messages": HI, "top_k": -2}, "top_k", "top_k must be an integer >= 0, or -1 for off"),  # -1: vLLM's off
    ({"messages": HI, "min_p": 1}, "min_p", "[0, 1)"),
    ({"messages": HI, "temperature": 10**400}, "temperature", "finite number"),  # past float's range
    ({"messages": HI, "top_p": -(10**400)}, "top_p", "(0, 1]"),
    ({"messages": HI, "max_tokens": 0}, "max_tokens", ">= 1"),
    ({"messages": HI, "max_tokens": "10"}, "max_tokens", "integer"),
    ({"messages": HI, "max_completion_tokens": -5}, "max_completion_tokens",
     "max_completion_tokens must be an integer >= 1"),
    ({"messages": HI, "max_tokens": -5, "max_completion_tokens": 3}, "max_tokens",  # not passed over
     "max_tokens must be an integer >= 1"),
    ({"messages": HI, "max_tokens": 5, "max_completion_tokens": 3}, "max_tokens",  # neither wins silently
     "max_tokens (5) and max_completion_tokens (3) disagree"),
    ({"messages": HI, "seed": -1}, "seed", ">= 0"),
    ({"messages": HI, "seed": "abc"}, "seed", "integer"),
    ({"messages": HI, "seed": 2**64}, "seed", "2**64"),
    ({"messages": HI, "stream": "yes"}, "stream", "true or false"),
    ({"messages": HI, "stream": True, "stream_options": []}, "stream_options", "object"),
    ({"messages": HI, "stream_options": {"include_usage": True}}, "stream_options", "only allowed when stream is true"),
    ({"messages": HI, "stop": 5}, "stop", "string or a list of strings"),
    ({"messages": HI, "stop": ["ok", 1]}, "stop", "string or a list of strings"),
    ({"messages": HI, "stop": [str(i) for i in range(17)]}, "stop", "at most 16"),
    ({"messages": HI, "stop": ["ok", ""]}, "stop", "stop string 1 is empty"),
    ({"messages": HI, "speculative": "no"}, "speculative", "true or false"),
    ({"messages": HI, "num_draft": 99}, "num_draft", "[0, 32]"),
    ({"messages": HI, "model": 5}, "model", "string"),
    ({}, "messages", "required"),
    ({"messages": "hi"}, "messages", "list"),
    ({"messages": []}, "messages", "empty"),
    ({"messages": ["hi"]}, "messages[0]", "object"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", "system, user, assistant"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role", "got None"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "string"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "string"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]", "only text"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "messages[0].content[0].text", "messages[0].content[0].text must be a string, got 5"),
    ({"messages": [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]},
     "messages[0].content[0]", "only text"),  # the assistant's only
    ({"messages": [{"role": "assistant", "content": [{"type": "refusal", "refusal": None}]}]},
     "messages[0].content[0].refusal", "must be a string"),
    # tools: checked here; this model's template does not show them, which the engine finds
    ({"messages": HI, "tools": [{"type": "retrieval"}]}, "tools", "only function tools"),
    ({"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "does not render tools"),
    ({"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}, "tools",
     "does not render tools"),  # said before what a forced call would need
    ({"messages": HI, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
    ({"messages": HI, "logprobs": 1}, "logprobs", "true or false"),
    ({"messages": HI, "top_logprobs": 2}, "top_logprobs", "needs \"logprobs\": true"),
    ({"messages": HI, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "0..20"),
    ({"messages": HI, "logprobs": True, "top_logprobs": -1}, "top_logprobs", "0..20"),
    ({"messages": [{"role": "tool", "content": "42"}]}, "messages[0].tool_call_id", "id of the call"),
    ({"messages": [{"role": "user", "content": "a", "tool_calls": []}]}, "messages[0].tool_calls", "only assistant"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f",
                                                                                        "arguments": "{x"}}]}]},
     "messages[0].tool_calls[0].function.arguments", "must be JSON"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]}]},
     "messages[0].tool_calls[0]", "\"function\""),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f",
                                                                                        "arguments": "[1, 2]"}}]}]},
     "messages[0].tool_calls[0].function.arguments", "a JSON object"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"type": "custom", "function": {
        "name": "f", "arguments": "{}"}}]}]}, "messages[0].tool_calls[0].type", "must be \"function\""),
    ({"messages": HI, "tool_choice": "sometimes"}, "tool_choice", "must be \"auto\""),
    ({"messages": HI, "tool_choice": "required"}, "tool_choice", "needs tools to call"),
    ({"messages": HI, "logit_bias": {"abc": 1}}, "logit_bias", "token ids (integers >= 0)"),
    ({"messages": HI, "logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
    ({"messages": HI, "logit_bias": {"999999": 5}}, "logit_bias", "in [0, 259)"),  # the engine's vocabulary
    ({"messages": HI, "logit_bias": [5]}, "logit_bias", "must be an object"),
    ({"messages": HI, "presence_penalty": 2.5}, "presence_penalty", "in [-2, 2]"),
    ({"messages": HI, "frequency_penalty": "lots"}, "frequency_penalty", "in [-2, 2]"),
    ({"messages": HI, "repetition_penalty": -1}, "repetition_penalty", "number > 0"),
    ({"messages": HI, "repetition_penalty": 1.2, "repetition_context_size": 0}, "repetition_context_size",
     "repetition_context_size must be an integer >= 1"),
    ({"messages": HI, "repeat_penalty": 1.1}, "repeat_penalty", "not supported"),
    ({"messages": HI, "ignore_eos": 0}, "ignore_eos", "true or false"),
    ({"messages": HI, "stop_token_ids": [13, 9999]}, "stop_token_ids", "in [0, 259)"),
    ({"messages": HI, "min_tokens": 50, "max_tokens": 10}, "min_tokens", "[0, max_tokens = 10]"),
    ({"messages": HI, "chat_template_kwargs": "think"}, "chat_template_kwargs", "object of template variables"),
    ({"messages": HI, "chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs",
     "may not set add_generation_prompt"),
    ({"messages": HI, "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice", "needs tools"),
    # structured output: the shape and the grammar (parsed by llguidance) here, before the queue
    ({"messages": HI, "response_format": {"type": "xml"}}, "response_format", "json_object, json_schema"),
    ({"messages": HI, "response_format": "json"}, "response_format", "an object with a \"type\""),
    ({"messages": HI, "response_format": {"type": "json_schema"}}, "response_format", "json_schema must be an object"),
    ({"messages": HI, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "objectt"}}}}, "response_format", "refused"),
    ({"messages": HI, "guided_regex": "(("}, "guided_regex", "guided_regex was refused: "),  # parsed up front
    ({"messages": HI, "guided_json": {"type": "objectt"}}, "guided_json", "guided_json was refused: "),
    ({"messages": HI, "guided_choice": []}, "guided_choice", "non-empty list"),
    ({"messages": HI, "guided_json": "{nope"}, "guided_json", "JSON schema"),
    ({"messages": HI, "response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex",
     "send one of"),
]
UNSUPPORTED = [
    ({"messages": HI, "n": 2, "best_of": 3}, "best_of"),
    ({"messages": HI, "functions": [{"name": "f"}]}, "functions"),
    ({"messages": HI, "function_call": "auto"}, "function_call"),
    ({"messages": [{"role": "function", "content": "42", "name": "f"}]}, "messages[0]"),
    # other servers' sampling fields change the answer: told, not silently ignored
    ({"messages": HI, "tfs_z": 0.5}, "tfs_z"),
    ({"messages": HI, "guided_grammar": "root ::= \"a\""}, "guided_grammar"),
    ({"messages": HI, "grammar": "root ::= \"a\""}, "grammar"),
    ({"messages": HI, "modalities": ["text", "audio"]}, "modalities"),
    # mlx-lm's server's and vLLM's
    ({"messages": HI, "use_beam_search": True}, "use_beam_search"),
    ({"messages": HI, "adapters": "my-lora"}, "adapters"),
    ({"messages": HI, "role_mapping": {"user": "Q:"}}, "role_mapping"),
    ({"messages": HI, "num_draft_tokens": 3}, "num_draft_tokens"),
    ({"messages": HI, "draft_model": "mlx-community/x"}, "draft_model"),
    ({"messages": HI, "add_generation_prompt": False}, "add_generation_prompt"),
]


def test_request_bodies_are_checked_off_the_event_loop(server, monkeypatch):
    """A format's grammar takes llguidance tens of milliseconds to read: never on the event loop,
    where it would stall every other client's stream, on any route that takes one."""
    import asyncio

    from mlxspec.serve import schema

    checked_on_loop = []

    def check(fmt, *flag):
        try:
            asyncio.get_running_loop()
            checked_on_loop.append(True)
        except RuntimeError:
            checked_on_loop.append(False)
        return real(fmt, *flag)

    real = schema.check_response_format
    monkeypatch.setattr(schema, "check_response_format", check)
    url = server[0]
    regex = {"type": "regex", "regex": "ab+"}
    for path, body in (("/v1/chat/completions", {"messages": HI, "max_tokens": 2, "response_format": regex}),
                       ("/v1/completions", {"prompt": "x", "max_tokens": 2, "response_format": regex}),
                       ("/v1/responses", {"input": "hi", "max_output_tokens": 2,
                                          "text": {"format": {"type": "json_object"}}}),
                       ("/v1/messages", {"messages": HI, "max_tokens": 2}),
                       ("/v1/messages/count_tokens", {"messages": HI})):
        r = post(url, path, body)
        assert r.status_code == 200, (path, r.text)
    assert checked_on_loop == [False] * 5


def test_temperature_takes_openai_s_whole_range(server):
    r = post(server[0], "/v1/chat/completions", {"messages": HI, "max_tokens": 2, "temperature": 2, "seed": 1})
    assert r.status_code == 200, r.text


def test_other_servers_fields_at_their_neutral_values_are_accepted(server):
    body = {"messages": HI, "max_tokens": 3, "repetition_penalty": 1, "typical_p": 1.0, "min_tokens": 0,
            "ignore_eos": False, "stop_token_ids": [], "modalities": ["text"], "guided_json": None,
            "xtc_probability": 0.0, "xtc_threshold": 0.1, "chat_template_kwargs": {}, "adapters": None,
            "num_draft_tokens": None, "repetition_context_size": 20, "top_k": -1,  # vLLM's top_k off
            "grammar": ""}  # llama.cpp's: no grammar (SillyTavern sends it)
    r = post(server[0], "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    body = {"messages": HI, "max_tokens": 3, "repetition_penalty": 0}  # mlx-lm's server's default: off
    r = post(server[0], "/v1/chat/completions", body)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("body,param,says", CHAT_CASES)
def test_bad_chat_fields_are_400_naming_the_field(server, body, param, says):
    assert_error(post(server[0], "/v1/chat/completions", body), 400, param=param, says=says)


@pytest.mark.parametrize("body,param", UNSUPPORTED)
def test_unsupported_features_are_400_saying_so(server, body, param):
    err = assert_error(post(server[0], "/v1/chat/completions", body), 400, param=param, code="unsupported_parameter")
    assert "not supported" in err["message"]
    if param == "grammar":  # what is allowed instead is said in the client's terms
        assert 'only null or ""' in err["message"], err


@pytest.mark.parametrize("body,param,says", [
    ({}, "prompt", "required"),
    ({"prompt": ""}, "prompt", "empty"),
    ({"prompt": ["a", ""]}, "prompt[1]", "empty"),
    ({"prompt": ["a", [1, "b"]]}, "prompt[1]", "string or list of token ids"),
    ({"prompt": [[]]}, "prompt[0]", "string or list of token ids"),
    ({"prompt": {"text": "a"}}, "prompt", "string or list of token ids"),
    ({"prompt": ["a"] * 40, "n": 4}, "n", "160 generations (40 prompts x n=4); at most 128"),
    ({"prompt": "a", "n": 0}, "n", "1..128"),
    ({"prompt": "a", "n": True}, "n", "1..128"),
    ({"prompt": "a", "n": 129}, "n", "1..128"),
    ({"prompt": "a", "echo": "yes"}, "echo", "true or false"),
    ({"prompt": "a", "max_tokens": 0}, "max_tokens", ">= 1"),
    ({"prompt": "a", "temperature": 100}, "temperature", "in 0..2"),
    ({"prompt": "a", "stream": False, "stream_options": {}}, "stream_options", "only allowed when stream is true"),
    ({"prompt": "a", "logprobs": 21}, "logprobs", "0..20"),
    ({"prompt": "a", "logprobs": True}, "logprobs", "0..20"),
    ({"prompt": "a", "suffix": "b"}, "suffix", "no fill-in-the-middle markers"),
    ({"prompt": [1, 2], "suffix": "b"}, "suffix", "needs a string prompt"),
    ({"prompt": "a", "n": 2, "best_of": 1}, "best_of", "integer in n..128"),
    ({"prompt": "a", "best_of": True}, "best_of", "integer in n..128"),
    ({"prompt": "a", "best_of": 3, "stream": True}, "best_of", "cannot be streamed"),
    ({"prompt": ["a"] * 20, "best_of": 7}, "best_of", "140 generations (20 prompts x best_of=7)"),
    ({"prompt": "a", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "chat endpoint"),
])
def test_bad_completion_fields_are_400(server, body, param, says):
    assert_error(post(server[0], "/v1/completions", body), 400, param=param, says=says)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a\ud800b"}]}, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
     "messages[0].content[0].text"),
    ("/v1/completions", {"prompt": "\ud800"}, "prompt"),
])
def test_lone_surrogates_are_400(server, path, body, param):
    # Valid JSON ("\ud800" escaped), but not text a tokenizer can encode: the client's fault, not
    # an engine failure (which would be a 500 and drop the engine's caches).
    r = post(server[0], path, content=json.dumps(body).encode("ascii"), headers={"content-type": "application/json"})
    assert_error(r, 400, param=param, says="not valid Unicode text")


def test_token_ids_outside_the_vocabulary_are_400(server):
    assert_error(post(server[0], "/v1/completions", {"prompt": [1, 2, 10**6]}), 400, says="outside the vocabulary",
                 param="prompt")


@pytest.mark.parametrize("content,says", [
    (b"{not json", "not valid JSON"),
    (b"", "empty"),
    (b"[1, 2]", "must be a JSON object, got a JSON array"),
    (b"null", "must be a JSON object, got a JSON null"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "NaN"),
    (b"\xff\xfe", "not valid JSON"),
    (b"[" * 20_000 + b"]" * 20_000, "too deeply"),
], ids=["broken", "empty", "array", "null", "NaN", "not-utf8", "deep"])
def test_malformed_bodies_are_400(server, content, says):
    r = post(server[0], "/v1/chat/completions", content=content, headers={"content-type": "application/json"})
    assert_error(r, 400, code="invalid_json", says=says)


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 5000}]}),
    ("/v1/completions", {"prompt": "x" * 5000}),
])
def test_prompt_past_the_context_is_400(server, path, body):
    assert_error(post(server[0], path, body), 400, code="context_length_exceeded", says="context is 4096")


def test_oversized_body_is_413(server):
    big = {"messages": [{"role": "user", "content": "x" * (2 * LIMIT)}]}
    assert_error(post(server[0], "/v1/chat/completions", big), 413, code="request_too_large", says=str(LIMIT))

    def chunked():  # no Content-Length: the limit holds while reading
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(2 * LIMIT // 1024):
            yield b"x" * 1024
        yield b'"}]}'

    assert_error(post(server[0], "/v1/chat/completions", content=chunked()), 413, code="request_too_large")


def test_a_body_of_exactly_the_limit_is_read(server):
    """The limit is inclusive, declared or streamed: LIMIT bytes are read (here a prompt past the
    tiny model's context, a 400), one byte more is a 413."""
    head, tail = b'{"messages": [{"role": "user", "content": "', b'"}]}'
    for size, status, code in ((LIMIT, 400, "context_length_exceeded"), (LIMIT + 1, 413, "request_too_large")):
        body = head + b"x" * (size - len(head) - len(tail)) + tail
        for content in (body, iter([body[:1024], body[1024:]])):  # with a Content-Length, then without
            r = post(server[0], "/v1/chat/completions", content=content)
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), size


@pytest.mark.parametrize("path,body,field,instead", [
    ("/v1/responses", {"input": "hi", "max_tokens": 5}, "max_tokens", "send max_output_tokens instead (got 5)"),
    ("/v1/responses", {"input": "hi", "max_completion_tokens": 5}, "max_completion_tokens", "max_output_tokens"),
    ("/v1/responses", {"input": "hi", "response_format": {"type": "json_object"}}, "response_format", "text.format"),
    ("/v1/responses", {"messages": HI}, "messages", "send input instead"),
    ("/v1/chat/completions", {"messages": HI, "max_output_tokens": 5}, "max_output_tokens", "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": HI, "instructions": "Be brief."}, "instructions", "role \"system\""),
    ("/v1/completions", {"prompt": "hi", "stop_sequences": ["x"]}, "stop_sequences", "send stop instead"),
    ("/v1/messages", {"messages": HI, "max_tokens": 5, "stop": ["x"]}, "stop", "send stop_sequences instead"),
    ("/v1/chat/completions", {"messages": HI, "system": "Be brief."}, "system", "role \"system\""),
    ("/v1/responses", {"input": "hi", "system": "Be brief."}, "system", "send instructions instead"),
])
def test_another_api_s_name_for_a_field_is_400_naming_this_route_s(server, path, body, field, instead):
    """Every route knows every API's field names, so these would otherwise be dropped unseen (a
    length limit the answer then ignores)."""
    r = post(server[0], path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"].startswith(f"{field} is not read at {path}: ") and instead in err["message"]
    if path != "/v1/messages":  # (Anthropic's error objects have no param)
        assert err["param"] == field and err["code"] == "unsupported_parameter"
    fine = dict(body, **{field: None})  # null is as good as left out
    if path == "/v1/responses" and field == "messages":
        fine["input"] = "hi"
    assert post(server[0], path, dict(fine, max_tokens=2) if path != "/v1/responses" else fine).status_code == 200


def test_unknown_route_and_wrong_method_are_openai_errors(server):
    assert_error(httpx.get(f"{server[0]}/v1/nothing", timeout=TIMEOUT), 404, says="POST /v1/chat/completions")
    r = httpx.get(f"{server[0]}/v1/chat/completions", timeout=TIMEOUT)
    assert_error(r, 405, says="GET is not allowed")


def test_numerical_error_is_500_and_the_server_keeps_serving(server):
    url, engine = server
    body = {"messages": HI, "max_tokens": 8}
    engine.target_model.poisoned = True
    try:
        assert_error(post(url, "/v1/chat/completions", body), 500, code="numerical_error", says="NaN")
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True},
                          timeout=TIMEOUT) as r:
            assert r.status_code == 500  # it failed before its first token: a status, not a broken stream
    finally:
        engine.target_model.poisoned = False
    ok = post(url, "/v1/chat/completions", body)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] > 0


def test_numerical_error_mid_stream_ends_it_with_an_error_event_and_the_next_request_is_clean():
    engine = GatedEngine(poisonable_engine(), per_token_seconds=0.01)
    body = {"messages": HI, "max_tokens": 500, "stream": True}
    with running_server(engine) as (url, _):
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT) as r:
            assert r.status_code == 200
            events = []
            for event in iter_sse(r):
                events.append(event)
                if event and event.get("choices") and event["choices"][0]["delta"].get("content"):
                    engine.target_model.poisoned = True  # after the first text: the status is sent already
        engine.target_model.poisoned = False
        assert events[-1] is None  # data: [DONE]
        err = events[-2]["error"]
        assert err["code"] == "numerical_error" and err["type"] == "server_error" and "NaN" in err["message"]
        assert len(events) < 100  # it stopped, far short of 500 tokens
        after = openai_client(url).chat.completions.create(model="m", messages=HI, max_tokens=12)
        m = scrape_metrics(url)
    assert m['mlxspec_errors_total{status="500"}'] == 1  # counted, though its status was 200
    assert m["mlxspec_requests_cancelled_total"] == 0  # the client stayed to the end
    fresh = poisonable_engine().generate(HI, max_tokens=12)
    assert after.choices[0].message.content == fresh.text


@pytest.mark.parametrize("path, body", [
    ("/v1/messages", {"messages": HI, "max_tokens": 500}),
    ("/v1/responses", {"input": "Hello", "max_output_tokens": 500}),
    ("/api/chat", {"messages": HI, "options": {"num_predict": 500}}),
    ("/completion", {"prompt": "Hello", "n_predict": 500}),
])
def test_another_api_s_stream_that_fails_midway_ends_with_its_error_and_is_counted(path, body):
    engine = GatedEngine(poisonable_engine(), per_token_seconds=0.01)
    with running_server(engine) as (url, _):
        with httpx.stream("POST", f"{url}{path}", json={**body, "stream": True}, timeout=TIMEOUT) as r:
            assert r.status_code == 200
            bodies = []  # SSE's data, or JSON lines (Ollama's)
            for line in r.iter_lines():
                if line.startswith(("data: {", "{")):
                    bodies.append(json.loads(line.removeprefix("data: ")))
                    engine.target_model.poisoned = len(bodies) >= 3  # the status is sent already
        engine.target_model.poisoned = False
        m = scrape_metrics(url)
    last = bodies[-1]  # each API's error: {"error": ...}, or an event of type "error"
    assert ("error" in last or last.get("type") == "error") and "NaN" in json.dumps(last), last
    assert len(bodies) < 100  # it stopped, far short of 500 tokens
    assert m['mlxspec_errors_total{status="500"}'] == 1 and m["mlxspec_requests_cancelled_total"] == 0


def test_an_unforeseen_failure_is_500_and_the_connection_stays_open():
    engine = poisonable_engine()
    with running_server(engine, model_id="tiny") as (url, uv):
        state = uv.config.app.state.mlxspec
        calls = []

        def note_model(name):  # fails once, as a bug in a route would
            calls.append(name)
            if len(calls) == 1:
                raise RuntimeError("a bug")

        state.note_model = note_model
        with httpx.Client(timeout=TIMEOUT) as client:
            body = {"messages": HI, "max_tokens": 2}
            r = client.post(f"{url}/v1/chat/completions", json=body)
            assert_error(r, 500, code="internal_error", says="RuntimeError")
            r = client.post(f"{url}/v1/chat/completions", json=body)  # the same keep-alive connection
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
        assert len(calls) == 2


class BuggyEngine(GatedEngine):
    """An engine whose generation raises a plain RuntimeError (a bug, not an engine error) after
    its third token while `armed`; counts the resets asked of it."""

    armed = False
    resets = 0

    def _held(self, events):
        for i, ev in enumerate(super()._held(events)):
            if self.armed and i == 3:
                raise RuntimeError("a bug in a pass")
            yield ev

    def reset(self):
        self.resets += 1
        self.engine.reset()


def test_an_unforeseen_engine_failure_is_500_logged_and_the_engine_starts_clean(caplog):
    engine = BuggyEngine(poisonable_engine())
    body = {"messages": HI, "max_tokens": 8}
    with running_server(engine) as (url, _), caplog.at_level(logging.ERROR, logger="mlxspec.serve"):
        engine.armed = True
        assert_error(post(url, "/v1/chat/completions", body), 500, code="engine_error", says="a bug in a pass")
        engine.armed = False
        assert engine.resets == 1  # whatever state the bug left, the next request starts from none
        assert any("the engine failed on a request" in r.getMessage() for r in caplog.records)
        engine.target_model.poisoned = True
        try:  # an engine error it foresaw (NaN logits): its own cleanup, nothing logged as a bug
            assert_error(post(url, "/v1/chat/completions", body), 500, code="numerical_error")
        finally:
            engine.target_model.poisoned = False
        assert engine.resets == 1
        ok = post(url, "/v1/chat/completions", body)
    assert ok.json()["choices"][0]["message"]["content"] == poisonable_engine().generate(HI, max_tokens=8).text


def test_the_server_still_answers_after_all_of_that(server):
    r = openai_client(server[0]).chat.completions.create(model="tiny", messages=HI, max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length")


# -- auth ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyed():
    from serve_helpers import tiny_engine

    with running_server(tiny_engine(), model_id="tiny", api_key="s3cret") as (url, _):
        yield url


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                                     {"Authorization": "Basic s3cret"}])
def test_without_the_key_is_401(keyed, headers):
    r = post(keyed, "/v1/chat/completions", {"messages": HI, "max_tokens": 2}, headers=headers)
    err = assert_error(r, 401, code="invalid_api_key", says="Authorization: Bearer")
    assert "s3cret" not in json.dumps(err) and r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{keyed}/v1/models", headers=headers, timeout=TIMEOUT).status_code == 401


def test_with_the_key_it_answers(keyed):
    import openai

    good = openai_client(keyed, api_key="s3cret")
    assert good.chat.completions.create(model="tiny", messages=HI, max_tokens=2).choices
    with pytest.raises(openai.AuthenticationError):
        openai_client(keyed, api_key="nope").models.list()
    assert httpx.get(f"{keyed}/health", timeout=TIMEOUT).status_code == 200  # probes need no key


def test_explicit_defaults_are_taken_as_left_out():
    """Clients often send the defaults explicitly (n 1, best_of 1, other servers' neutral values such as
    tfs_z 1): those requests are the plain ones.
    A plain completion computes no logprobs (best_of ranks by them only when it exceeds n), and
    OpenAI's scoring request (echo, max_tokens 0) generates one token, which is dropped."""
    assert parse_chat({"messages": HI, "n": 1}).n == 1
    assert parse_chat({"messages": HI, "best_of": 1}).n == 1  # best_of equal to n: nothing to rank
    assert parse_chat({"messages": HI, "n": 2, "best_of": 2}).n == 2
    assert parse_chat({"messages": HI, "tfs_z": 1, "repeat_penalty": 1.0}).n == 1  # 1 and 1.0 alike: neutral
    for body, param in (({"best_of": 2}, "best_of"), ({"best_of": True}, "best_of"), ({"tfs_z": True}, "tfs_z")):
        with pytest.raises(APIError, match=param):  # a boolean is not the number 1, nor best_of=2 without n=2
            parse_chat({"messages": HI, **body})
    plain = parse_completion({"prompt": "a", "n": 1, "best_of": 1})
    assert (plain.n, plain.best_of, plain.ranking_logprobs) == (1, 1, False) and "logprobs" not in plain.options
    ranked = parse_completion({"prompt": "a", "n": 1, "best_of": 3})
    assert ranked.ranking_logprobs and ranked.options["logprobs"] == 0
    score = parse_completion({"prompt": "a", "echo": True, "max_tokens": 0})
    assert score.score_only and score.options["max_tokens"] == 1


def test_the_largest_allowed_counts_are_taken():
    """Each limit is inclusive: 128 choices (n, best_of, or n x prompts of a batch), 16 stop strings,
    and a best_of equal to n, which ranks nothing, also when streamed."""
    assert MAX_CHOICES == 128 and MAX_STOP == 16
    assert parse_completion({"prompt": "a", "n": 128}).n == 128
    assert parse_completion({"prompt": "a", "best_of": 128}).best_of == 128
    assert len(parse_completion({"prompt": ["a"] * 64, "n": 2}).runs()) == 128
    assert len(parse_completion({"prompt": "a", "stop": [f"s{i}" for i in range(16)]}).options["stop"]) == 16
    with pytest.raises(APIError, match="stop takes at most 16 strings, got 17"):
        parse_completion({"prompt": "a", "stop": [f"s{i}" for i in range(17)]})
    same = parse_completion({"prompt": "a", "n": 2, "best_of": 2, "stream": True})
    assert (same.n, same.best_of, same.stream, same.ranking_logprobs) == (2, 2, True, False)


@pytest.mark.parametrize("prediction", ["the text itself", ["a", "b"], 7, {"type": "text", "content": "x"}])
def test_a_prediction_not_in_openais_shape_is_a_400_naming_it(prediction):
    with pytest.raises(APIError, match='prediction must be {"type": "content"') as e:
        parse_chat({"messages": HI, "prediction": prediction})
    assert e.value.status == 400


def test_an_engine_check_s_refusal_names_its_field_once():
    from mlxspec.errors import InvalidArgumentError
    from mlxspec.serve.errors import checked

    def refuse(message):
        def rule(value):
            raise InvalidArgumentError(message)
        return rule

    for said, shown in (("stop must be a list", "stop must be a list"), ("must be a list", "stop: must be a list")):
        with pytest.raises(APIError) as e:
            checked(refuse(said), ["x"], "stop")
        assert (e.value.status, e.value.param, e.value.message) == (400, "stop", shown)
    assert checked(lambda v: v * 2, 21, "n") == 42  # what passes the check is its value


@pytest.mark.parametrize("path, body", [
    ("/v1/messages", {"model": "m", "max_tokens": 500, "messages": HI, "stream": True}),
    ("/api/chat", {"model": "m", "messages": HI, "options": {"num_predict": 500}}),  # Ollama's: JSON lines
    ("/v1/responses", {"model": "m", "input": "hi", "max_output_tokens": 500, "stream": True}),
])
def test_another_api_s_stream_that_fails_mid_way_says_so_and_is_counted(path, body):
    engine = GatedEngine(poisonable_engine(), per_token_seconds=0.01)
    with running_server(engine) as (url, _):
        with httpx.stream("POST", f"{url}{path}", json=body, timeout=TIMEOUT) as r:
            assert r.status_code == 200
            lines = []
            for line in r.iter_lines():
                lines.append(line)
                if len(lines) == 8:
                    engine.target_model.poisoned = True  # after the first text: the status is sent already
        engine.target_model.poisoned = False
        m = scrape_metrics(url)
    assert any("numerical_error" in line or "NaN" in line for line in lines[-3:]), lines[-3:]
    assert m['mlxspec_errors_total{status="500"}'] == 1 and m["mlxspec_requests_cancelled_total"] == 0


def test_an_error_in_another_api_s_terms_renames_only_a_leading_field_name():
    error = APIError(400, "max_tokens must be >= 1 (max_tokens counts tokens)", param="max_tokens", code="c",
                     headers={"X": "1"})
    named = error.named("n_predict")
    assert (named.message, named.param, named.code, named.status, named.headers) == (
        "n_predict must be >= 1 (max_tokens counts tokens)", "n_predict", "c", 400, {"X": "1"})
    assert APIError(400, "the answer needs max_tokens >= 1", param="max_tokens").named("n_predict").message == \
        "the answer needs max_tokens >= 1"  # (not a name at its start: left as it is)
    unnamed = APIError(400, "repetition_context_size is too large").named("options.repeat_penalty", {
        "repetition_context_size": "options.repeat_last_n"})
    assert (unnamed.message, unnamed.param) == ("options.repeat_last_n is too large", "options.repeat_penalty")


def test_each_generation_of_a_prompt_samples_with_the_seed_plus_its_place():
    from mlxspec.prompts import MAX_SEED

    runs = parse_completion({"prompt": ["a", "b"], "n": 3, "seed": MAX_SEED - 1}).runs()
    assert [(prompt, options["seed"]) for prompt, options in runs] == [
        ("a", MAX_SEED - 1), ("a", 0), ("a", 1), ("b", MAX_SEED - 1), ("b", 0), ("b", 1)]  # (wrapped in range)
    assert [options.get("seed") for _, options in parse_completion({"prompt": "a", "n": 2}).runs()] == [None, None]


WEATHER_TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("extra, shown, choice, one", [
    ({}, True, None, False), ({"tool_choice": "auto"}, True, None, False),
    ({"tool_choice": "none"}, False, None, False), ({"tool_choice": "required"}, True, "required", False),
    ({"parallel_tool_calls": False}, True, None, True), ({"parallel_tool_calls": True}, True, None, False),
    ({"tool_choice": "none", "parallel_tool_calls": False}, False, None, False)])
def test_tools_are_shown_forced_or_limited_to_one_call_as_asked(extra, shown, choice, one):
    req = parse_chat(dict({"messages": HI, "tools": [WEATHER_TOOL]}, **extra))
    assert (req.tools is not None, req.options.get("tool_choice"), req.one_call) == (shown, choice, one)
    assert "parallel_tool_calls" not in parse_chat({"messages": HI, "parallel_tool_calls": False}).options


def test_a_chat_s_continuation_echo_effort_and_logprobs_become_options():
    prefill = HI + [{"role": "assistant", "content": "Hel"}]
    req = parse_chat({"messages": prefill, "continue_final_message": True, "echo": True, "reasoning_effort": "low",
                      "logprobs": True})
    assert req.options["continue_final_message"] is True and req.echo is True
    assert req.options["chat_template_kwargs"] == {"reasoning_effort": "low"} and req.options["logprobs"] == 0
    plain = parse_chat({"messages": HI, "logprobs": True, "top_logprobs": 3})
    assert "continue_final_message" not in plain.options and plain.echo is False and plain.options["logprobs"] == 3
    assert parse_chat({"messages": prefill, "continue_final_message": True,
                       "add_generation_prompt": False}).options["continue_final_message"] is True
    for body, param, says in (
            ({"continue_final_message": True, "add_generation_prompt": True}, "add_generation_prompt",
             "send add_generation_prompt false (or leave it out) with it"),
            ({"add_generation_prompt": False}, "add_generation_prompt", "add_generation_prompt false alone"),
            ({"reasoning_effort": "max"}, "reasoning_effort",
             "reasoning_effort must be one of none, minimal, low, medium, high, xhigh, got 'max'")):
        with pytest.raises(APIError) as e:
            parse_chat(dict({"messages": prefill}, **body))
        assert e.value.param == param and says in e.value.message


def test_options_left_out_are_the_engine_s_defaults_and_those_sent_are_passed():
    plain = parse_chat({"messages": HI})
    assert plain.options["speculative"] is True and plain.include_usage is False
    for key in ("response_format", "repetition_penalty", "repetition_context_size", "include_stop_str_in_output"):
        assert key not in plain.options
    assert parse_chat({"messages": HI, "repetition_penalty": 1}).options.get("repetition_penalty") is None  # 1: off
    sent = parse_chat({"messages": HI, "stream": True, "stream_options": {"include_usage": True},
                       "speculative": False, "include_stop_str_in_output": True, "repetition_penalty": 1.3})
    assert sent.include_usage is True and sent.options["speculative"] is False
    assert sent.options["include_stop_str_in_output"] is True
    assert (sent.options["repetition_penalty"], sent.options["repetition_context_size"]) == (1.3, 20)  # mlx-lm's
    assert parse_chat({"messages": HI, "stream": True, "stream_options": {}}).include_usage is False
    assert [parse_chat({"messages": HI, "top_k": k}).options["top_k"] for k in (-1, 0, 1, 5)] == [0, 0, 1, 5]

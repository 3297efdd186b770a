"""Anthropic's Messages API (POST /v1/messages, /count_tokens) through the official `anthropic`
client: text, streaming, tool use and tool results in the next turn, thinking, errors and keys."""

import json

import httpx
import pytest

import tiny
from mlxspec.engine import Engine
from mlxspec.prompts import encode_prompt
from serve_helpers import TIMEOUT, built_events, running_server, tiny_engine, usage_body
from test_reasoning import scripted_thinker

anthropic = pytest.importorskip("anthropic")

ASK = [{"role": "user", "content": "Tell me about rivers."}]
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                 "parameters": WEATHER["input_schema"]}}
PARIS = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
END = [tiny.SPECIALS.index("<|im_end|>")]


@pytest.fixture(scope="module")
def served():
    with running_server(tiny_engine(drafter="ngram"), model_id="t", api_key="k") as (url, _):
        yield anthropic.Anthropic(base_url=url, api_key="k"), url, tiny_engine()


def test_a_message_is_the_chat_answer_with_system_first(served):
    client, _, ref = served
    # (temperature through extra_body: this client version no longer takes it as an argument)
    r = client.messages.create(model="t", max_tokens=20, system="Be brief.", messages=ASK,
                               extra_body={"temperature": 0.8, "seed": 4})
    want = ref.generate([{"role": "system", "content": "Be brief."}] + ASK, max_tokens=20, temperature=0.8, seed=4)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_") and r.model == "t"
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == want.text
    assert r.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[want.finish_reason]
    assert (prompt_tokens(r.usage), r.usage.output_tokens) == (want.stats.prompt_tokens, want.stats.tokens)
    assert r.model_extra["mlxspec"]["drafter"] == "ngram"


def test_the_answer_names_the_model_the_client_asked_for_or_the_served_one(served):
    """As the chat routes do: the name the client sent comes back, as Anthropic's API echoes it, and
    a body without one gets the served model's id."""
    _, url, _ = served
    for body, model in (({"model": "claude-sonnet-4-5"}, "claude-sonnet-4-5"), ({}, "t")):
        r = httpx.post(f"{url}/v1/messages", json=dict(body, max_tokens=2, messages=ASK), headers={"x-api-key": "k"},
                       timeout=TIMEOUT)
        assert r.status_code == 200 and r.json()["model"] == model, r.text


def test_the_stream_spells_the_same_message(served):
    client, url, _ = served
    whole = client.messages.create(model="t", max_tokens=24, messages=ASK)
    with client.messages.stream(model="t", max_tokens=24, messages=ASK) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == whole.usage.output_tokens
    with httpx.stream("POST", f"{url}/v1/messages", headers={"x-api-key": "k"}, timeout=TIMEOUT,
                      json={"model": "t", "max_tokens": 8, "messages": ASK, "stream": True}) as r:
        lines = list(r.iter_lines())
    names = [line[len("event: "):] for line in lines if line.startswith("event: ")]
    data = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]
    # the prompt as message_start counts it, before any text: what the caches held (the same question
    # asked just before) read from them, the rest input, as the end says too
    started, ended = data[0]["message"]["usage"], data[-2]["usage"]
    assert started["cache_read_input_tokens"] > 0 and started["output_tokens"] == 0
    assert {k: started[k] for k in ("input_tokens", "cache_read_input_tokens")} == \
        {k: ended[k] for k in ("input_tokens", "cache_read_input_tokens")}
    assert started["input_tokens"] + started["cache_read_input_tokens"] == prompt_tokens(whole.usage)
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"}


def test_system_messages_among_the_messages_are_taken_as_claude_code_sends_them(served):
    client, url, ref = served
    messages = ASK + [{"role": "assistant", "content": "Rivers flow."}, {"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "More?"}]
    r = httpx.post(f"{url}/v1/messages", json={"model": "t", "max_tokens": 6, "messages": messages},
                   headers={"x-api-key": "k"}, timeout=TIMEOUT).json()
    want = ref.generate(messages, max_tokens=6)
    u = r["usage"]
    assert r["content"][0]["text"] == want.text and u["input_tokens"] + u["cache_read_input_tokens"] == \
        want.stats.prompt_tokens


def test_count_tokens_is_what_a_message_counts(served):
    client, _, _ = served
    r = client.messages.create(model="t", max_tokens=2, system="Be brief.", messages=ASK)
    counted = client.messages.count_tokens(model="t", system="Be brief.", messages=ASK)
    assert counted.input_tokens == prompt_tokens(r.usage)  # the whole prompt, cached or not


def test_cache_reads_are_not_counted_as_input_too(served):
    client, _, ref = served
    ask = [{"role": "user", "content": "Tell me about the cache."}]
    whole = ref.generate(ask, max_tokens=4).stats.prompt_tokens
    client.messages.create(model="t", max_tokens=4, messages=ask)
    again = client.messages.create(model="t", max_tokens=4, messages=ask).usage
    assert again.cache_read_input_tokens > 0 and prompt_tokens(again) == whole
    with client.messages.stream(model="t", max_tokens=4, messages=ask) as stream:
        events = list(stream)
    started = events[0].message.usage
    assert started.cache_read_input_tokens > 0 and prompt_tokens(started) == whole
    ended = [e for e in events if e.type == "message_delta"][0].usage
    assert ended.cache_read_input_tokens > 0 and prompt_tokens(ended) == whole


def test_tool_use_and_the_tool_result_in_the_next_turn():
    tok = tiny.make_tokenizer(tiny.TOOLS_TEMPLATE)
    model = tiny.ScriptedModel()
    ask = [{"role": "user", "content": "Weather in Paris?"}]

    def say(text, messages):
        model.say(tok.encode(text, add_special_tokens=False) + END,
                  len(encode_prompt(messages, tok, tiny.VOCAB, tools=[CHAT_WEATHER])))

    with running_server(Engine(model, tok, drafter="ngram"), model_id="s") as (url, _):
        client = anthropic.Anthropic(base_url=url, api_key="unused")
        say("Let me look.\n" + PARIS, ask)
        r = client.messages.create(model="s", max_tokens=100, tools=[WEATHER], messages=ask)
        assert [b.type for b in r.content] == ["text", "tool_use"] and r.stop_reason == "tool_use"
        use = r.content[1]
        assert use.name == "get_weather" and use.input == {"city": "Paris"} and use.id.startswith("toolu_")
        with client.messages.stream(model="s", max_tokens=100, tools=[WEATHER], messages=ask) as stream:
            final = stream.get_final_message()
        assert [b.type for b in final.content] == ["text", "tool_use"] and final.content[1].input == {"city": "Paris"}
        assert final.stop_reason == "tool_use"
        turn = ask + [{"role": "assistant", "content": [b.model_dump() for b in r.content]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                    "content": "Sunny, 24 C"}]}]
        as_chat = ask + [{"role": "assistant", "content": "Let me look.\n", "tool_calls": [
            {"id": use.id, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": use.id, "content": "Sunny, 24 C"}]
        say("It is sunny.", as_chat)
        r = client.messages.create(model="s", max_tokens=100, tools=[WEATHER], messages=turn)
        assert r.content[0].text == "It is sunny." and r.stop_reason == "end_turn"
        # text held back as the start of a call that never came is the answer's end
        say("It is <tool_c", ask)
        r = client.messages.create(model="s", max_tokens=100, tools=[WEATHER], messages=ask)
        assert [b.text for b in r.content] == ["It is <tool_c"] and r.stop_reason == "end_turn"
        with client.messages.stream(model="s", max_tokens=100, tools=[WEATHER], messages=ask) as stream:
            assert "".join(stream.text_stream) == "It is <tool_c"
        # disable_parallel_tool_use: the answer ends with its first call
        say("Let me look.\n" + PARIS + "\n" + PARIS.replace("Paris", "Rome"), ask)
        assert [b.type for b in client.messages.create(model="s", max_tokens=300, tools=[WEATHER],
                                                       messages=ask).content] == ["text", "tool_use", "tool_use"]
        r = client.messages.create(model="s", max_tokens=300, tools=[WEATHER], messages=ask,
                                   tool_choice={"type": "auto", "disable_parallel_tool_use": True})
        assert [b.type for b in r.content] == ["text", "tool_use"] and r.content[1].input == {"city": "Paris"}
        assert r.stop_reason == "tool_use"


def test_a_thinking_model_s_reasoning_is_a_thinking_block():
    ask = [{"role": "user", "content": "What is 2 + 2?"}]
    with running_server(scripted_thinker("Add them.</think>It is 4.", ask), model_id="thinker") as (url, _):
        client = anthropic.Anthropic(base_url=url, api_key="unused")
        r = client.messages.create(model="thinker", max_tokens=60, messages=ask)
        assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in r.content] == [
            ("thinking", "Add them."), ("text", "It is 4.")]
        with client.messages.stream(model="thinker", max_tokens=60, messages=ask) as stream:
            final = stream.get_final_message()
        assert [b.type for b in final.content] == ["thinking", "text"] and final.content[1].text == "It is 4."


@pytest.mark.parametrize("body, says", [
    ({"max_tokens": 0, "messages": ASK}, "max_tokens must be an integer >= 1"),
    ({"messages": ASK}, "max_tokens is required"),  # as Anthropic's API: no default
    ({"max_tokens": 5, "messages": []}, "messages must be a non-empty list"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "blocks of type 'image' are not supported"),
    ({"max_tokens": 5, "messages": ASK, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "only client tools"),
    ({"max_tokens": 5, "messages": ASK, "tool_choice": {"type": "sometimes"}}, "tool_choice must be"),
    ({"max_tokens": 5, "messages": ASK, "tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}},
     "tool_choice.disable_parallel_tool_use must be true or false, got 'yes'"),
    ({"max_tokens": 5, "messages": ASK, "temperature": 1.5}, "temperature must be a number in 0..1"),  # Anthropic's
    ({"max_tokens": 5, "messages": ASK, "temperature": "warm"}, "temperature must be a number in 0..1"),
    # the chat path's checks, in Anthropic's names
    ({"max_tokens": 5, "messages": ASK, "stop_sequences": [1]}, "stop_sequences must be a string or a list of str"),
    ({"max_tokens": 5, "messages": ASK, "tools": [dict(WEATHER, input_schema="x")]},
     "tools[0].input_schema must be a JSON Schema object, got 'x'"),
    ({"max_tokens": 5, "messages": ASK, "tools": [WEATHER, dict(WEATHER, name="get weather")]},
     "tools[1].name must be 1-64 letters, digits, _ or -"),
    ({"max_tokens": 5, "messages": ASK, "tool_choice": {"type": "any"}},
     "tool_choice {'type': 'any'} needs tools to call; send tools"),
    ({"max_tokens": 5, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
     "tool_choice names tool 'nope', which is not among the tools; allowed: get_weather"),
])
def test_errors_take_anthropic_s_shape(served, body, says):
    _, url, _ = served
    r = httpx.post(f"{url}/v1/messages", json=dict({"model": "t"}, **body), headers={"x-api-key": "k"},
                   timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert says in error["error"]["message"], error
    if "tools" in body:  # counted as it would be answered, and refused alike
        counted = httpx.post(f"{url}/v1/messages/count_tokens", json=dict({"model": "t"}, **body),
                             headers={"x-api-key": "k"}, timeout=TIMEOUT)
        assert counted.status_code == 400 and says in counted.json()["error"]["message"], counted.text


def test_either_key_header_is_taken_and_a_wrong_key_is_anthropic_s_401(served):
    _, url, _ = served
    body = {"model": "t", "max_tokens": 2, "messages": ASK}
    for headers in ({"x-api-key": "k"}, {"Authorization": "Bearer k"}):
        assert httpx.post(f"{url}/v1/messages", json=body, headers=headers, timeout=TIMEOUT).status_code == 200
    for path in ("/v1/messages", "/messages"):  # served without /v1 too
        r = httpx.post(f"{url}{path}", json=body, headers={"x-api-key": "wrong"}, timeout=TIMEOUT)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert json.loads(httpx.post(f"{url}/v1/chat/completions", json=body, headers={"x-api-key": "wrong"},
                                 timeout=TIMEOUT).text)["error"]["code"] == "invalid_api_key"  # OpenAI's shape there


def test_an_engine_failure_is_an_api_error_whole_or_mid_stream():
    from mlxspec.serve.anthropic import MessageBuilder
    from mlxspec.serve.errors import APIError
    from serve_helpers import poisonable_engine

    engine = poisonable_engine()
    engine.target_model.poisoned = True
    with running_server(engine, model_id="p") as (url, _):
        r = httpx.post(f"{url}/v1/messages", json={"model": "p", "max_tokens": 4, "messages": ASK}, timeout=TIMEOUT)
    assert r.status_code == 500 and r.json()["error"]["type"] == "api_error"
    assert "NaN" in r.json()["error"]["message"]
    event = MessageBuilder("p").error(APIError(503, "the server is shutting down"))
    name, data = event.decode().strip().split("\n")
    assert name == "event: error" and json.loads(data[len("data: "):]) == {
        "type": "error", "error": {"type": "overloaded_error", "message": "the server is shutting down"}}


@pytest.mark.parametrize("status, kind", [
    (400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
    (404, "not_found_error"), (408, "invalid_request_error"), (413, "request_too_large"),
    (422, "invalid_request_error"), (429, "rate_limit_error"), (500, "api_error"), (503, "overloaded_error"),
    (504, "api_error")])
def test_each_status_has_anthropic_s_error_type(status, kind):
    """Anthropic's documented types; a stalled body (408) is not one that was too large."""
    from mlxspec.serve.anthropic import error_body
    from mlxspec.serve.errors import APIError

    assert error_body(APIError(status, "said")) == {"type": "error", "error": {"type": kind, "message": "said"}}


def test_an_error_names_its_field_once():
    from mlxspec.serve.anthropic import error_body
    from mlxspec.serve.errors import APIError

    assert error_body(APIError(400, "must be an integer", param="max_tokens"))["error"]["message"] == \
        "max_tokens: must be an integer"
    assert error_body(APIError(400, "max_tokens must be an integer", param="max_tokens"))["error"]["message"] == \
        "max_tokens must be an integer"


def test_a_stop_sequence_is_named():
    tok = tiny.make_tokenizer()
    model = tiny.ScriptedModel()
    model.say(tok.encode("one, two; three", add_special_tokens=False) + END, len(encode_prompt(ASK, tok, tiny.VOCAB)))
    with running_server(Engine(model, tok, drafter="ngram"), model_id="s") as (url, _):
        client = anthropic.Anthropic(base_url=url, api_key="unused")
        r = client.messages.create(model="s", max_tokens=40, messages=ASK, stop_sequences=[";"])
        assert (r.content[0].text, r.stop_reason, r.stop_sequence) == ("one, two", "stop_sequence", ";")
        with client.messages.stream(model="s", max_tokens=40, messages=ASK, stop_sequences=[";"]) as stream:
            final = stream.get_final_message()
        assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", ";")
        r = client.messages.create(model="s", max_tokens=40, messages=ASK)
        assert (r.stop_reason, r.stop_sequence) == ("end_turn", None)


def test_a_last_assistant_message_is_a_prefill_the_answer_continues():
    tok = tiny.make_tokenizer()
    model = tiny.ScriptedModel()
    prefilled = ASK + [{"role": "assistant", "content": "Rivers are"}]
    model.say(tok.encode(" long.", add_special_tokens=False) + END,
              len(encode_prompt(prefilled, tok, tiny.VOCAB, continue_final=True)))
    with running_server(Engine(model, tok, drafter="ngram"), model_id="s") as (url, _):
        client = anthropic.Anthropic(base_url=url, api_key="unused")
        r = client.messages.create(model="s", max_tokens=20, messages=prefilled)
        assert r.content[0].text == " long." and r.stop_reason == "end_turn"
        assert client.messages.count_tokens(model="s", messages=prefilled).input_tokens == prompt_tokens(r.usage)


def prompt_tokens(usage) -> int:
    """The whole prompt, as Anthropic's usage splits it."""
    return usage.input_tokens + (usage.cache_creation_input_tokens or 0) + (usage.cache_read_input_tokens or 0)


def _chat(**body):
    from mlxspec.serve.anthropic import to_chat

    return to_chat(dict({"max_tokens": 5, "messages": ASK}, **body))


def test_a_turn_s_blocks_become_chat_messages():
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    turn = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "a tool", "signature": ""},
                                              {"type": "redacted_thinking", "data": "x"}, use]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "down",
                                          "is_error": True}, {"type": "text", "text": "Try again."}]},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}]}]
    call = {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    assert _chat(messages=turn)["messages"] == [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},  # (the thinking dropped, as templates do)
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: down"},
        {"role": "user", "content": "Try again."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"}]  # no empty user message after it


@pytest.mark.parametrize("message, says", [
    ("hi", "messages[0] must be {\"role\": \"user\" or \"assistant\""),
    ({"role": "user", "content": [{"type": "text", "text": 5}]}, "user blocks of type 'text' are not supported"),
    ({"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
     "user blocks of type 'tool_use' are not supported"),
    ({"role": "user", "content": [{"type": "thinking", "thinking": "hm"}]}, "user blocks of type 'thinking'"),
    ({"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]},
     "assistant blocks of type 'tool_result' are not supported"),
    ({"role": "assistant", "content": [{"type": "image", "source": {}}]}, "assistant blocks of type 'image'"),
    ({"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}]},
     "messages[0].content[0].input must be an object (the tool's arguments), got 'x'"),
    ({"role": "user", "content": [{"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                                                  "data": "JVBERi0="}}]},
     "messages[0].content[0]: documents whose source is of type 'base64' are not supported"),
    ({"role": "user", "content": [{"type": "document", "source": {"type": "content", "content": [
        {"type": "image", "source": {}}]}}]}, "messages[0].content[0].source.content must be a string or a list of "
                                              "text blocks"),
    ({"role": "assistant", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]},
     "assistant blocks of type 'document' are not supported"),
    ({"role": "user", "content": [{"type": "document", "title": 7, "source": {"type": "text", "data": "x"}}]},
     "messages[0].content[0].title must be a string, got 7"),
])
def test_a_block_that_cannot_be_read_is_refused_naming_it(message, says):
    from mlxspec.serve.errors import APIError

    with pytest.raises(APIError) as e:
        _chat(messages=[message])
    assert e.value.status == 400 and says in e.value.message


def test_a_plain_text_document_is_read_as_text_under_its_title():
    """A user's document block whose source is text (or text blocks) is what the model reads, its
    title above it, in its place among the message's text blocks."""
    doc = {"type": "document", "title": "Notes", "source": {"type": "text", "media_type": "text/plain",
                                                             "data": "Rivers flow."}}
    parts = {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "Seas are salty."},
                                                                           {"type": "text", "text": "Lakes are not."}]}}
    asked = [{"role": "user", "content": [doc, parts, {"type": "text", "text": "Summarize."}]}]
    assert _chat(messages=asked)["messages"] == [
        {"role": "user", "content": "Notes\n\nRivers flow.\nSeas are salty.\nLakes are not.\nSummarize."}]


def test_tool_choice_thinking_and_temperature_become_the_chat_s():
    auto = _chat(tools=[WEATHER], tool_choice={"type": "auto"})
    assert auto["tool_choice"] == "auto" and "parallel_tool_calls" not in auto
    one = _chat(tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert one["tool_choice"] == "required" and one["parallel_tool_calls"] is False
    named = _chat(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert "tools" not in _chat(tools=[WEATHER], tool_choice={"type": "none"})
    off = _chat(thinking={"type": "disabled"}, chat_template_kwargs={"mode": "brief"})
    assert off["chat_template_kwargs"] == {"mode": "brief", "enable_thinking": False}  # added to the client's own
    assert "chat_template_kwargs" not in _chat(thinking={"type": "enabled", "budget_tokens": 1024})
    for edge in (0, 1):  # Anthropic's range, both ends in it
        assert _chat(temperature=edge)["temperature"] == edge


def test_an_empty_answer_is_one_empty_text_block_whole_or_streamed():
    from mlxspec.serve.anthropic import MessageBuilder
    from mlxspec.stats import GenerationStats

    usage = usage_body(3, 0, 1)
    whole = MessageBuilder("m").whole("", "", [], "stop", usage, GenerationStats())
    assert whole["content"] == [{"type": "text", "text": ""}] and whole["stop_reason"] == "end_turn"
    events = [e.decode().split("\n")[0] for e in MessageBuilder("m").finish("stop", usage, GenerationStats())]
    assert events == ["event: content_block_start", "event: content_block_stop", "event: message_delta",
                      "event: message_stop"]


def test_each_streamed_block_s_events_carry_its_index():
    from mlxspec.serve.anthropic import MessageBuilder
    from mlxspec.stats import GenerationStats

    usage = usage_body(3, 0, 9)
    calls = [{"function": {"name": f, "arguments": "{}"}} for f in ("f", "g")]
    builder = MessageBuilder("m")
    chunks = (builder.feed("Hm.", "", []) + builder.feed("", "Ok.", []) + builder.feed("", "", calls)
              + builder.finish("stop", usage, GenerationStats()))
    events = built_events(chunks)
    indexed = [(e["type"][len("content_block_"):], e["index"]) for e in events if "index" in e]
    assert indexed == [(kind, i) for i in range(4) for kind in ("start", "delta", "stop")]
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


@pytest.mark.parametrize("stopped_by, calls, sequence, reason", [
    ("</answer>", [], "</answer>", "stop_sequence"), (7, [], None, "end_turn"), (None, [], None, "end_turn"),
    ("</answer>", [{"function": {"name": "f", "arguments": "{}"}}], None, "tool_use")])
def test_only_a_stop_string_is_the_stop_sequence(stopped_by, calls, sequence, reason):
    """A stop token id (the model's end of turn, stop_token_ids) is not a sequence the client sent."""
    from mlxspec.serve.anthropic import MessageBuilder
    from mlxspec.stats import GenerationStats

    usage = usage_body(3, 0, 2)
    whole = MessageBuilder("m").whole("", "x", calls, "stop", usage, GenerationStats(), stopped_by)
    assert (whole["stop_sequence"], whole["stop_reason"]) == (sequence, reason)

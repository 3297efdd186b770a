"""Tool calling through `mlxspec serve` and the official openai client, with a model that writes given text.

The model (`tiny.ScriptedModel`) writes what each test gives it after the prompt it will get, so
the calls, the text around them and the place a cut falls are the test's to choose; everything
else (the chat template with tools, the speculative loop, detokenising, streaming) is the real path.
"""

import json

import httpx
import pytest

import tiny
from mlxspec.engine import Engine
from mlxspec.prompts import encode_prompt
from mlxspec.tools import ToolFormat
from serve_helpers import TIMEOUT, GatedEngine, iter_sse, openai_client, running_server, scripted_server

pytest.importorskip("openai")

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris and Rome?"}]
PARIS = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
ROME = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'


@pytest.fixture(scope="module")
def served():
    tok = tiny.make_tokenizer(tiny.TOOLS_TEMPLATE)
    model = tiny.ScriptedModel()
    # A few ms a token, so a stream's two calls reach the client in different batches of events.
    with running_server(GatedEngine(Engine(model, tok), per_token_seconds=0.004), model_id="scripted") as (url, _):
        yield url, model, tok


@pytest.fixture
def say(served):
    """say(text, messages, tools): the model writes `text` after the prompt these make."""
    _, model, tok = served

    def say(text, messages=ASK, tools=(WEATHER,)):
        prompt = encode_prompt(messages, tok, tiny.VOCAB, tools=list(tools) or None)
        model.say(tok.encode(text, add_special_tokens=False), len(prompt))
        return len(prompt)

    return say


@pytest.fixture
def client(served):
    return openai_client(served[0])


def test_calls_come_back_as_tool_calls(client, say):
    say(PARIS + "\n" + ROME)
    r = client.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER], max_tokens=200)
    (choice,) = r.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None and choice.message.role == "assistant"
    calls = choice.message.tool_calls
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", "get_weather", {"city": "Paris"}), ("function", "get_weather", {"city": "Rome"})]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id


def test_streamed_calls_equal_the_whole_answers(client, say):
    say("Let me check.\n" + PARIS + "\n" + ROME)
    whole = client.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER], max_tokens=200)
    chunks = list(client.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER], max_tokens=200,
                                                 stream=True))
    deltas = [c.choices[0].delta for c in chunks]
    text = "".join(d.content or "" for d in deltas)
    streamed = [tc for d in deltas for tc in d.tool_calls or []]
    assert text == whole.choices[0].message.content == "Let me check."
    assert [tc.index for tc in streamed] == [0, 1]
    assert [(tc.function.name, tc.function.arguments) for tc in streamed] == [
        (c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    assert all(tc.type == "function" and tc.id.startswith("call_") for tc in streamed)
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "tool_calls"
    # no chunk ever showed part of a call's markup as text
    assert not any("<tool" in (d.content or "") for d in deltas)


def test_a_call_cut_by_max_tokens_stays_text_and_finishes_length(served, say):
    say(PARIS)
    body = {"messages": ASK, "tools": [WEATHER], "max_tokens": 30}
    r = httpx.post(f"{served[0]}/v1/chat/completions", json=body, timeout=TIMEOUT).json()
    (choice,) = r["choices"]
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == PARIS[:30]  # one byte per token: nothing dropped
    with httpx.stream("POST", f"{served[0]}/v1/chat/completions", json=dict(body, stream=True),
                      timeout=TIMEOUT) as response:
        events = [e for e in iter_sse(response) if e is not None]
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == PARIS[:30]
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_text_that_is_no_call_is_answered_as_text(client, say):
    say("It is <b>sunny</b> in <tool_calls> land.")
    r = client.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER], max_tokens=200)
    assert r.choices[0].message.content == "It is <b>sunny</b> in <tool_calls> land."
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"


def test_tool_choice_none_does_not_show_the_tools(client, say):
    shown = say("fine", tools=[WEATHER])
    plain = say(PARIS, tools=())
    r = client.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER], tool_choice="none",
                                       max_tokens=200)
    assert r.usage.prompt_tokens == plain < shown
    assert r.choices[0].message.content == PARIS and r.choices[0].message.tool_calls is None  # not read as a call


def test_tokenize_and_apply_template_render_the_tools(served, client, say):
    url, _, tok = served
    shown = say("fine")
    body = {"messages": ASK, "tools": [WEATHER]}
    r = httpx.post(f"{url}/tokenize", json=body, timeout=TIMEOUT).json()
    assert r["tokens"] == encode_prompt(ASK, tok, tiny.VOCAB, tools=[WEATHER]) and r["count"] == shown
    assert r["count"] > len(encode_prompt(ASK, tok, tiny.VOCAB))  # the tools are in it
    prompt = httpx.post(f"{url}/apply-template", json=body, timeout=TIMEOUT).json()["prompt"]
    assert "get_weather" in prompt and tok.encode(prompt, add_special_tokens=False) == r["tokens"]
    usage = client.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER], max_tokens=2).usage
    assert usage.prompt_tokens == r["count"]  # what a request of it counts


def test_the_calls_and_their_results_go_back_to_the_model(client, say):
    first = say(PARIS)
    r = client.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER], max_tokens=200)
    call = r.choices[0].message.tool_calls[0]
    turns = ASK + [r.choices[0].message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
    # what the template should get: the call's arguments as an object, as chat templates write them back
    rendered = ASK + [{"role": "assistant", "content": None,
                       "tool_calls": [{"id": call.id, "type": "function",
                                       "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                      {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
    second = say("Paris: 18 C and sunny.", messages=rendered)
    assert second > first
    r = client.chat.completions.create(model="scripted", messages=turns, tools=[WEATHER], max_tokens=200)
    assert r.choices[0].message.content == "Paris: 18 C and sunny." and r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == second


def test_parallel_tool_calls_false_gives_the_first_call_alone(client, say):
    """The answer ends with its first call (whole and streamed), and fewer tokens are generated."""
    say("Let me check.\n" + PARIS + "\n" + ROME)
    both = client.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER], max_tokens=200)
    r = client.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER], max_tokens=200,
                                       parallel_tool_calls=False)
    (call,) = r.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Paris"} and r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.content == "Let me check."
    assert r.usage.completion_tokens == len("Let me check.\n" + PARIS) < both.usage.completion_tokens
    chunks = list(client.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER], max_tokens=200,
                                                 parallel_tool_calls=False, stream=True))
    streamed = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
    assert [json.loads(tc.function.arguments) for tc in streamed] == [{"city": "Paris"}]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_parallel_tool_calls_false_reads_one_of_a_list_of_calls():
    """A format whose calls share one body (Mistral's list): the server reads the first call alone."""
    tok = tiny.make_tokenizer(tiny.TOOLS_TEMPLATE)
    model = tiny.ScriptedModel()
    engine = Engine(model, tok)
    engine.__dict__["tool_format"] = ToolFormat("[CALLS]", "", lambda body, tools: json.loads(body), "list")
    calls = [{"name": "get_weather", "arguments": {"city": c}} for c in ("Paris", "Rome")]
    model.say(tok.encode("[CALLS]" + json.dumps(calls), add_special_tokens=False),
              len(encode_prompt(ASK, tok, tiny.VOCAB, tools=[WEATHER])))
    with running_server(engine, model_id="scripted") as (url, _):
        client = openai_client(url)
        for parallel, cities in ((True, ["Paris", "Rome"]), (False, ["Paris"])):
            r = client.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER], max_tokens=200,
                                               parallel_tool_calls=parallel)
            assert [json.loads(c.function.arguments)["city"] for c in r.choices[0].message.tool_calls] == cities


def test_calls_streamed_in_one_batch_are_numbered_in_turn(monkeypatch):
    from mlxspec.serve import queue

    # The first token goes out at once; with a window this long, every later one comes with the end,
    # so both calls are read from one batch of events.
    monkeypatch.setattr(queue, "FLUSH_SECONDS", 30.0)
    with scripted_server("scripted") as (url, say):
        say(PARIS + "\n" + ROME, ASK, [WEATHER])
        chunks = list(openai_client(url).chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER],
                                                                 max_tokens=200, stream=True))
    calls = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
    assert [(tc.index, json.loads(tc.function.arguments)["city"]) for tc in calls] == [(0, "Paris"), (1, "Rome")]


BROKEN_SCHEMA = {"type": "object", "properties": {"a": {"type": "strin"}}}  # "strin": no type


@pytest.mark.parametrize("path, body, says", [
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": 4, "tool_choice": "required", "tools": [
        WEATHER, {"type": "function", "function": {"name": "broken", "parameters": BROKEN_SCHEMA}}]},
     "tools[1].function.parameters was refused: "),
    # the Responses' tools are flat, and those the model is not shown (web_search) take places too
    ("/v1/responses", {"input": "hi", "max_output_tokens": 4, "tool_choice": "required", "tools": [
        {"type": "web_search"}, {"type": "namespace", "name": "geo", "tools": [
            {"type": "function", "name": "ok"}, {"type": "function", "name": "broken", "parameters": BROKEN_SCHEMA}]}]},
     "tools[1].tools[1].parameters was refused: "),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 4, "tools": [
        {"type": "web_search"}, {"type": "function", "name": "get weather"}]},
     "tools[1].name must be 1-64 letters, digits, _ or -, got 'get weather'"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 4, "tools": [
        {"type": "function", "name": "f"}, {"type": "function", "name": "f"}]},
     "tools[1].name 'f' is given twice"),
    ("/v1/messages", {"messages": ASK, "max_tokens": 4, "tool_choice": {"type": "any"}, "tools": [
        {"name": "broken", "input_schema": BROKEN_SCHEMA}]}, "tools[0].input_schema was refused: "),
])
def test_a_tool_s_bad_schema_or_name_is_named_in_each_api_s_terms(served, path, body, says):
    """The schema of a forced call is read when its grammar is built, in the worker: its error
    names the tool, as the request has it, on every route (not a response_format never sent)."""
    r = httpx.post(f"{served[0]}{path}", json=dict({"model": "scripted"}, **body), timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert says in error["message"] and "response_format" not in error["message"], error
    assert error.get("param", "tools") == "tools"  # (Anthropic's errors have no param)

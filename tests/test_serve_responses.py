"""OpenAI's Responses API (POST /v1/responses) through the official client: text, streaming events,
function calls and their outputs in the next turn, structured output, reasoning, and errors."""

import json
import re

import httpx
import pytest

from serve_helpers import TIMEOUT, built_events, openai_client, running_server, scripted_server, tiny_engine
from test_reasoning import scripted_thinker

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
PARIS = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.fixture(scope="module")
def served():
    with running_server(tiny_engine(drafter="ngram"), model_id="t") as (url, _):
        yield url, tiny_engine()


@pytest.fixture(scope="module")
def scripted():
    with scripted_server("s") as served:
        yield served


def test_a_response_is_the_chat_answer_with_instructions_as_the_system_message(served):
    url, ref = served
    client = openai_client(url)
    r = client.responses.create(model="t", instructions="Be brief.", input="Tell me about rivers.",
                                max_output_tokens=20, temperature=0.8, extra_body={"seed": 3})
    want = ref.generate([{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Tell me about rivers."}], max_tokens=20, temperature=0.8, seed=3)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == want.text and [item.type for item in r.output] == ["message"]
    if want.finish_reason == "length":
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    else:
        assert r.status == "completed" and r.incomplete_details is None
    assert (r.usage.input_tokens, r.usage.output_tokens) == (want.stats.prompt_tokens, want.stats.tokens)
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.model_extra["mlxspec"]["drafter"] == "ngram"


def test_the_response_echoes_the_sampling_it_was_answered_with(served):
    client = openai_client(served[0])
    r = client.responses.create(model="t", input="Hi", max_output_tokens=2, store=False)
    assert (r.temperature, r.top_p) == (0.0, 1.0)  # the server's defaults (greedy), not null
    r = client.responses.create(model="t", input="Hi", max_output_tokens=2, temperature=0.7, top_p=0.9, store=False)
    assert (r.temperature, r.top_p) == (0.7, 0.9)


def test_the_stream_s_events_spell_the_same_answer(served):
    url, _ = served
    client = openai_client(url)
    ask = [{"role": "user", "content": [{"type": "input_text", "text": "Tell me about the sea."}]}]
    whole = client.responses.create(model="t", input=ask, max_output_tokens=24)
    events = list(client.responses.create(model="t", input=ask, max_output_tokens=24, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens
    # one message, one text part: every event about it says index 0; cut by the limit, it is incomplete
    assert {e.content_index for e in events if hasattr(e, "content_index")} == {0}
    assert {e.output_index for e in events if hasattr(e, "output_index")} == {0}
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.status for i in done] == [whole.output[0].status] == ["incomplete"]
    assert events[-1].response.output[0].status == "incomplete"


def test_function_calls_and_their_outputs_in_the_next_turn(scripted):
    url, say = scripted
    client = openai_client(url)
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    say(PARIS, ask, [CHAT_WEATHER])
    r = client.responses.create(model="s", input=ask, tools=[WEATHER], max_output_tokens=100)
    (call,), first_id = r.output, r.id
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert r.status == "completed" and call.call_id.startswith("call_")
    streamed = list(client.responses.create(model="s", input=ask, tools=[WEATHER], max_output_tokens=100, stream=True))
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == {"city": "Paris"}
    assert streamed[-1].type == "response.completed" and streamed[-1].response.output[0].name == "get_weather"
    # The next turn: the call and its output go back as input items, as the client keeps them.
    turn = ask + [{"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
                  {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"}]
    as_chat = ask + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 24 C"}]
    say("It is sunny in Paris.", as_chat, [CHAT_WEATHER])
    r = client.responses.create(model="s", input=turn, tools=[WEATHER], max_output_tokens=100)
    assert r.output_text == "It is sunny in Paris." and r.status == "completed"
    # The same turn continuing the stored response: only the call's output is sent.
    r = client.responses.create(model="s", previous_response_id=first_id, tools=[WEATHER], max_output_tokens=100,
                                input=turn[-1:])
    assert r.output_text == "It is sunny in Paris."


def test_text_before_a_call_is_a_message_item_before_the_call_whole_or_streamed(scripted):
    url, say = scripted
    client = openai_client(url)
    ask = [{"role": "user", "content": "Weather in Rome?"}]
    say("Let me check. " + PARIS, ask, [CHAT_WEATHER])
    r = client.responses.create(model="s", input=ask, tools=[WEATHER], max_output_tokens=100)
    assert [item.type for item in r.output] == ["message", "function_call"]
    assert r.output_text == "Let me check." and r.output[1].name == "get_weather"
    streamed = list(client.responses.create(model="s", input=ask, tools=[WEATHER], max_output_tokens=100, stream=True))
    assert [item.type for item in streamed[-1].response.output] == ["message", "function_call"]
    assert streamed[-1].response.output_text == r.output_text


def test_namespaced_functions_are_offered_and_tools_run_by_openai_left_out(scripted):
    """As Codex sends them: a namespace of functions (its calls name it) and web_search, which
    only OpenAI runs (the model is not shown it, and the request still works)."""
    url, say = scripted
    ask = [{"role": "developer", "content": "You are a helper."}, {"role": "user", "content": "Weather in Paris?"}]
    say(PARIS, [{"role": "system", "content": "You are a helper."}, ask[1]], [CHAT_WEATHER])
    tools = [{"type": "web_search"}, {"type": "namespace", "name": "geo", "description": "Places", "tools": [WEATHER]}]
    r = openai_client(url).responses.create(model="s", input=ask, tools=tools, max_output_tokens=100)
    (call,) = r.output
    assert call.name == "get_weather" and call.namespace == "geo" and json.loads(call.arguments) == {"city": "Paris"}
    assert r.model_extra["mlxspec"]["tools_left_out"] == ["web_search"]


def test_previous_response_id_continues_a_stored_conversation(served):
    """The earlier input and answer come first, not the earlier instructions; store false keeps
    nothing; GET /v1/responses/{id} gives a stored response back."""
    url, ref = served
    client = openai_client(url)
    first = client.responses.create(model="t", instructions="Be brief.", input="Tell me about rivers.",
                                    max_output_tokens=8)
    second = client.responses.create(model="t", previous_response_id=first.id, input="And the sea?",
                                     max_output_tokens=8)
    chat = [{"role": "user", "content": "Tell me about rivers."}, {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And the sea?"}]
    want = ref.generate(chat, max_tokens=8)
    assert second.output_text == want.text and second.usage.input_tokens == want.stats.prompt_tokens
    assert second.previous_response_id == first.id and second.store is True
    streamed = list(client.responses.create(model="t", previous_response_id=second.id, input="Why?",
                                            max_output_tokens=4, stream=True))
    want = ref.generate(chat + [{"role": "assistant", "content": second.output_text},
                                {"role": "user", "content": "Why?"}], max_tokens=4)
    assert streamed[-1].response.output_text == want.text
    fetched = httpx.get(f"{url}/v1/responses/{second.id}", timeout=TIMEOUT).json()
    assert fetched["id"] == second.id and fetched["output"][0]["content"][0]["text"] == second.output_text
    assert httpx.get(f"{url}/v1/responses/resp_nope", timeout=TIMEOUT).status_code == 404
    unstored = client.responses.create(model="t", input="Hi", max_output_tokens=2, store=False)
    r = httpx.post(f"{url}/v1/responses", json={"model": "t", "input": "x", "previous_response_id": unstored.id},
                   timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "previous_response_id"


def test_input_tokens_counts_the_prompt_a_response_of_the_same_body_reads(scripted):
    """POST /v1/responses/input_tokens (the client's responses.input_tokens.count): the stored
    conversation, instructions and tools counted as `usage.input_tokens` counts them, nothing answered."""
    url, _ = scripted
    client = openai_client(url)
    first = client.responses.create(model="t", input="Tell me about rivers.", max_output_tokens=6)
    tools = [{"type": "web_search"}, WEATHER]  # (the model is shown the function alone)
    for body in ({"input": "Hi", "instructions": "Be brief."},
                 {"input": "And the sea?", "previous_response_id": first.id, "tools": tools},
                 {"input": [{"role": "developer", "content": "Be kind."}, {"role": "user", "content": "Hi"}],
                  "reasoning": {"effort": "low"}}):
        counted = client.responses.input_tokens.count(model="t", **body)
        answered = client.responses.create(model="t", max_output_tokens=2, store=False, **body)
        assert counted.object == "response.input_tokens" and counted.input_tokens == answered.usage.input_tokens
    assert counted.input_tokens != client.responses.input_tokens.count(model="t", input="Hi").input_tokens
    stored = httpx.get(f"{url}/v1/responses/{first.id}/input_items", timeout=TIMEOUT).json()["data"]
    assert len(stored) == 1  # counting stored nothing, and did not add to the conversation
    r = httpx.post(f"{url}/v1/responses/input_tokens", json={"model": "t", "input": "x", "tools": [
        {"type": "function", "name": "bad name"}]}, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("tools[0].name must be"), r.text
    r = httpx.post(f"{url}/v1/responses/input_tokens", json={"model": "t", "input": "x", "previous_response_id":
                                                             "resp_nope"}, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "previous_response_id", r.text
    r = httpx.post(f"{url}/v1/responses/input_tokens", json={"model": "t", "input": "x", "max_tokens": 5},
                   timeout=TIMEOUT)  # read here as at /v1/responses: another API's name is told
    assert r.status_code == 400 and "send max_output_tokens instead" in r.json()["error"]["message"], r.text
    from mlxspec.serve import fields

    assert fields.unread("/v1/responses/input_tokens", {"input": "x", "truncation": "auto", "n": 2}) == ["n"]


def test_text_format_makes_the_answer_follow_a_schema(served):
    url, _ = served
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = openai_client(url).responses.create(
        model="t", input="Is the sea wet? JSON.", max_output_tokens=60,
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}})
    assert set(json.loads(r.output_text)) == {"ok"}


def test_a_thinking_model_s_reasoning_is_a_reasoning_item():
    ask = [{"role": "user", "content": "What is 2 + 2?"}]
    with running_server(scripted_thinker("Add them.</think>It is 4.", ask), model_id="thinker") as (url, _):
        client = openai_client(url)
        r = client.responses.create(model="thinker", input=ask, max_output_tokens=60)
        assert [item.type for item in r.output] == ["reasoning", "message"]
        assert r.output[0].content[0].text == "Add them." and r.output_text == "It is 4."
        assert r.usage.output_tokens_details.reasoning_tokens == len("Add them.")  # byte tokens
        events = list(client.responses.create(model="thinker", input=ask, max_output_tokens=60, stream=True))
        assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "Add them."
        assert [item.type for item in events[-1].response.output] == ["reasoning", "message"]
        assert events[-1].response.usage.output_tokens_details.reasoning_tokens == len("Add them.")
        # logprobs cover every generated token, reasoning included, as chat's do
        r = client.responses.create(model="thinker", input=ask, max_output_tokens=60, include=LOGPROBS)
        assert "".join(lp.token for lp in r.output[-1].content[0].logprobs) == "Add them.</think>It is 4."


LOGPROBS = ["message.output_text.logprobs"]


@pytest.mark.parametrize("stream", [False, True])
def test_include_asks_for_logprobs_and_top_logprobs_sizes_their_alternatives(served, stream):
    url, ref = served
    client = openai_client(url)
    ask = [{"role": "user", "content": "Tell me a long story about rivers and the sea."}]
    expected = ref.generate(ask, max_tokens=12, logprobs=3)
    asked = dict(model="t", input=ask, max_output_tokens=12, include=LOGPROBS, top_logprobs=3)
    if stream:
        events = list(client.responses.create(stream=True, **asked))
        deltas = [e for e in events if e.type == "response.output_text.delta"]
        done = next(e for e in events if e.type == "response.output_text.done")
        r = events[-1].response
        # each delta carries the logprobs of the tokens its text came from, the done event all of them
        carried = [(lp.token, lp.logprob) for e in deltas for lp in e.logprobs]
        whole = [(lp.token, lp.logprob) for lp in done.logprobs]
        assert whole == [(lp.token, lp.logprob) for lp in r.output[0].content[0].logprobs]
        assert carried == whole[:len(carried)] and len(carried) >= len(whole) - 1  # the last may wait for the end
    else:
        r = client.responses.create(**asked)
    logprobs = r.output[0].content[0].logprobs
    assert r.output_text == expected.text and r.top_logprobs == 3
    assert [lp.logprob for lp in logprobs] == pytest.approx(expected.logprobs, abs=1e-5)
    assert "".join(lp.token for lp in logprobs) == r.output_text  # they spell the text
    assert all(len(lp.top_logprobs) == 3 and lp.top_logprobs[0].logprob >= lp.logprob - 1e-6 for lp in logprobs)
    # without include, none (as OpenAI's API: top_logprobs alone gives an empty list, and the log says why)
    plain = client.responses.create(model="t", input=ask, max_output_tokens=4, top_logprobs=3)
    assert plain.output[0].content[0].logprobs == []


@pytest.mark.parametrize("body, param, says", [
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id", "responses it answered with store "
     "true, in memory"),
    ({"input": "hi", "conversation": "conv_1"}, "conversation", "not supported"),
    ({"input": []}, "input", "non-empty list"),
    ({"input": [{"type": "image_generation_call"}]}, "input[0]", "not supported"),
    ({"input": "hi", "tools": [{"type": "namespace", "name": "x", "tools": 5}]}, "tools[0]", "list of function"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens", ">= 1"),
    ({"input": "hi", "temperature": 2.5}, "temperature", "in 0..2"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role",
     "input[0].role must be one of user, assistant, system, developer, got 'wizard'"),
    ({"input": "hi", "text": {"format": {"type": "json_schema"}}}, "text.format", "json_schema"),
    ({"input": "hi", "instructions": 5}, "instructions", "must be a string"),
    ({"input": "hi", "include": "message.output_text.logprobs"}, "include", "list of strings"),
    ({"input": "hi", "include": LOGPROBS, "top_logprobs": 21}, "top_logprobs", "0..20"),
    ({"input": "hi", "top_logprobs": -1}, "top_logprobs", "0..20"),
])
def test_bad_requests_are_400_in_the_responses_terms(served, body, param, says):
    r = httpx.post(f"{served[0]}/v1/responses", json=dict({"model": "t"}, **body), timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"], error


def test_a_stream_that_fails_ends_with_an_error_event():
    from mlxspec.serve.errors import APIError
    from mlxspec.serve.responses_output import ResponseBuilder

    builder = ResponseBuilder("t", {})
    builder.start(3)
    name, data = builder.error(APIError(500, "the engine failed", code="engine_error")).decode().strip().split("\n")
    assert name == "event: error"
    assert json.loads(data[len("data: "):]) == {"type": "error", "sequence_number": 2, "code": "engine_error",
                                                "message": "the engine failed", "param": None}


def test_the_store_keeps_the_last_responses_only():
    from mlxspec.serve.response_store import ResponseStore

    store = ResponseStore(size=2)
    for i in range(3):
        output = [{"type": "message", "content": [{"type": "output_text", "text": f"answer {i}"}]}]
        store.remember({"id": f"resp_{i}", "output": output}, [{"role": "user", "content": f"q {i}"}])
    assert store.conversation("resp_2") == [{"role": "user", "content": "q 2"},
                                            {"role": "assistant", "content": "answer 2"}]
    assert store.get("resp_1")["id"] == "resp_1"
    with pytest.raises(Exception, match="not stored here"):
        store.conversation("resp_0")


def _remember(store, i):
    output = [{"type": "message", "content": [{"type": "output_text", "text": f"answer {i}"}]}]
    store.remember({"id": f"resp_{i}", "output": output}, [{"role": "user", "content": f"q {i}"}])


def test_a_folder_gives_back_the_store_in_the_order_it_was_stored(tmp_path, caplog):
    # ids are random and files a few milliseconds apart share a time: neither says the order
    from mlxspec.serve.response_store import ResponseStore

    store = ResponseStore(size=3, folder=tmp_path)
    for i in ("c", "a", "b"):
        _remember(store, i)
    assert "kept in memory only" not in caplog.text
    again = ResponseStore(size=2, folder=tmp_path)  # a smaller store: the oldest leaves, file and all
    assert list(again._items) == ["resp_a", "resp_b"] and not (tmp_path / "resp_c.json").exists()
    _remember(again, "d")
    assert list(ResponseStore(size=2, folder=tmp_path)._items) == ["resp_b", "resp_d"]


def test_a_folder_keeps_the_store_across_restarts(tmp_path, caplog):
    from mlxspec.serve.response_store import ResponseStore

    store = ResponseStore(size=2, folder=tmp_path / "responses")  # made when missing
    for i in range(3):
        _remember(store, i)
    assert sorted(p.name for p in (tmp_path / "responses").iterdir()) == ["resp_1.json", "resp_2.json"]
    (tmp_path / "responses" / "resp_9.json").write_text('{"response": {"id": "resp_9"')  # cut short
    again = ResponseStore(size=2, folder=tmp_path / "responses")
    assert again.conversation("resp_2") == store.conversation("resp_2") and again.get("resp_1")["id"] == "resp_1"
    assert "skipping" in caplog.text and "resp_9.json" in caplog.text  # read past, left alone
    again.delete("resp_1")
    assert not (tmp_path / "responses" / "resp_1.json").exists()
    with pytest.raises(Exception, match="not stored here"):
        again.get("resp_1")
    _remember(again, 3)  # the oldest left goes first, file and all
    assert ResponseStore(size=2, folder=tmp_path / "responses").conversation("resp_3")[-1]["content"] == "answer 3"


def test_files_that_are_not_this_server_s_stored_responses_are_read_past(tmp_path, caplog):
    from mlxspec.serve.errors import APIError
    from mlxspec.serve.response_store import ResponseStore

    good = {"order": 1, "response": {"id": "resp_old", "output": []}, "conversation": []}  # (before input items)
    files = {"resp_old": good,
             "resp_moved": dict(good, response={"id": "resp_other"}),
             "resp_talk": dict(good, response={"id": "resp_talk"}, conversation={"role": "user"}),
             "resp_late": dict(good, response={"id": "resp_late"}, order="2"),
             "resp_items": dict(good, response={"id": "resp_items"}, input={"type": "message"})}
    for name, data in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    store = ResponseStore(folder=tmp_path)
    assert list(store._items) == ["resp_old"] and store.input_items("resp_old") == []
    for name in ("resp_moved", "resp_talk", "resp_late", "resp_items"):
        assert f"skipping {tmp_path / name}.json: not a stored response of this server" in caplog.text
        assert (tmp_path / f"{name}.json").exists()  # left as it is
    for kept, where in ((store, f"in {tmp_path}"), (ResponseStore(), "in memory")):
        with pytest.raises(APIError, match=re.escape(f"answered with store true are, {where})")):
            kept.get("resp_nope")


def test_a_store_that_cannot_write_keeps_answering_from_memory(tmp_path, monkeypatch, caplog):
    import tempfile

    from mlxspec.serve.response_store import ResponseStore

    store = ResponseStore(folder=tmp_path)

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", full)
    _remember(store, 0)
    assert store.get("resp_0")["id"] == "resp_0" and "kept in memory only" in caplog.text
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_stored_responses_outlive_the_server_and_can_be_deleted(tmp_path):
    folder = str(tmp_path / "responses")
    with running_server(tiny_engine(drafter="ngram"), model_id="t", responses_dir=folder) as (url, _):
        first = openai_client(url).responses.create(model="t", input="Tell me about rivers.", max_output_tokens=6)
    with running_server(tiny_engine(drafter="ngram"), model_id="t", responses_dir=folder) as (url, _):
        client = openai_client(url)
        second = client.responses.create(model="t", previous_response_id=first.id, input="And the sea?",
                                         max_output_tokens=6)
        chat = [{"role": "user", "content": "Tell me about rivers."},
                {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "And the sea?"}]
        assert second.output_text == tiny_engine().generate(chat, max_tokens=6).text
        assert httpx.get(f"{url}/v1/responses/{first.id}", timeout=TIMEOUT).json()["id"] == first.id
        r = httpx.delete(f"{url}/v1/responses/{first.id}", timeout=TIMEOUT)
        assert r.status_code == 200 and r.json() == {"id": first.id, "object": "response", "deleted": True}
        assert httpx.get(f"{url}/v1/responses/{first.id}", timeout=TIMEOUT).status_code == 404
        client.responses.delete(second.id)  # the official client's call
        r = httpx.delete(f"{url}/v1/responses/{second.id}", timeout=TIMEOUT)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert f"in {folder}" in r.json()["error"]["message"]  # where this server keeps them
    assert list((tmp_path / "responses").glob("*.json")) == []


def test_a_response_echoes_the_request_s_settings_or_openai_s_defaults():
    from mlxspec.serve.responses_output import ResponseBuilder

    shown = ResponseBuilder("t", {}).response("stop", None, None)
    assert {key: shown[key] for key in ("parallel_tool_calls", "tools", "tool_choice", "text", "metadata", "store",
                                        "truncation", "status", "incomplete_details")} == {
        "parallel_tool_calls": True, "tools": [], "tool_choice": "auto", "text": {"format": {"type": "text"}},
        "metadata": {}, "store": True, "truncation": "disabled", "status": "completed", "incomplete_details": None}
    sent = {"parallel_tool_calls": False, "tools": [{"type": "function", "name": "f", "parameters": {}}],
            "tool_choice": "required", "text": {"format": {"type": "json_object"}}, "metadata": {"user": "ann"},
            "store": False}
    echoed = ResponseBuilder("t", sent).response("length", None, None)
    assert {key: echoed[key] for key in sent} == sent
    assert echoed["status"] == "incomplete" and echoed["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_empty_streamed_answer_is_one_empty_message_and_one_after_a_call_is_none():
    from mlxspec.serve.responses_output import ResponseBuilder
    from mlxspec.stats import GenerationStats

    builder = ResponseBuilder("t", {})
    events = built_events(builder.finish("stop", None, GenerationStats()))
    assert [e["type"] for e in events] == ["response.output_item.added", "response.content_part.added",
                                           "response.output_text.done", "response.content_part.done",
                                           "response.output_item.done", "response.completed"]
    assert [(item["type"], item["content"][0]["text"]) for item in events[-1]["response"]["output"]] == [
        ("message", "")]
    builder = ResponseBuilder("t", {})
    call = {"id": "call_1", "function": {"name": "f", "arguments": "{}"}}
    events = built_events(builder.feed("Think.", "", [call]) + builder.finish("stop", None, GenerationStats()))
    delta = next(e for e in events if e["type"] == "response.reasoning_text.delta")
    assert (delta["output_index"], delta["content_index"], delta["delta"]) == (0, 0, "Think.")
    done = next(e for e in events if e["type"] == "response.reasoning_text.done")
    assert (done["output_index"], done["content_index"], done["text"]) == (0, 0, "Think.")
    assert [item["type"] for item in events[-1]["response"]["output"]] == ["reasoning", "function_call"]


def test_input_items_become_chat_messages_a_turn_s_calls_in_one():
    from mlxspec.serve.responses_api import to_chat

    def call(i):
        return {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": f'{{"n": {i}}}'}

    def as_chat(i):
        return {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": f'{{"n": {i}}}'}}

    given = [{"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "text", "text": "b"}]},
             call(1), call(2),
             {"type": "function_call_output", "call_id": "c1", "output": [{"type": "output_text", "text": "one"}]},
             {"type": "function_call_output", "call_id": "c2", "output": "two"},
             {"type": "reasoning", "id": "rs_1", "summary": []},
             {"type": "message", "role": "assistant", "content": "Let me look again."}, call(3), call(4)]
    chat, conversation = to_chat({"input": given, "reasoning": {"effort": "low"}})
    assert chat["messages"] == conversation == [
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": None, "tool_calls": [as_chat(1), as_chat(2)]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "assistant", "content": "Let me look again."},
        {"role": "assistant", "content": None, "tool_calls": [as_chat(3), as_chat(4)]}]  # (not in the text's)
    assert chat["reasoning_effort"] == "low"
    assert "reasoning_effort" not in to_chat({"input": "hi", "reasoning": {"summary": "auto"}})[0]


@pytest.mark.parametrize("body, param", [
    ({"input": "hi", "reasoning": "low"}, "reasoning"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "message", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": 5}]}, "input[0].output"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}]},
     "input[0].output[0]"),
    ({"input": [{"role": "user", "content": ["hi"]}]}, "input[0].content[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]}, "input[0].content[0]")])
def test_input_a_chat_cannot_hold_is_refused_naming_where(body, param):
    from mlxspec.serve.errors import APIError
    from mlxspec.serve.responses_api import to_chat

    with pytest.raises(APIError) as e:
        to_chat(body)
    assert e.value.status == 400 and e.value.param == param


def test_tool_choice_in_the_responses_shape_or_chat_s_is_chat_s():
    from mlxspec.serve.responses_api import to_chat

    def chosen(choice):
        return to_chat({"input": "hi", "tool_choice": choice})[0]["tool_choice"]

    named = {"type": "function", "function": {"name": "f"}}
    assert chosen({"type": "function", "name": "f"}) == named and chosen(named) == named
    custom = {"type": "custom", "name": "f"}
    assert chosen("required") == "required" and chosen(custom) == custom  # (the chat path says what is wrong)
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [named]}}
    assert chosen({"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "f"}]}) == allowed
    assert chosen(allowed) == allowed

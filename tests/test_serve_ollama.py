"""Ollama's API (POST /api/chat, /api/generate; GET /api/tags, /api/ps, /api/version; POST
/api/show) through the official `ollama` client: the same answers as the chat and completions
paths, JSON lines, options, formats, tools, thinking, fill in the middle, logprobs and errors."""

import json
import time

import httpx
import pytest

import tiny
from mlxspec.engine import Engine
from mlxspec.serve import ollama as ol
from serve_helpers import TIMEOUT, openai_client, running_server, scripted_server, tiny_engine
from test_fim import PREFIX, SUFFIX, area_coder
from test_grammar import MOOD
from test_reasoning import scripted_thinker

ollama = pytest.importorskip("ollama")

ASK = [{"role": "user", "content": "Tell me about rivers."}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
PARIS = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.fixture(scope="module")
def served():
    with running_server(tiny_engine(drafter="ngram"), model_id="t") as (url, _):
        yield ollama.Client(host=url, timeout=TIMEOUT), url, tiny_engine()


def test_a_chat_is_the_chat_answer_under_the_name_asked_for(served):
    client, url, ref = served
    r = client.chat(model="river:latest", messages=ASK, options={"num_predict": 20, "temperature": 0.8, "seed": 4})
    want = ref.generate(ASK, max_tokens=20, temperature=0.8, seed=4)
    assert r.message.role == "assistant" and r.message.content == want.text and r.model == "river:latest"
    assert r.done and r.done_reason == {"length": "length", "stop": "stop"}[want.finish_reason]
    assert (r.prompt_eval_count, r.eval_count) == (want.stats.prompt_tokens, want.stats.tokens)
    assert r.total_duration >= r.eval_duration > 0 and r.prompt_eval_duration > 0
    t0 = time.perf_counter_ns()
    body = httpx.post(f"{url}/api/chat", json={"model": "t", "messages": ASK, "stream": False}, timeout=TIMEOUT).json()
    assert body["total_duration"] <= time.perf_counter_ns() - t0 and body["load_duration"] == 0
    spent = body["mlxspec"]  # how speculation went (the client keeps Ollama's fields only)
    assert spent["drafter"] == "ngram"
    assert (body["prompt_eval_duration"], body["eval_duration"]) == (int(spent["prompt_seconds"] * 1e9),
                                                                     int(spent["seconds"] * 1e9))


def test_the_stream_is_json_lines_spelling_the_same_answer(served):
    client, url, _ = served
    whole = client.chat(model="t", messages=ASK, options={"num_predict": 24})
    parts = list(client.chat(model="t", messages=ASK, options={"num_predict": 24}, stream=True))
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True] and len(parts) > 2
    assert parts[-1].eval_count == whole.eval_count and parts[-1].done_reason == "length"
    # Ollama's default is to stream: one JSON object per line
    with httpx.stream("POST", f"{url}/api/chat", json={"model": "t", "messages": ASK, "options": {"num_predict": 8}},
                      timeout=TIMEOUT) as r:
        assert r.headers["content-type"] == "application/x-ndjson"
        lines = list(r.iter_lines())
    bodies = [json.loads(line) for line in lines]
    assert bodies[-1]["done"] is True and all(b["done"] is False for b in bodies[:-1])


def test_generate_is_a_chat_of_system_and_prompt_and_raw_is_the_prompt_as_it_is(served):
    client, url, ref = served
    r = client.generate(model="t", system="Be brief.", prompt="Name a river.", options={"num_predict": 16})
    want = ref.generate([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a river."}],
                        max_tokens=16)
    assert r.response == want.text and r.prompt_eval_count == want.stats.prompt_tokens
    raw = client.generate(model="t", prompt="Rivers run", raw=True, options={"num_predict": 16})
    want = ref.generate("Rivers run", max_tokens=16)
    assert raw.response == want.text and raw.prompt_eval_count == want.stats.prompt_tokens
    streamed = client.generate(model="t", prompt="Rivers run", raw=True, options={"num_predict": 16}, stream=True)
    assert "".join(p.response for p in streamed) == raw.response
    # null is false, as Ollama's server (Go) reads it for its booleans
    body = {"model": "t", "prompt": "Name a river.", "raw": None, "logprobs": None, "stream": False,
            "options": {"num_predict": 16}}
    r = httpx.post(f"{url}/api/generate", json=body, timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["response"] == client.generate(
        model="t", prompt="Name a river.", options={"num_predict": 16}).response


def test_a_base_model_s_prompt_is_taken_as_it_is():
    tok = tiny.make_tokenizer(chat_template=None)
    engine = Engine(tiny.make_llama(0, tie_embeddings=False), tok)
    want = tiny_engine().generate("Rivers run", max_tokens=12).text
    with running_server(engine, model_id="base") as (url, _):
        client = ollama.Client(host=url, timeout=TIMEOUT)
        assert client.generate(model="base", prompt="Rivers run", options={"num_predict": 12}).response == want
        with pytest.raises(ollama.ResponseError, match="no chat template"):  # a chat needs one
            client.chat(model="base", messages=ASK)


def test_options_are_the_engine_s_settings(served):
    client, _, ref = served
    r = client.chat(model="t", messages=ASK, options={"num_predict": 30, "repeat_penalty": 1.5, "repeat_last_n": 8})
    want = ref.generate(ASK, max_tokens=30, repetition_penalty=1.5, repetition_context_size=8)
    plain = ref.generate(ASK, max_tokens=30)
    assert r.message.content == want.text != plain.text  # (the penalty changed the answer)
    r = client.chat(model="t", messages=ASK, options={"num_predict": 30, "repeat_penalty": 1.5})
    assert r.message.content == ref.generate(ASK, max_tokens=30, repetition_penalty=1.5,
                                             repetition_context_size=ol.REPEAT_LAST_N).text
    r = client.chat(model="t", messages=ASK, options={"num_predict": 30, "repeat_penalty": 1.5, "repeat_last_n": 0})
    assert r.message.content == plain.text  # Ollama's "off"
    stop = plain.text[10:12]
    r = client.chat(model="t", messages=ASK, options={"num_predict": 30, "stop": [stop], "num_ctx": 2048,
                                                      "num_thread": 4})  # (the runner's settings change nothing)
    assert r.message.content == ref.generate(ASK, max_tokens=30, stop=[stop]).text and r.done_reason == "stop"
    top = client.chat(model="t", messages=ASK, options={"num_predict": 12, "temperature": 1, "top_k": 3, "top_p": 0.9,
                                                        "min_p": 0.05, "seed": 7})
    assert top.message.content == ref.generate(ASK, max_tokens=12, temperature=1, top_k=3, top_p=0.9, min_p=0.05,
                                               seed=7).text


def test_no_limit_is_the_end_of_the_answer():
    with scripted_server() as (url, say):
        say("Rivers flow to the sea.", ASK)
        client = ollama.Client(host=url, timeout=TIMEOUT)
        for limit in (-1, -2):
            r = client.chat(model="s", messages=ASK, options={"num_predict": limit})
            assert r.message.content == "Rivers flow to the sea." and r.done_reason == "stop"


def test_format_is_the_response_format_of_the_chat_path(served):
    client, url, _ = served
    chat = openai_client(url)
    for fmt, response_format in (("json", {"type": "json_object"}), (MOOD["json_schema"]["schema"], MOOD)):
        r = client.chat(model="t", messages=ASK, format=fmt, options={"num_predict": 120})
        want = chat.chat.completions.create(model="t", messages=ASK, max_tokens=120, response_format=response_format)
        assert r.message.content == want.choices[0].message.content
        assert isinstance(json.loads(r.message.content), dict)
    assert set(json.loads(r.message.content)) == {"ok", "mood"}


def test_tool_calls_and_the_tool_s_answer_in_the_next_turn():
    with scripted_server() as (url, say):
        client = ollama.Client(host=url, timeout=TIMEOUT)
        say("Let me look.\n" + PARIS, ASK, tools=[WEATHER])
        r = client.chat(model="s", messages=ASK, tools=[WEATHER])
        assert r.message.content == "Let me look." and r.done_reason == "stop"
        (call,) = r.message.tool_calls
        assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
        parts = list(client.chat(model="s", messages=ASK, tools=[WEATHER], stream=True))
        calls = [c for p in parts for c in p.message.tool_calls or []]
        assert [c.function.arguments for c in calls] == [{"city": "Paris"}]
        # the next turn, as the client sends it back: the call without an id, the answer by the tool's name
        turn = ASK + [r.message.model_dump(exclude_none=True),
                      {"role": "tool", "content": "Sunny, 24 C", "tool_name": "get_weather"}]
        paris = {"name": "get_weather", "arguments": {"city": "Paris"}}
        as_chat = ASK + [{"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1_0", "type": "function", "function": paris}]},
            {"role": "tool", "tool_call_id": "call_1_0", "content": "Sunny, 24 C"}]
        say("It is sunny.", as_chat, tools=[WEATHER])
        r = client.chat(model="s", messages=turn, tools=[WEATHER])
        assert r.message.content == "It is sunny." and not r.message.tool_calls


def test_a_tool_s_answer_is_paired_with_its_call_by_name():
    messages = ol._messages([
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "a", "arguments": {}}},
                                                           {"function": {"name": "b", "arguments": {}}}]},
        {"role": "tool", "content": "B", "tool_name": "b"}, {"role": "tool", "content": "A", "tool_name": "a"}])
    assert [c["id"] for c in messages[0]["tool_calls"]] == ["call_0_0", "call_0_1"]
    assert [(m["tool_call_id"], m["name"]) for m in messages[1:]] == [("call_0_1", "b"), ("call_0_0", "a")]
    # an id given is taken, and its call is answered: a later answer without a name takes the other
    messages = ol._messages([
        {"role": "assistant", "tool_calls": [{"id": "x", "function": {"name": "a", "arguments": {}}},
                                             {"id": "y", "function": {"name": "a", "arguments": {}}}]},
        {"role": "tool", "content": "1", "tool_call_id": "x"}, {"role": "tool", "content": "2"}])
    assert [m["tool_call_id"] for m in messages[1:]] == ["x", "y"]


def test_a_thinking_model_s_reasoning_is_its_thinking():
    ask = [{"role": "user", "content": "What is 2 + 2?"}]
    with running_server(scripted_thinker("Add them.</think>It is 4.", ask), model_id="thinker") as (url, _):
        client = ollama.Client(host=url, timeout=TIMEOUT)
        r = client.chat(model="thinker", messages=ask, options={"num_predict": 60})
        assert (r.message.thinking, r.message.content) == ("Add them.", "It is 4.")
        parts = list(client.chat(model="thinker", messages=ask, options={"num_predict": 60}, stream=True))
        assert "".join(p.message.thinking or "" for p in parts) == "Add them."
        assert "".join(p.message.content for p in parts) == "It is 4."
        g = client.generate(model="thinker", prompt="What is 2 + 2?", options={"num_predict": 60})
        assert (g.thinking, g.response) == ("Add them.", "It is 4.")
        assert "thinking" in client.show("thinker").capabilities


def test_think_false_is_the_template_s_enable_thinking_false():
    from test_reasoning import ASK as QUESTION, HYBRID, THINKING, VOCAB

    tok = tiny.make_tokenizer(HYBRID, added=THINKING)
    engine = Engine(tiny.make_llama(0, vocab_size=VOCAB), tok)
    with running_server(engine, model_id="hybrid") as (url, _):
        client = ollama.Client(host=url, timeout=TIMEOUT)
        counts = [client.chat(model="hybrid", messages=QUESTION, options={"num_predict": 2}, **kw).prompt_eval_count
                  for kw in ({}, {"think": True}, {"think": False})]
    off = engine.generate(QUESTION, max_tokens=2, chat_template_kwargs={"enable_thinking": False}).stats.prompt_tokens
    assert counts[0] == counts[1] < counts[2] == off


@pytest.mark.parametrize("context, limit", [(4096, 4096), (None, ol.UNBOUNDED)])
def test_no_limit_is_the_context_or_none(context, limit):
    for n in (-1, -2):
        assert ol.to_chat({"messages": ASK, "options": {"num_predict": n}}, context)[0]["max_tokens"] == limit


def test_suffix_fills_in_the_middle():
    with running_server(area_coder(), model_id="coder") as (url, _):
        client = ollama.Client(host=url, timeout=TIMEOUT)
        r = client.generate(model="coder", prompt=PREFIX, suffix=SUFFIX, options={"num_predict": 40})
        assert r.response == "3.14159 * r * r" and r.done_reason == "stop"
        assert "insert" in client.show("coder").capabilities


def test_logprobs_are_the_chat_path_s(served):
    client, url, _ = served
    r = client.chat(model="t", messages=ASK, options={"num_predict": 6}, logprobs=True, top_logprobs=2)
    want = openai_client(url).chat.completions.create(model="t", messages=ASK, max_tokens=6, logprobs=True,
                                                      top_logprobs=2).choices[0].logprobs.content
    # the same tokens; their logprobs alike up to float32 rounding (the two runs' passes may be shaped
    # otherwise: a cached prompt, other drafts), about 1e-6 of logits of a few units
    assert [e.token for e in r.logprobs] == [w.token for w in want]
    close = pytest.approx([w.logprob for w in want], abs=1e-4)
    assert [e.logprob for e in r.logprobs] == close
    assert [[t.token for t in e.top_logprobs] for e in r.logprobs] == [[t.token for t in w.top_logprobs] for w in want]
    parts = list(client.chat(model="t", messages=ASK, options={"num_predict": 6}, logprobs=True, stream=True))
    assert [e.logprob for p in parts for e in p.logprobs or []] == close


def test_the_model_is_described_as_ollama_describes_its_own(served):
    client, url, ref = served
    (listed,) = client.list().models
    assert listed.model == "t" and listed.details.family == "llama" and len(listed.digest) == 64
    shown = client.show("t")
    assert shown.modelinfo["general.architecture"] == "llama" and shown.modelinfo["llama.context_length"] == 4096
    assert shown.capabilities == ["completion"] and shown.details.parameter_size.endswith("K")
    assert shown.parameters.split("\n") == ["temperature 0", "num_predict 512", "num_ctx 4096"]
    assert shown.modelfile == "# served by mlxspec\nFROM t\n" and shown.template == ref.tokenizer.chat_template
    (loaded,) = client.ps().models
    assert loaded.model == "t" and loaded.context_length == 4096 and loaded.size_vram == loaded.size  # all of it
    assert httpx.post(f"{url}/api/show", json={"name": "t"}, timeout=TIMEOUT).json()["capabilities"] == \
        ["completion"]  # older clients' field
    for nameless in ({}, {"model": ""}):
        r = httpx.post(f"{url}/api/show", json=nameless, timeout=TIMEOUT)
        assert r.status_code == 400 and r.json() == {"error": "model must be the name of a model (this server "
                                                              "serves 't'), got " + ("None" if not nameless else "''")}
    assert httpx.get(f"{url}/api/version", timeout=TIMEOUT).json() == {"version": ol.VERSION}
    with scripted_server() as (scripted, _):
        assert ollama.Client(host=scripted, timeout=TIMEOUT).show("s").capabilities == ["completion", "tools"]


@pytest.mark.parametrize("n, written", [(134_515_008, "135M"), (7_615_616_512, "7.6B"), (1_500_000, "1.5M"),
                                        (1_000_000, "1.0M"), (1_500, "1.5K"), (999, "999")])
def test_parameter_counts_are_written_as_ollama_writes_them(n, written):
    assert ol._parameter_size(n) == written


def test_a_request_with_nothing_to_answer_loads_the_model(served):
    _, url, _ = served
    r = httpx.post(f"{url}/api/chat", json={"model": "t"}, timeout=TIMEOUT).json()
    assert (r["done"], r["done_reason"], r["message"]["content"]) == (True, "load", "")
    r = httpx.post(f"{url}/api/generate", json={"model": "t", "keep_alive": 0}, timeout=TIMEOUT).json()
    assert (r["done"], r["done_reason"], r["response"]) == (True, "unload", "")


@pytest.mark.parametrize("route, body, status, says", [
    ("chat", {"messages": ASK, "options": {"temperature": "hot"}}, 400, "options.temperature must be"),
    ("chat", {"messages": ASK, "options": {"num_predict": 0}}, 400, "options.num_predict must be an integer >= 1"),
    ("chat", {"messages": ASK, "options": {"repeat_penalty": 1.2, "repeat_last_n": -3}}, 400,
     "options.repeat_last_n must be an integer >= -1 (the last tokens repeat_penalty looks back over; -1: the "
     "whole context, 0: off), got -3"),
    ("chat", {"messages": ASK, "options": "warm"}, 400, "options must be an object"),
    ("chat", {"messages": ASK, "max_tokens": 5}, 400, "send options.num_predict instead"),
    ("chat", {"messages": [{"role": "user", "content": "Look", "images": ["aGk="]}]}, 400, "images are not supported"),
    ("chat", {"messages": ASK, "format": "yaml"}, 400, "format must be \"json\" or a JSON schema"),
    ("chat", {"messages": ASK, "options": {"repeat_penalty": 1.2, "repeat_last_n": True}}, 400,
     "options.repeat_last_n must be an integer >= -1"),
    ("chat", {"messages": ASK, "think": "very"}, 400, "think must be true, false"),
    ("chat", {"messages": ASK, "top_logprobs": 2}, 400, "top_logprobs needs \"logprobs\": true"),
    ("chat", {"messages": "hi"}, 400, "messages must be a list"),
    ("chat", {"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0].role must be one of"),
    # Ollama's calls: arguments an object, named in its terms (not OpenAI's string, nor an id it never sent)
    ("chat", {"messages": ASK + [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": [1]}}]}]}, 400,
     "messages[1].tool_calls[0].function.arguments must be an object (the call's arguments by name), got [1]"),
    ("chat", {"messages": ASK + [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": 5, "arguments": {}}}]}]}, 400,
     "messages[1].tool_calls[0].function.name must be the function's name (a string), got 5"),
    ("generate", {"prompt": "hi", "template": "{{ .Prompt }}"}, 400, "template is not supported"),
    ("generate", {"prompt": "hi", "context": [1, 2]}, 400, "context is not supported"),
    ("generate", {"prompt": 5}, 400, "prompt must be a string"),
    ("generate", {"prompt": "hi", "raw": "yes"}, 400, "raw must be true or false"),
    ("pull", {"model": "llama3"}, 404, "mlxspec pull"),
    ("create", {"model": "mine", "from": "t"}, 404, "this server serves one model"),
    ("embed", {"model": "t", "input": []}, 400, "input must be a non-empty string"),
    ("embeddings", {"model": "t", "prompt": ["hi"]}, 400, "prompt must be a string"),
])
def test_errors_take_ollama_s_shape(served, route, body, status, says):
    _, url, _ = served
    r = httpx.post(f"{url}/api/{route}", json=dict(body, model="t", stream=False), timeout=TIMEOUT)
    assert r.status_code == status and set(r.json()) == {"error"} and says in r.json()["error"], r.text
    r = httpx.get(f"{url}/api/chat", timeout=TIMEOUT)
    assert r.status_code == 405 and r.json() == {"error": "GET is not allowed on /api/chat: send POST"}


def test_a_route_not_served_lists_those_that_are(served):
    r = httpx.post(f"{served[1]}/api/version", timeout=TIMEOUT)  # the last route served
    assert r.status_code == 405 and r.json() == {"error": "POST is not allowed on /api/version: send GET"}
    r = httpx.delete(f"{served[1]}/api/delete", timeout=TIMEOUT)
    assert r.status_code == 404 and r.json()["error"].endswith(
        "its Ollama routes are POST /api/chat, POST /api/generate, GET /api/tags, POST /api/show, POST /api/embed, "
        "POST /api/embeddings, GET /api/ps, GET /api/version")


def test_the_client_raises_them_as_ollama_s_own(served):
    client = served[0]
    for kw, says in (({"options": {"num_predict": 0}}, "options.num_predict must be"), ({"think": "very"}, "think")):
        for stream in (False, True):
            with pytest.raises(ollama.ResponseError) as e:
                list(client.chat(model="t", messages=ASK, stream=True, **kw)) if stream else \
                    client.chat(model="t", messages=ASK, **kw)
            assert e.value.status_code == 400 and e.value.error.startswith(says)


def test_an_engine_failure_is_ollama_s_error_whole_or_streamed():
    from mlxspec.serve.errors import APIError
    from serve_helpers import poisonable_engine

    engine = poisonable_engine()
    engine.target_model.poisoned = True
    with running_server(engine, model_id="p") as (url, _):
        client = ollama.Client(host=url, timeout=TIMEOUT)
        for stream in (False, True):
            with pytest.raises(ollama.ResponseError) as e:
                list(client.chat(model="p", messages=ASK, stream=True)) if stream else client.chat(model="p",
                                                                                                   messages=ASK)
            assert e.value.status_code == 500 and "NaN" in e.value.error
    assert json.loads(ol.OllamaBuilder("p", "chat").error(APIError(503, "stopping"))) == {"error": "stopping"}


def test_ollama_s_fields_are_read_and_others_named_in_the_log():
    from mlxspec.serve import fields

    body = {"model": "t", "messages": ASK, "options": {}, "format": "json", "keep_alive": "5m", "think": False,
            "stream": False, "tools": [], "logprobs": True, "top_logprobs": 2}
    assert fields.unread("/api/chat", body) == []
    assert fields.unread("/api/chat", dict(body, n=2, response_format=None)) == ["n", "response_format"]
    generate = {"model": "t", "prompt": "x", "suffix": "y", "raw": True, "system": "s"}
    assert fields.unread("/api/generate", generate) == []
    assert fields.moved("/api/generate", {"prompt": "x", "temperature": 0.5}) == ("temperature", "options.temperature")


@pytest.mark.parametrize("last, context, size", [(-1, 4096, 4096), (-1, None, ol.UNBOUNDED), (1, 4096, 1)])
def test_repeat_last_n_minus_1_is_the_whole_context(last, context, size):
    chat, ignored = ol.to_chat({"messages": ASK, "options": {"repeat_penalty": 1.2, "repeat_last_n": last,
                                                             "num_ctx": 8192, "temperature": 0.5}}, context)
    assert chat["repetition_context_size"] == size and chat["repetition_penalty"] == 1.2
    assert ignored == ["num_ctx"]  # read: repeat_last_n and those that become a chat field


def test_generate_is_a_chat_unless_raw_or_the_model_has_no_template():
    assert ol.to_generate({"prompt": "hi"}, 64)[0] == "chat"
    kind, body, _ = ol.to_generate({"prompt": "hi", "raw": True, "logprobs": True}, 64)
    assert kind == "completion" and body["logprobs"] == 0 and body["prompt"] == "hi"  # no alternatives asked for
    kind, body, _ = ol.to_generate({"prompt": "hi", "logprobs": True, "top_logprobs": 3}, 64, templated=False)
    assert kind == "completion" and body["logprobs"] == 3 and "top_logprobs" not in body


def test_only_an_assistant_s_list_of_calls_is_read_as_calls():
    """Anything else goes on as it came, for the chat path to say what is wrong with it."""
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    given = [{"role": "user", "content": "a", "tool_calls": [call]},
             {"role": "assistant", "content": "b", "tool_calls": "soon"},
             {"role": "assistant", "content": "c", "tool_calls": [call]},
             {"role": "assistant", "content": "d"}]
    out = ol.to_chat({"messages": given}, None)[0]["messages"]
    assert out[0] == given[0] and out[1] == given[1] and out[3] == given[3]
    assert out[2]["tool_calls"] == [{"id": "call_2_0", "type": "function",
                                     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]


def test_the_model_s_weights_are_described_as_stored_and_as_loaded(tmp_path):
    from types import SimpleNamespace

    (tmp_path / "model.safetensors").write_bytes(b"w" * 1000)
    info = SimpleNamespace(ref="some/model", path=str(tmp_path), format="mlx", source="local", weights_bytes=600,
                           quantization="4-bit")
    state = SimpleNamespace(engine=SimpleNamespace(target_info=info), model_id="m", created=0, fingerprint="f")
    listed, loaded = ol.model_entry(state), ol.model_entry(state, loaded=True)
    assert listed["size"] == 1000 and "size_vram" not in listed  # /api/tags: the bytes on disk
    assert loaded["size"] == loaded["size_vram"] == 600  # /api/ps: the bytes in memory
    unknown = SimpleNamespace(engine=SimpleNamespace(), model_id="m", created=0, fingerprint="f")
    assert ol.model_entry(unknown)["size"] == ol.model_entry(unknown, loaded=True)["size"] == 0
    assert listed["details"] == {"parent_model": "", "format": "safetensors", "family": "unknown",
                                 "families": ["unknown"], "parameter_size": "0", "quantization_level": "4-bit"}


@pytest.mark.parametrize("fmt, quantization, level", [
    ("gguf", "GGUF Q4_1 (token_embd Q8_0)", "Q4_1"), ("gguf", "Q8_0", "Q8_0"), ("mlx", "GGUF Q4_1", "GGUF Q4_1"),
    ("gguf", None, "")])
def test_a_gguf_s_quantization_is_named_as_ollama_names_it(fmt, quantization, level):
    from types import SimpleNamespace

    engine = SimpleNamespace(target_info=SimpleNamespace(format=fmt, quantization=quantization))
    details = ol.details(engine)
    assert details["quantization_level"] == level and details["format"] == ("gguf" if fmt == "gguf" else "safetensors")


def test_an_answer_s_tool_call_keeps_the_id_it_was_given():
    call = {"id": "call_7", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert ol.OllamaBuilder._call(call, 2) == {"id": "call_7", "function": {
        "index": 2, "name": "get_weather", "arguments": {"city": "Paris"}}}
    assert ol.OllamaBuilder._call(dict(call, id=None), 0)["id"].startswith("call_")


def test_a_format_the_grammar_refuses_is_named_format(served):
    _, url, _ = served
    r = httpx.post(f"{url}/api/chat", json={"model": "t", "messages": ASK, "stream": False,
                                            "format": {"type": "objekt"}}, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"].startswith("format was refused (its JSON schema)"), r.text


def test_seed_minus_1_is_ollama_s_random_seed():
    assert "seed" not in ol.to_chat({"messages": ASK, "options": {"seed": -1, "temperature": 1}}, None)[0]
    assert ol.to_chat({"messages": ASK, "options": {"seed": 7}}, None)[0]["seed"] == 7

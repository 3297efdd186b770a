"""`mlxspec serve` through the official openai client: shapes, streaming, stops, seeds, multi-turn reuse."""

import logging

import httpx
import pytest

import tiny
from mlxspec.serve.fields import SHOWN
from serve_helpers import TIMEOUT, GatedEngine, openai_client, running_server, sse_events, tiny_engine

pytest.importorskip("openai")

MODEL = "tiny-pair"
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def server():
    engine = tiny_engine()
    with running_server(engine, model_id=MODEL) as (url, srv):
        yield url, engine


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server[0])


def test_chat_completion_shape_usage_and_figures(client):
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == MODEL and r.created > 0
    (choice,) = r.choices
    assert choice.index == 0 and choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 12
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert 0 <= u.prompt_tokens_details.cached_tokens < u.prompt_tokens
    d = u.completion_tokens_details  # OpenAI's; no reasoning from a model that does not think
    assert (d.reasoning_tokens, d.accepted_prediction_tokens, d.rejected_prediction_tokens, d.audio_tokens) == (0,) * 4
    figures = r.model_extra["mlxspec"]
    assert figures["drafter"] == "ngram" and 0 <= figures["acceptance_rate"] <= 1
    assert figures["tokens_per_target_pass"] >= 1 and figures["tokens_per_second"] > 0


def test_streamed_chat_equals_the_whole_answer(client):
    whole = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=16)
    chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=16, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:] if c.choices)  # the role once, first (OpenAI's)
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish, last = chunks[-2], chunks[-1]
    assert finish.choices[0].finish_reason == whole.choices[0].finish_reason and finish.usage is None
    assert finish.model_extra["mlxspec"]["tokens_per_second"] > 0
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.model_extra["mlxspec"]["drafter"] == "ngram"
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_echo_starts_the_content_with_the_assistants_prefill(client, server):
    # vLLM's chat echo: the last message's content first when it is the assistant's; otherwise nothing
    prefill = HELLO + [{"role": "assistant", "content": "Hello, I am"}]
    extra = {"continue_final_message": True, "add_generation_prompt": False}
    plain = client.chat.completions.create(model=MODEL, messages=prefill, max_tokens=8, extra_body=extra)
    echoed = client.chat.completions.create(model=MODEL, messages=prefill, max_tokens=8,
                                            extra_body=dict(extra, echo=True))
    assert echoed.choices[0].message.content == "Hello, I am" + plain.choices[0].message.content
    chunks = list(client.chat.completions.create(model=MODEL, messages=prefill, max_tokens=8, stream=True,
                                                 extra_body=dict(extra, echo=True)))
    assert chunks[1].choices[0].delta.content == "Hello, I am"  # after the role chunk, as vLLM sends it
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == echoed.choices[0].message.content
    asked = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, extra_body={"echo": True})
    alone = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8)
    assert asked.choices[0].message.content == alone.choices[0].message.content  # the last message is the user's
    r = httpx.post(f"{server[0]}/v1/chat/completions", json={"model": MODEL, "messages": HELLO, "echo": "yes"},
                   timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"


def test_stream_without_include_usage_has_no_usage_and_ends_with_done(server):
    url, _ = server
    body = {"messages": HELLO, "max_tokens": 8, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] is None  # data: [DONE]
    assert all("usage" not in e for e in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length") and "mlxspec" in events[-2]


def test_completions_plain_and_streamed(client):
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10)
    assert r.id.startswith("cmpl-") and r.object == "text_completion"
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 10
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason
    ids = tiny.make_tokenizer().encode("Once upon a time")
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=10)
    assert by_ids.choices[0].text == r.choices[0].text


def test_server_text_equals_the_engine_on_its_own(client):
    r = client.completions.create(model=MODEL, prompt="The river", max_tokens=20)
    assert r.choices[0].text == tiny_engine().generate("The river", max_tokens=20).text


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_cut_the_text(client, stream):
    full = client.completions.create(model=MODEL, prompt="Stop here", max_tokens=24).choices[0].text
    stop = next(full[i:i + 2] for i in range(3, len(full) - 2) if "\ufffd" not in full[i:i + 2])
    kw = dict(model=MODEL, prompt="Stop here", max_tokens=24, stop=[stop, "never-appears"])
    if stream:
        chunks = list(client.completions.create(stream=True, **kw))
        text, finish = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
    else:
        choice = client.completions.create(**kw).choices[0]
        text, finish = choice.text, choice.finish_reason
    assert text == full[: full.index(stop)] and finish == "stop"


@pytest.mark.parametrize("extra", [{"speculative": False}, {"num_draft": 3}])
def test_same_seed_same_sample(client, extra):
    def sample(seed):
        return client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=24, temperature=1.0,
                                              seed=seed, extra_body=extra).choices[0].message.content

    a, b, c = sample(7), sample(7), sample(8)
    assert a == b and a != c


def test_a_seed_and_the_fingerprint_fix_the_text_whatever_drafts_it(client):
    """OpenAI's system_fingerprint names the backend configuration; with the same seed and
    fingerprint the sampled text is the same whether and however the request drafted."""
    def sample(**extra):
        return client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=24, temperature=1.0,
                                              seed=11, extra_body=extra)

    answers = [sample(speculative=False), sample(num_draft=3), sample()]
    assert answers[1].model_extra["mlxspec"]["drafted"] > 0
    assert len({a.choices[0].message.content for a in answers}) == 1
    fps = {a.system_fingerprint for a in answers}
    chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, stream=True))
    fps |= {c.system_fingerprint for c in chunks}
    fps.add(client.completions.create(model=MODEL, prompt="hi", max_tokens=2).system_fingerprint)
    (fp,) = fps
    assert fp.startswith("fp_") and len(fp) == 13


def test_the_fingerprint_follows_what_decides_a_seeded_text_and_not_the_drafter():
    from mlxspec.serve.fingerprint import system_fingerprint

    base = system_fingerprint(tiny_engine())
    assert system_fingerprint(tiny_engine(drafter="ngram")) == base
    assert system_fingerprint(tiny_engine(max_kv_size=64)) != base


def test_speculative_false_and_num_draft(client):
    plain = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=16,
                                           extra_body={"speculative": False})
    assert plain.model_extra["mlxspec"]["drafter"] == "none" and plain.model_extra["mlxspec"]["drafted"] == 0
    fixed = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=16, extra_body={"num_draft": 2})
    assert fixed.choices[0].message.content == plain.choices[0].message.content  # greedy: lossless


def test_a_request_may_name_the_drafter_tree_and_lookup(client, server):
    def ask(**extra):
        return client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, extra_body=extra)

    plain = ask(speculative=False)
    none = ask(drafter="none")
    assert none.model_extra["mlxspec"]["drafter"] == "none" and none.model_extra["mlxspec"]["drafted"] == 0
    chains = ask(drafter="ngram", tree="off", lookup=False)
    assert chains.model_extra["mlxspec"]["drafter"] == "ngram" and chains.model_extra["mlxspec"]["tree_rounds"] == 0
    assert chains.choices[0].message.content == none.choices[0].message.content == plain.choices[0].message.content
    url = server[0]
    for body, param, says in [({"drafter": "model"}, "drafter", "not available on this engine"),
                              ({"drafter": "bogus"}, "drafter", "model, eagle, ngram, none"),
                              ({"tree": -1}, "tree", "'auto', 'off'"), ({"tree": "yes"}, "tree", "'auto', 'off'"),
                              ({"lookup": "maybe"}, "lookup", 'true or false (or "on" or "off"')]:
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 4, **body},
                       timeout=TIMEOUT)
        assert r.status_code == 400 and r.json()["error"]["param"] == param and says in r.json()["error"]["message"], \
            (body, r.text)


def test_lookup_takes_the_flag_s_on_and_off_too():
    engine, seen = GatedEngine(tiny_engine()), []  # what reaches the engine
    stream = engine.stream
    engine.stream = lambda prompt, **kw: seen.append(kw.get("lookup")) or stream(prompt, **kw)
    with running_server(engine, model_id=MODEL) as (url, _):
        for given in ("on", "off", "OFF", True):
            r = httpx.post(f"{url}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2, "lookup": given},
                           timeout=TIMEOUT)
            assert r.status_code == 200, r.text
    assert seen == [True, False, False, True]


def test_max_completion_tokens_and_any_model_name(client):
    r = client.chat.completions.create(model="gpt-4o", messages=HELLO, max_completion_tokens=3)
    assert r.model == MODEL and r.usage.completion_tokens <= 3
    assert r.choices[0].finish_reason == "length" or r.usage.completion_tokens < 3
    both = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3, max_completion_tokens=3)
    assert both.choices[0].message.content == r.choices[0].message.content  # the same limit, said twice


def test_unknown_fields_are_answered_and_named_once_in_the_log(client, server, caplog):
    def ignored():
        return [r.getMessage() for r in caplog.records if "ignored fields" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="mlxspec.serve"):
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2, user="u", store=False,
                                       extra_body={"top_k": 5, "speculative": False, "chat_template_kwargs": {}})
        assert ignored() == []  # OpenAI's own fields and this server's: nothing to say
        for extras in ({"max_token": 9, "vendor_extra": 1}, {"vendor_extra": 2, "max_token": 3}, {"cache_prompt": 1}):
            r = httpx.post(f"{server[0]}/v1/chat/completions", timeout=TIMEOUT,
                           json={"messages": HELLO, "max_tokens": 2, **extras})
            assert r.status_code == 200 and "max_token" not in r.text  # answered; told to the log only
    first, other = ignored()  # the same two fields again (in another order) are not said again
    assert "'max_token', 'vendor_extra'" in first and "/v1/chat/completions" in first
    assert "'cache_prompt'" in other
    # Routes that translate another API read only its fields: another's (n, logit_bias) is named there too
    with caplog.at_level(logging.WARNING, logger="mlxspec.serve"):
        for path, body in (("/v1/messages", {"messages": HELLO, "max_tokens": 2, "n": 2, "logit_bias": {"5": 1},
                                             "metadata": {"user_id": "u"}}),
                           ("/v1/responses", {"input": "hi", "max_output_tokens": 2, "n": 2, "store": False})):
            r = httpx.post(f"{server[0]}{path}", json=body, timeout=TIMEOUT)
            assert r.status_code == 200, r.text
    messages, responses = ignored()[2:]
    assert "/v1/messages: ignored fields this endpoint does not read: 'n', 'logit_bias' (" in messages
    assert "/v1/responses: ignored fields this endpoint does not read: 'n' (" in responses
    with caplog.at_level(logging.WARNING, logger="mlxspec.serve"):  # one short line however many: SHOWN named
        for n in (SHOWN, SHOWN + 1):
            junk = {f"junk{n}_{i}": 1 for i in range(n)}
            r = httpx.post(f"{server[0]}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 1, **junk},
                           timeout=TIMEOUT)
            assert r.status_code == 200, r.text
    exact, over = ignored()[4:]
    assert exact.count("'junk") == SHOWN and " more" not in exact
    assert over.count("'junk") == SHOWN and "and 1 more" in over


def test_multi_turn_prefills_only_the_new_turn(client):
    turn1 = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "How are you?"}]  # answer: clean ASCII
    r1 = client.chat.completions.create(model=MODEL, messages=turn1, max_tokens=10)
    answer = r1.choices[0].message.content
    new_turn = {"role": "user", "content": "And then?"}
    turn2 = turn1 + [{"role": "assistant", "content": answer}, new_turn]
    r2 = client.chat.completions.create(model=MODEL, messages=turn2, max_tokens=10)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached >= r1.usage.prompt_tokens
    # The byte tokenizer re-encodes valid text exactly: all of turn 1 (but the last generated token,
    # never fed to the model) is reused, so only the new turn is prefilled.
    tok = tiny.make_tokenizer()
    prompt = lambda msgs: tok.encode(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False),
                                     add_special_tokens=False)
    assert "\ufffd" not in answer
    assert r2.usage.prompt_tokens == len(prompt(turn2))
    assert cached == r1.usage.prompt_tokens + r1.usage.completion_tokens - 1
    assert r2.model_extra["mlxspec"]["prefilled_tokens"] == r2.usage.prompt_tokens - cached


def test_models_and_health(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    r = httpx.get(f"{server[0]}/health", timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["model"] == MODEL
    missing = httpx.get(f"{server[0]}/v1/models/other", timeout=TIMEOUT)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_an_assistant_s_refusal_part_is_its_text(client):
    # OpenAI's history holds the refusals its models gave; they are the assistant's content
    said = [{"role": "user", "content": "Do it."}, {"role": "assistant", "content": "No."}] + HELLO
    parts = [said[0], {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]}] + HELLO
    field = [said[0], {"role": "assistant", "content": None, "refusal": "No."}] + HELLO  # as the API returns it
    a, b, c = (client.chat.completions.create(model=MODEL, messages=m, max_tokens=4) for m in (said, parts, field))
    assert a.usage.prompt_tokens == b.usage.prompt_tokens == c.usage.prompt_tokens
    assert a.choices[0].message.content == b.choices[0].message.content == c.choices[0].message.content


def test_an_assistant_s_content_wins_over_its_refusal_field_and_a_calling_turn_keeps_refusal_parts():
    from mlxspec.serve.messages import chat_messages

    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    out = chat_messages([{"role": "user", "content": "Do it."},
                         {"role": "assistant", "content": "Sure.", "refusal": "No."},
                         {"role": "assistant", "content": [{"type": "refusal", "refusal": "Not that."}],
                          "tool_calls": [call]}])
    assert out[1] == {"role": "assistant", "content": "Sure."}
    assert out[2]["content"] == "Not that." and out[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": {}}


def test_the_api_routes_answer_without_v1_too(client, server):
    # as mlx-lm's server answers /chat/completions: for clients whose base URL lacks /v1
    import openai

    bare = openai.OpenAI(base_url=server[0], api_key="unused", max_retries=0, timeout=TIMEOUT)
    for api in (bare, client):
        assert [m.id for m in api.models.list().data] == [MODEL] and api.models.retrieve(MODEL).id == MODEL
    answers = [(api.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6).choices[0].message.content,
                api.completions.create(model=MODEL, prompt="Rivers", max_tokens=4).choices[0].text,
                api.responses.create(model=MODEL, input="Hi", max_output_tokens=4, store=False).output_text)
               for api in (bare, client)]
    assert answers[0] == answers[1]
    # the route's own field names, as under /v1
    r = httpx.post(f"{server[0]}/responses", json={"input": "Hi", "max_tokens": 4}, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = httpx.post(f"{server[0]}/messages", json={"messages": HELLO, "max_tokens": 2}, timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["type"] == "message"


class CallLog(GatedEngine):
    """Records the engine calls the server makes, in order."""

    calls: list

    def warmup(self, **kw):
        self.calls.append("warmup")
        return self.engine.warmup(**kw)

    def stream(self, prompt, **kw):
        self.calls.append("stream")
        return super().stream(prompt, **kw)


def test_the_engine_warms_up_once_before_the_server_accepts_requests(caplog):
    engine = CallLog(tiny_engine())
    engine.calls = []
    caplog.set_level(logging.INFO, logger="mlxspec.serve")
    with running_server(engine) as (url, _):
        assert engine.calls == ["warmup"]  # done by the time the port accepts connections
        openai_client(url).chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    assert engine.calls == ["warmup", "stream"]
    assert any(r.getMessage().startswith("engine warmed up in ") for r in caplog.records)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("serving ")]
    assert len(said) == 1 and f"OpenAI clients' base URL {url}/v1, Anthropic's and Ollama's {url} " in said[0], said

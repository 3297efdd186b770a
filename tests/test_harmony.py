"""gpt-oss's harmony format: its analysis channel is reasoning, its final channel and preambles the
answer, its messages to functions.* tool calls, in the server's chat and Responses answers
(whole and streamed); a response_format applies to the final channel only, and a forced
tool_choice after the analysis."""

import json

import httpx
import pytest

import tiny
from mlxspec import harmony
from mlxspec.engine import Engine
from mlxspec.prompts import encode_prompt
from mlxspec.reasoning import make_splitter, thinking_markers
from mlxspec.tools import tool_format
from serve_helpers import TIMEOUT, iter_sse, openai_client, running_server

TOKENS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"]
VOCAB = tiny.VOCAB + len(TOKENS)
# gpt-oss's template, its shape only: each message a header and its content; the answer's header open
TEMPLATE = ("{% if tools %}<|start|>developer<|message|># Tools\nnamespace functions { "
            "{% for t in tools %} {{ t.function.name }}{% endfor %} }<|end|>{% endif %}"
            "{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|start|>assistant{% endif %}")
ASK = [{"role": "user", "content": "What is 2 + 2?"}]
THINK = "<|channel|>analysis<|message|>Add them.<|end|>"
ANSWER = THINK + "<|start|>assistant<|channel|>final<|message|>It is 4."
CALL = (THINK + "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Paris"}')
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}


def harmony_tokenizer():
    tok = tiny.make_tokenizer(TEMPLATE, added=TOKENS)
    for end in ("<|return|>", "<|call|>"):  # gpt-oss's generation_config ends on both
        tok.add_eos_token(end)
    return tok


@pytest.fixture(scope="module")
def scripted():
    tok = harmony_tokenizer()
    model = tiny.ScriptedModel(vocab=VOCAB)
    with running_server(Engine(model, tok, drafter="ngram"), model_id="h") as (url, _):
        def say(text, end="<|return|>", tools=None):
            ids = tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids(end)]
            model.say(ids, len(encode_prompt(ASK, tok, VOCAB, tools=tools)))
        yield url, say


def split(text, size):
    s = harmony.HarmonySplitter()
    got = [s.feed(text[i:i + size]) for i in range(0, len(text), size)] + [s.finish()]
    return "".join(r for r, _ in got), "".join(a for _, a in got)


@pytest.mark.parametrize("text, reasoning, answer", [
    (ANSWER, "Add them.", "It is 4."),
    (THINK + "<|start|>assistant<|channel|>analysis<|message|>Four.<|end|><|start|>assistant<|channel|>final"
     "<|message|>4", "Add them.\n\nFour.", "4"),
    (CALL, "Add them.", 'Checking.\n\n<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris"}'
     "<|call|>"),
    # a built-in tool's call (the browser) is not the user's to read
    ("<|channel|>analysis<|message|>Look.<|end|><|start|>assistant<|channel|>commentary to=browser.search "
     "<|constrain|>json<|message|>{\"q\": \"x\"}<|call|>", "Look.\n\n{\"q\": \"x\"}", ""),
    # the recipient in the role's part of the header, as harmony allows
    (THINK + '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}',
     "Add them.", '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris"}<|call|>'),
    ("It is 4.", "", "It is 4."),  # no header at all: an answer as it is
    ("<|channel|>analysis<|message|>cut off mid-thou", "cut off mid-thou", ""),
])
def test_every_chunking_splits_alike(text, reasoning, answer):
    for size in (1, 2, 5, 7, len(text)):
        assert split(text, size) == (reasoning, answer), size


def test_a_call_s_body_reads_as_a_name_and_arguments():
    assert harmony.parse_call('get_weather<|message|>{"city": "Paris"}') == {"name": "get_weather",
                                                                          "arguments": {"city": "Paris"}}
    # as written raw (the header's constraint after the name)
    assert harmony.parse_call('get_weather <|constrain|>json<|message|>{}')["name"] == "get_weather"
    with pytest.raises(ValueError):  # arguments cut short: the call stays text
        harmony.parse_call('get_weather<|message|>{"city": "Par')


def test_a_harmony_vocabulary_is_recognised():
    tok = harmony_tokenizer()
    assert harmony.is_harmony(tok) and not harmony.is_harmony(tiny.make_tokenizer())
    assert thinking_markers(tok) == harmony.MARKERS
    assert isinstance(make_splitter(*[harmony.MARKERS]), harmony.HarmonySplitter)
    assert tool_format(tok).name == "harmony"


def test_the_chat_answer_is_the_final_channel_and_the_reasoning_the_analysis(scripted):
    url, say = scripted
    say(ANSWER)
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": ASK, "max_tokens": 200}, timeout=TIMEOUT).json()
    assert r["choices"][0]["message"] == {"role": "assistant", "content": "It is 4.", "reasoning": "Add them."}
    assert r["choices"][0]["finish_reason"] == "stop"
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=TIMEOUT,
                      json={"messages": ASK, "max_tokens": 200, "stream": True}) as s:
        deltas = [c["choices"][0]["delta"] for c in iter_sse(s) if c and c.get("choices")]
    assert "".join(d.get("reasoning", "") for d in deltas) == "Add them."
    assert "".join(d.get("content") or "" for d in deltas) == "It is 4."
    assert not any("<|" in (d.get("content") or "") + d.get("reasoning", "") for d in deltas)


def test_a_message_to_a_function_is_a_tool_call(scripted):
    url, say = scripted
    client = openai_client(url)
    say(CALL, end="<|call|>", tools=[WEATHER])
    r = client.chat.completions.create(model="h", messages=ASK, tools=[WEATHER], max_tokens=400)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content == "Checking."
    streamed = list(client.chat.completions.create(model="h", messages=ASK, tools=[WEATHER], max_tokens=400,
                                                   stream=True))
    calls = [tc for c in streamed if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].function.name == "get_weather"
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == {"city": "Paris"}
    response = client.responses.create(model="h", input=ASK, tools=[{"type": "function", **WEATHER["function"]}],
                                       max_output_tokens=400)
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    assert response.output[2].name == "get_weather"


def test_anthropic_s_messages_get_a_thinking_block_and_a_tool_use(scripted):
    anthropic = pytest.importorskip("anthropic")
    url, say = scripted
    client = anthropic.Anthropic(base_url=url, api_key="unused")
    say(ANSWER)
    r = client.messages.create(model="h", max_tokens=200, messages=ASK)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in r.content] == [
        ("thinking", "Add them."), ("text", "It is 4.")]
    say(CALL, end="<|call|>", tools=[WEATHER])
    tool = {"name": "get_weather", "description": "The weather in a city",
            "input_schema": WEATHER["function"]["parameters"]}
    r = client.messages.create(model="h", max_tokens=400, messages=ASK, tools=[tool])
    assert [b.type for b in r.content] == ["thinking", "text", "tool_use"] and r.stop_reason == "tool_use"
    assert r.content[2].name == "get_weather" and r.content[2].input == {"city": "Paris"}


def test_told_to_leave_the_reasoning_in_the_content_harmony_still_reads_its_channels():
    """serve --reasoning-key none: the analysis stays in the content (without harmony's headers),
    and a message to a function is still a tool call."""
    tok = harmony_tokenizer()
    model = tiny.ScriptedModel(vocab=VOCAB)
    with running_server(Engine(model, tok, drafter="ngram"), model_id="h", reasoning_key="none") as (url, _):
        model.say(tok.encode(ANSWER, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|return|>")],
                  len(encode_prompt(ASK, tok, VOCAB)))
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": ASK, "max_tokens": 200}, timeout=TIMEOUT)
        assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": "Add them.\n\nIt is 4."}
        model.say(tok.encode(CALL, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|call|>")],
                  len(encode_prompt(ASK, tok, VOCAB, tools=[WEATHER])))
        r = openai_client(url).chat.completions.create(model="h", messages=ASK, tools=[WEATHER], max_tokens=400)
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and r.choices[0].message.content == "Add them.\n\nChecking."


CITY = {"type": "function", "function": {"name": "get_city", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Rome", "Paris"]}}, "required": ["city"],
    "additionalProperties": False}}}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_city"}}])
def test_a_forced_call_comes_after_the_analysis_the_model_writes(scripted, choice):
    """The model would reason, then answer; forced, it reasons as it would (the analysis is
    free), then calls: the grammar writes the call's header and its arguments follow the schema.
    (Where the model is indifferent this scripted one takes the lowest id: get_city, "Paris".)"""
    url, say = scripted
    say(ANSWER, tools=[WEATHER, CITY])
    client = openai_client(url)
    free = client.chat.completions.create(model="h", messages=ASK, tools=[WEATHER, CITY], max_tokens=200)
    assert free.choices[0].message.content == "It is 4." and not free.choices[0].message.tool_calls
    r = client.chat.completions.create(model="h", messages=ASK, tools=[WEATHER, CITY], tool_choice=choice,
                                       max_tokens=200)
    (out,) = r.choices
    assert out.finish_reason == "tool_calls" and not out.message.content and out.message.reasoning == "Add them."
    (call,) = out.message.tool_calls
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_city" and args == {"city": "Paris"}
    chunks = list(client.chat.completions.create(model="h", messages=ASK, tools=[WEATHER, CITY], tool_choice=choice,
                                                 max_tokens=200, stream=True))
    streamed = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls
                for tc in c.choices[0].delta.tool_calls]
    assert [(tc.function.name, tc.function.arguments) for tc in streamed] == [("get_city", call.function.arguments)]


@pytest.mark.parametrize("seed", [0, 2])
@pytest.mark.parametrize("options", [{}, {"num_draft": 3}, {"temperature": 0.8, "seed": 4}])
def test_forced_harmony_calls_are_constrained_plain_decoding(seed, options):
    """A random model, which left to itself writes bytes and no harmony at all, forced: speculation
    gives plain decoding's tokens under the same grammar, and greedy it writes the call's header."""
    import tiny

    tok = harmony_tokenizer()
    engine = Engine(tiny.make_llama(seed, vocab_size=VOCAB, tie_embeddings=False), tok, drafter="ngram")
    named = {"type": "function", "function": {"name": "get_city"}}
    assert "<|" not in engine.generate(ASK, tools=[WEATHER, CITY], max_tokens=30).text
    engine.reset()
    plain = engine.generate(ASK, tools=[WEATHER, CITY], tool_choice=named, max_tokens=120, speculative=False, **options)
    engine.reset()
    forced = engine.generate(ASK, tools=[WEATHER, CITY], tool_choice=named, max_tokens=120, **options)
    assert forced.tokens == plain.tokens
    if not options:
        header = "<|channel|>commentary to=functions.get_city <|constrain|>json<|message|>"
        assert forced.finish_reason == "stop" and forced.text.startswith(header)
        assert json.loads(forced.text[len(header):]) in ({"city": "Rome"}, {"city": "Paris"})


def test_a_response_format_applies_to_the_final_channel(scripted):
    """The model reasons in its analysis channel freely and answers in the grammar: a grammar from
    the first token would have refused the analysis header."""
    url, say = scripted
    say(THINK + '<|start|>assistant<|channel|>final<|message|>{"sum": 4}')
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": {
        "type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]}}}
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": ASK, "max_tokens": 200, "response_format": fmt},
                   timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert json.loads(message["content"]) == {"sum": 4} and message["reasoning"] == "Add them."


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_reasoning_effort_reaches_the_template(api):
    """OpenAI's reasoning_effort (the Responses' reasoning.effort) is the template variable
    gpt-oss's template reads; a request's chat_template_kwargs win; a value OpenAI does not
    define is a 400."""
    tok = tiny.make_tokenizer(tiny.CHAT_TEMPLATE.replace("{% for m", "Reasoning: {{ reasoning_effort }}\n{% for m"))
    with running_server(Engine(tiny.make_llama(0), tok), model_id="t") as (url, _):
        def prompt_tokens(**body):
            if api == "responses":
                if "reasoning_effort" in body:
                    body["reasoning"] = {"effort": body.pop("reasoning_effort")}
                r = httpx.post(f"{url}/v1/responses", json=dict({"input": ASK, "max_output_tokens": 1}, **body),
                               timeout=TIMEOUT)
                return r.status_code, r.json()["usage"]["input_tokens"] if r.status_code == 200 else r.json()
            r = httpx.post(f"{url}/v1/chat/completions", json=dict({"messages": ASK, "max_tokens": 1}, **body),
                           timeout=TIMEOUT)
            return r.status_code, r.json()["usage"]["prompt_tokens"] if r.status_code == 200 else r.json()

        for effort in ("low", "high"):
            want = len(encode_prompt(ASK, tok, tiny.VOCAB, template_kwargs={"reasoning_effort": effort}))
            assert prompt_tokens(reasoning_effort=effort) == (200, want)
        if api == "chat":
            want = len(encode_prompt(ASK, tok, tiny.VOCAB, template_kwargs={"reasoning_effort": "medium"}))
            got = prompt_tokens(reasoning_effort="low", chat_template_kwargs={"reasoning_effort": "medium"})
            assert got == (200, want)
        status, error = prompt_tokens(reasoning_effort="extreme")
        assert status == 400 and error["error"]["param"] == ("reasoning.effort" if api == "responses"
                                                              else "reasoning_effort")


@pytest.mark.parametrize("json_out", [False, True])
def test_generate_prints_the_answer_and_sends_the_analysis_to_stderr(json_out, monkeypatch, capsys):
    from mlxspec.cli import main
    from mlxspec.commands import modelargs

    tok = harmony_tokenizer()
    model = tiny.ScriptedModel(vocab=VOCAB)
    # an answer whose end could start a marker: held back while it streams, printed at its end
    model.say(tok.encode(ANSWER + " <", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|return|>")],
              len(encode_prompt(ASK, tok, VOCAB)))
    from types import SimpleNamespace

    engine = Engine(model, tok, drafter="ngram")
    # what `mlxspec.load` records of what it loaded (the command prints it)
    engine.pair_name, engine.draft_info = None, None
    engine.target_info = SimpleNamespace(ref="gpt-oss", weights_bytes=2**20, dtype="float32", quantization="none")
    monkeypatch.setattr(modelargs, "load_engine", lambda args, **kw: engine)
    assert main(["generate", "--max-tokens", "200", *(["--json"] if json_out else []), ASK[0]["content"]]) == 0
    out, err = capsys.readouterr()
    if json_out:
        result = json.loads(out)
        assert (result["text"], result["reasoning"]) == ("It is 4. <", "Add them.")
    else:
        assert out == "It is 4. <\n" and "Add them.\n" in err and "<|" not in out + err


def test_a_vocabulary_without_constrain_gets_it_written_as_text():
    import tiny

    tokens = [t for t in TOKENS if t != "<|constrain|>"]
    tok = tiny.make_tokenizer(TEMPLATE, added=tokens)
    for end in ("<|return|>", "<|call|>"):
        tok.add_eos_token(end)
    engine = Engine(tiny.make_llama(3, vocab_size=tiny.VOCAB + len(tokens), tie_embeddings=False), tok)
    r = engine.generate(ASK, tools=[CITY], tool_choice="required", max_tokens=120)
    header = "<|channel|>commentary to=functions.get_city <|constrain|>json<|message|>"
    assert r.finish_reason == "stop" and r.text.startswith(header)
    assert json.loads(r.text[len(header):]) == {"city": "Paris"}

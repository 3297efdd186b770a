"""tool_choice "required" and a named function: a grammar in the model's call format forces the calls.

The tiny random model, left to itself, writes bytes and never a call; forced, it writes calls whose
arguments follow each tool's schema, and speculation keeps them constrained plain decoding's."""

import json

import pytest

import tiny
from mlxspec.engine import Engine
from mlxspec.errors import InvalidArgumentError
from mlxspec.tools import ToolFormat, parse_calls
from serve_helpers import openai_client, running_server

UNIT = {"type": "function", "function": {"name": "get_unit", "description": "The unit people use",
                                         "parameters": {"type": "object",
                                                        "properties": {"unit": {"enum": ["c", "f"]},
                                                                       "exact": {"type": "boolean"}},
                                                        "required": ["unit", "exact"],
                                                        "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
    "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What unit do they use in Paris, and what time is it?"}]
NAMED = {"type": "function", "function": {"name": "get_time"}}


def engine_for(drafter="ngram"):
    return Engine(tiny.make_llama(0, tie_embeddings=False), tiny.make_tokenizer(tiny.TOOLS_TEMPLATE), drafter=drafter)


def calls_in(engine, text):
    """The calls in `text`, and what is left of it once they are taken out."""
    fmt = engine.tool_format
    rest, calls = text, []
    while fmt.start in rest:
        before, _, after = rest.partition(fmt.start)
        body, end, after = after.partition(fmt.end)
        assert not before.strip()
        if not end:  # cut by max_tokens
            break
        calls += parse_calls(body, fmt, [UNIT, TIME])
        rest = after
    return calls, rest


@pytest.mark.parametrize("options", [{}, {"num_draft": 3}, {"temperature": 0.8, "seed": 4}])
def test_a_named_function_is_called_once_with_arguments_that_follow_its_schema(options):
    """get_time: the call this model would choose between the two if it had to; get_unit below."""
    engine = engine_for()
    free = engine.generate(ASK, tools=[UNIT, TIME], max_tokens=40)
    assert engine.tool_format.start not in free.text  # unforced, this model calls nothing
    engine.reset()
    plain = engine.generate(ASK, tools=[UNIT, TIME], tool_choice=NAMED, max_tokens=200, speculative=False, **options)
    engine.reset()
    forced = engine.generate(ASK, tools=[UNIT, TIME], tool_choice=NAMED, max_tokens=200, **options)
    assert forced.tokens == plain.tokens and forced.finish_reason == "stop"
    (call,), rest = calls_in(engine, forced.text)
    assert call["function"]["name"] == "get_time" and not rest.strip()
    assert json.loads(call["function"]["arguments"])["zone"] in ("utc", "cet")


def test_the_named_function_is_called_when_the_model_would_call_another():
    engine = engine_for()
    unit = {"type": "function", "function": {"name": "get_unit"}}
    assert calls_in(engine, engine.generate(ASK, tools=[UNIT, TIME], tool_choice="required",
                                            max_tokens=200).text)[0][0]["function"]["name"] == "get_time"
    engine.reset()
    r = engine.generate(ASK, tools=[UNIT, TIME], tool_choice=unit, max_tokens=400)
    (call,), rest = calls_in(engine, r.text)
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "get_unit" and set(args) == {"unit", "exact"} and not rest.strip()


def test_required_makes_calls_of_the_tools_only():
    engine = engine_for("none")
    r = engine.generate(ASK, tools=[UNIT, TIME], tool_choice="required", max_tokens=300)
    calls, rest = calls_in(engine, r.text)
    # this model writes calls until cut (the grammar lets it end after any): the last half-written
    assert len(calls) >= 1 and (not rest.strip() or r.finish_reason == "length" and rest.lstrip().startswith("<tool_call>"))
    for call in calls:
        args = json.loads(call["function"]["arguments"])
        if call["function"]["name"] == "get_unit":
            assert set(args) == {"unit", "exact"} and args["unit"] in ("c", "f") and isinstance(args["exact"], bool)
        else:
            assert call["function"]["name"] == "get_time" and args["zone"] in ("utc", "cet")


def test_one_call_at_most_when_parallel_calls_are_off():
    """parallel_tool_calls=False: "required" (which this model fills with calls until cut) writes one
    call and ends; a format beside the tools, one call or the answer; speculation keeps it plain's."""
    engine = engine_for()
    kw = dict(tools=[UNIT, TIME], tool_choice="required", max_tokens=300, parallel_tool_calls=False)
    plain = engine.generate(ASK, speculative=False, **kw)
    engine.reset()
    r = engine.generate(ASK, **kw)
    (call,), rest = calls_in(engine, r.text)
    assert r.tokens == plain.tokens and r.finish_reason == "stop" and not rest.strip()
    assert call["function"]["name"] in ("get_unit", "get_time")
    for seed in range(4):
        engine.reset()
        r = engine.generate(ASK, tools=[UNIT, TIME], response_format=CITY, max_tokens=300, temperature=1.0,
                            seed=seed, parallel_tool_calls=False)
        assert r.finish_reason == "stop"
        if engine.tool_format.start in r.text:
            assert len(calls_in(engine, r.text)[0]) == 1
        else:
            assert json.loads(r.text)["city"] in ("Paris", "Rome")


@pytest.mark.parametrize("kw, says", [
    ({"tool_choice": "required"}, "needs tools to call"),
    ({"tools": [UNIT], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "'nope', which is not among the tools; allowed: get_unit"),
    ({"tools": [UNIT], "tool_choice": "always"}, "tool_choice must be \"auto\""),
    ({"tools": [UNIT], "tool_choice": {"function": {"name": "get_unit"}}}, "tool_choice must be"),
    ({"tools": [UNIT], "response_format": {"type": "regex", "regex": "a+"}},
     "a regex format cannot share a grammar with tool calls (json_object and json_schema can); send one or the other"),
])
def test_bad_tool_choices_are_refused(kw, says):
    with pytest.raises(InvalidArgumentError, match=__import__("re").escape(says)):
        engine_for().stream(ASK, max_tokens=4, **kw)


def allowed(mode, *names):
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": [
        {"type": "function", "function": {"name": n}} for n in names]}}


def test_allowed_tools_shows_the_model_those_alone_in_the_mode_it_names():
    """"required" over both tools calls get_time (above); allowed get_unit alone, get_unit is called,
    and "auto" over it is "auto" with it the only tool shown."""
    engine = engine_for()
    r = engine.generate(ASK, tools=[UNIT, TIME], tool_choice=allowed("required", "get_unit"), max_tokens=400)
    calls, _ = calls_in(engine, r.text)
    assert calls and {c["function"]["name"] for c in calls} == {"get_unit"}
    engine.reset()
    only = engine.generate(ASK, tools=[UNIT], max_tokens=12)
    engine.reset()
    assert engine.generate(ASK, tools=[UNIT, TIME], tool_choice=allowed("auto", "get_unit"),
                           max_tokens=12).tokens == only.tokens
    engine.reset()
    assert engine.generate(ASK, tools=[UNIT, TIME], max_tokens=12).tokens != only.tokens  # the prompt differs


@pytest.mark.parametrize("choice, says", [
    (allowed("always", "get_unit"), "tool_choice of type allowed_tools must be {\"type\": \"allowed_tools\""),
    (allowed("auto"), "tool_choice of type allowed_tools must be"),
    ({"type": "allowed_tools", "mode": "auto", "tools": []}, "tool_choice of type allowed_tools must be"),
    (allowed("auto", "nope"), "tool_choice.allowed_tools.tools[0] names function 'nope', which is not among the "
                              "tools; allowed: get_unit, get_time"),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"type": "mcp", "server_label": "x"}]}},
     "tool_choice.allowed_tools.tools[0] must be {\"type\": \"function\""),
])
def test_bad_allowed_tools_are_refused(choice, says):
    with pytest.raises(InvalidArgumentError, match=__import__("re").escape(says)):
        engine_for().stream(ASK, tools=[UNIT, TIME], max_tokens=4, tool_choice=choice)
    with pytest.raises(InvalidArgumentError, match="needs tools to call"):
        engine_for().stream(ASK, max_tokens=4, tool_choice=allowed("auto", "get_unit"))


CITY = {"type": "json_schema", "json_schema": {"name": "city", "schema": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
    "additionalProperties": False}}}


def test_tools_with_a_response_format_answer_in_calls_or_in_the_format():
    """OpenAI lets a request send both (an agent with tools and an output type does): under "auto"
    the answer is tool calls or JSON that follows the format, the model's choice (both come, over
    these seeds), and speculation keeps it constrained plain decoding's; forced calls are this
    turn's answer, whatever the format."""
    engine = engine_for()
    kinds = set()
    for seed in range(4):
        kw = dict(tools=[UNIT, TIME], response_format=CITY, max_tokens=200, temperature=1.0, seed=seed)
        engine.reset()
        plain = engine.generate(ASK, speculative=False, **kw)
        engine.reset()
        r = engine.generate(ASK, **kw)
        assert r.tokens == plain.tokens
        if engine.tool_format.start in r.text:
            calls, rest = calls_in(engine, r.text)
            assert calls and {c["function"]["name"] for c in calls} <= {"get_unit", "get_time"}
            assert not rest.strip() or r.finish_reason == "length"
            kinds.add("calls")
        else:
            assert r.finish_reason == "stop" and json.loads(r.text)["city"] in ("Paris", "Rome")
            kinds.add("answer")
    assert kinds == {"calls", "answer"}
    engine.reset()
    forced = engine.generate(ASK, tools=[UNIT, TIME], response_format=CITY, tool_choice=NAMED, max_tokens=200)
    (call,), _ = calls_in(engine, forced.text)
    assert call["function"]["name"] == "get_time"


def test_a_format_no_grammar_forces_is_refused_and_none_hides_the_tools():
    engine = engine_for()
    engine.__dict__["tool_format"] = ToolFormat("[TOOL_CALLS]", "", lambda body, tools: None, "mistral")
    with pytest.raises(InvalidArgumentError, match="this model's is mistral: send tool_choice \"auto\""):
        engine.stream(ASK, tools=[UNIT], tool_choice="required")
    with pytest.raises(InvalidArgumentError, match="this model's tool-call format is mistral, and only json_tools"):
        engine.stream(ASK, tools=[UNIT], response_format=CITY)
    plain = engine.generate(ASK, max_tokens=8)
    engine.reset()
    assert engine.generate(ASK, tools=[UNIT], tool_choice="none", max_tokens=8).tokens == plain.tokens


def test_forced_calls_through_the_openai_client():
    engine = engine_for()
    with running_server(engine, model_id="t") as (url, _):
        client = openai_client(url)
        r = client.chat.completions.create(model="t", messages=ASK, tools=[UNIT, TIME], tool_choice=NAMED,
                                           max_tokens=200)
        (choice,) = r.choices
        assert choice.finish_reason == "tool_calls" and not choice.message.content
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_time" and json.loads(call.function.arguments)["zone"] in ("utc", "cet")
        chunks = list(client.chat.completions.create(model="t", messages=ASK, tools=[UNIT, TIME], tool_choice=NAMED,
                                                     max_tokens=200, stream=True))
        streamed = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls
                    for tc in c.choices[0].delta.tool_calls]
        assert [(tc.function.name, tc.function.arguments) for tc in streamed] == [(call.function.name,
                                                                                  call.function.arguments)]
        with pytest.raises(Exception) as err:
            client.chat.completions.create(model="t", messages=ASK, tool_choice="required", max_tokens=5)
        assert err.value.status_code == 400 and err.value.body["param"] == "tool_choice"
        # allowed_tools, in chat's shape and in the Responses API's flat one: get_unit alone is called (this
        # model writes calls until max_tokens cuts it, so the answer ends "length", its whole calls read back)
        r = client.chat.completions.create(model="t", messages=ASK, tools=[UNIT, TIME], max_tokens=400,
                                           tool_choice=allowed("required", "get_unit"))
        assert {c.function.name for c in r.choices[0].message.tool_calls} == {"get_unit"}
        flat = [{"type": "function", **t["function"]} for t in (UNIT, TIME)]
        out = client.responses.create(model="t", input=ASK, tools=flat, max_output_tokens=400, store=False,
                                      tool_choice={"type": "allowed_tools", "mode": "required",
                                                   "tools": [{"type": "function", "name": "get_unit"}]}).output
        assert out and {item.name for item in out if item.type == "function_call"} == {"get_unit"}
        # parallel_tool_calls false: one call, the answer ends with it (whole, streamed, and on Responses)
        r = client.chat.completions.create(model="t", messages=ASK, tools=[UNIT, TIME], max_tokens=400,
                                           tool_choice="required", parallel_tool_calls=False)
        assert r.choices[0].finish_reason == "tool_calls" and len(r.choices[0].message.tool_calls) == 1
        chunks = list(client.chat.completions.create(model="t", messages=ASK, tools=[UNIT, TIME], max_tokens=400,
                                                     tool_choice="required", parallel_tool_calls=False, stream=True))
        assert sum(len(c.choices[0].delta.tool_calls or []) for c in chunks if c.choices) == 1
        out = client.responses.create(model="t", input=ASK, tools=flat, max_output_tokens=400, store=False,
                                      tool_choice="required", parallel_tool_calls=False)
        assert [item.type for item in out.output] == ["function_call"] and out.parallel_tool_calls is False
        with pytest.raises(Exception) as err:
            client.chat.completions.create(model="t", messages=ASK, tools=[UNIT], max_tokens=5,
                                           tool_choice=allowed("required", "get_time"))
        assert err.value.status_code == 400 and err.value.body["param"] == "tool_choice"
        assert "'get_time', which is not among the tools" in err.value.body["message"]


def test_tools_with_a_response_format_through_the_openai_client():
    """An agent's request with tools and an output type: an answer in the format (seed 3 here) or
    tool calls (seed 1), on chat completions and on the Responses API (text.format)."""
    engine = engine_for()
    with running_server(engine, model_id="t") as (url, _):
        client = openai_client(url)
        kw = dict(model="t", messages=ASK, tools=[UNIT, TIME], response_format=CITY, max_tokens=200, temperature=1.0)
        answer = client.chat.completions.create(seed=3, **kw).choices[0]
        assert answer.finish_reason == "stop" and not answer.message.tool_calls
        assert json.loads(answer.message.content)["city"] in ("Paris", "Rome")
        called = client.chat.completions.create(seed=1, **kw).choices[0]
        assert called.finish_reason == "tool_calls" and called.message.tool_calls[0].function.name == "get_time"
        flat = [{"type": "function", **t["function"]} for t in (UNIT, TIME)]
        out = client.responses.create(model="t", input=ASK, tools=flat, max_output_tokens=200, store=False,
                                      temperature=1.0, extra_body={"seed": 3},
                                      text={"format": {"type": "json_schema", "name": "city",
                                                       "schema": CITY["json_schema"]["schema"]}})
        assert json.loads(out.output_text)["city"] in ("Paris", "Rome")


# llguidance refuses this schema ("strin" is no type); only a grammar that writes its calls reads it
BROKEN = {"type": "function", "function": {"name": "broken", "parameters": {
    "type": "object", "properties": {"a": {"type": "strin"}}}}}


UNUSED = {"type": "function", "function": dict(BROKEN["function"], name="unused")}


@pytest.mark.parametrize("tools, kw, place", [
    ([UNIT, BROKEN], {"tool_choice": "required"}, 1),
    ([UNIT, BROKEN], {"tool_choice": {"type": "function", "function": {"name": "broken"}}}, 1),
    ([UNIT, BROKEN], {"response_format": CITY}, 1),
    ([UNIT, BROKEN], {"tool_choice": allowed("required", "broken")}, 1),
    # the one whose calls the grammar writes, not another broken one before it
    ([UNUSED, UNIT, BROKEN], {"tool_choice": {"type": "function", "function": {"name": "broken"}}}, 2),
    ([UNUSED, UNIT, BROKEN], {"tool_choice": allowed("required", "get_unit", "broken")}, 2),
])
def test_a_schema_the_grammar_refuses_is_named_where_the_request_has_it(tools, kw, place):
    """Not as a response_format the request never sent: by the tool's place among all the tools
    sent (allowed_tools shows the model a part of them, but the request's places are the user's)."""
    with pytest.raises(InvalidArgumentError, match=rf"^tools\[{place}\]\.function\.parameters was refused: .*strin"):
        engine_for().stream(ASK, tools=tools, max_tokens=4, **kw)


def test_a_schema_no_grammar_reads_is_not_refused():
    engine = engine_for()
    forced = engine.generate(ASK, tools=[UNIT, BROKEN], tool_choice={"type": "function", "function": {
        "name": "get_unit"}}, max_tokens=300)
    (call,), _ = calls_in(engine, forced.text)
    assert call["function"]["name"] == "get_unit"
    assert engine.generate(ASK, tools=[UNIT, BROKEN], max_tokens=4).tokens  # free text: the model decides

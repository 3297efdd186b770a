"""Tool calling: checking `tools`, rendering them, and reading the model's calls back from streamed text."""

import json
import random

import pytest

import tiny
from mlxspec.engine import Engine
from mlxspec.errors import InvalidArgumentError
from mlxspec.prompts import encode_prompt
from mlxspec.tools import ToolCallReader, ToolCallSplitter, ToolFormat, check_tools, parse_calls, tool_format

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}
JSON_CALLS = ToolFormat("<tool_call>", "</tool_call>", lambda body, tools: json.loads(body.strip()), "json_tools")
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def call_text(name, args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def read_in_pieces(reader, text, rng):
    """Feed `text` to `reader` in random pieces (empty ones too); returns (text, calls) of it all."""
    out, calls, i = [], [], 0
    while i < len(text):
        n = rng.randint(0, 6)
        t, c = reader.feed(text[i:i + n])
        out.append(t)
        calls += c
        i += n
    t, c = reader.finish()
    return "".join(out) + t, calls + c


# -- the format -------------------------------------------------------------------------------------
def test_tool_format_is_read_from_the_chat_template():
    fmt = tool_format(tiny.make_tokenizer(tiny.TOOLS_TEMPLATE))
    assert (fmt.start, fmt.end, fmt.name) == ("<tool_call>", "</tool_call>", "json_tools")
    assert fmt.parse('{"name": "f", "arguments": {"x": 1}}', None) == {"name": "f", "arguments": {"x": 1}}
    assert tool_format(tiny.make_tokenizer()) is None  # a template without tools
    assert tool_format(None) is None


@pytest.mark.parametrize("tools, wrong", [
    ("get_weather", "must be a list"),
    ([{"type": "retrieval"}], "only function tools"),
    ([{"type": "function", "function": {"name": ""}}], "name must be 1-64 letters"),
    ([{"type": "function", "function": {"name": "has space"}}], "name must be 1-64 letters"),
    ([WEATHER, WEATHER], "given twice"),
    ([{"type": "function", "function": {"name": "f", "parameters": "{}"}}], "JSON Schema object"),
    ([{"type": "function", "function": {"name": "f", "description": 3}}], "description must be a string"),
])
def test_bad_tools_are_refused_naming_what_is_wrong(tools, wrong):
    with pytest.raises(InvalidArgumentError, match=wrong):
        check_tools(tools)


def test_good_tools_pass_and_empty_means_none():
    assert check_tools([WEATHER]) == [WEATHER]
    assert check_tools([]) is None and check_tools(None) is None


# -- splitting streamed text ------------------------------------------------------------------------
def test_splitter_holds_back_a_possible_marker_and_never_hands_out_part_of_one():
    s = ToolCallSplitter(JSON_CALLS)
    assert s.feed("It is <tool") == [("text", "It is ")]  # "<tool" may become the marker
    assert s.feed("_ca") == []
    assert s.feed('ll>{"name": "f"') == []  # inside a call: nothing until its end marker
    assert s.feed(', "arguments": {}}</tool_call>ok') == [("call", '{"name": "f", "arguments": {}}'), ("text", "ok")]
    assert s.feed(" <tools>") == [("text", " <tools>")]  # no longer a prefix of the marker
    assert s.finish() == []


def test_an_unended_call_is_open_and_an_empty_end_marker_runs_to_the_end():
    s = ToolCallSplitter(JSON_CALLS)
    s.feed('<tool_call>{"name": "f", "argu')
    assert s.finish() == [("open_call", '{"name": "f", "argu')]
    mistral = ToolFormat("[TOOL_CALLS]", "", lambda body, tools: json.loads(body))
    s = ToolCallSplitter(mistral)
    assert s.feed('[TOOL_CALLS][{"name": "f", "arguments": {}}]') == []
    assert s.finish() == [("call", '[{"name": "f", "arguments": {}}]')]


def test_reader_gives_the_same_text_and_calls_however_the_text_is_cut():
    text = ("Let me look that up.\n" + call_text("get_weather", {"city": "Paris"}) + "\n"
            + call_text("get_time", {"zone": "CET", "note": "</tool"}) + "\n")
    rng = random.Random(0)
    for _ in range(200):
        got, calls = read_in_pieces(ToolCallReader(JSON_CALLS, [WEATHER]), text, rng)
        assert got == "Let me look that up."
        assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
        assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
        assert json.loads(calls[1]["function"]["arguments"]) == {"zone": "CET", "note": "</tool"}
        assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
        assert len({c["id"] for c in calls}) == 2


def test_text_without_calls_comes_through_whole_whitespace_included():
    text = "Use <tool_calls> and  <b>bold</b>,\n\n a < b.\n\n"
    rng = random.Random(1)
    for _ in range(100):
        assert read_in_pieces(ToolCallReader(JSON_CALLS, None), text, rng) == (text, [])


def test_unreadable_and_cut_off_calls_stay_text_as_the_model_wrote_them():
    bad = "<tool_call>not json</tool_call>"
    assert read_in_pieces(ToolCallReader(JSON_CALLS, None), "a " + bad, random.Random(2)) == ("a " + bad, [])
    cut = 'b <tool_call>{"name": "get_weather", "arg'
    assert read_in_pieces(ToolCallReader(JSON_CALLS, None), cut, random.Random(3)) == (cut, [])


def test_parse_calls_keeps_string_arguments_and_reads_lists():
    as_list = ToolFormat("[", "]", lambda body, tools: json.loads("[" + body + "]"))
    calls = parse_calls('{"name": "a", "arguments": "{\\"x\\": 1}"}, {"name": "b", "arguments": {}}', as_list, None)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("a", '{"x": 1}'), ("b", "{}")]
    assert parse_calls('{"arguments": {}}', JSON_CALLS, None) is None  # no name: not a call


# -- the engine renders them ------------------------------------------------------------------------
def test_tools_are_rendered_into_the_prompt_and_past_calls_too():
    tok = tiny.make_tokenizer(tiny.TOOLS_TEMPLATE)
    text = tok.decode(encode_prompt(ASK, tok, tiny.VOCAB, tools=[WEATHER]))
    assert '"name": "get_weather"' in text and "Weather in Paris?" in text
    turns = ASK + [{"role": "assistant", "content": None,
                    "tool_calls": [{"id": "c1", "type": "function",
                                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                   {"role": "tool", "tool_call_id": "c1", "content": "18 C, sunny"}]
    text = tok.decode(encode_prompt(turns, tok, tiny.VOCAB, tools=[WEATHER]))
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text
    assert "<|im_start|>tool\n18 C, sunny" in text


def test_tools_the_template_would_not_show_are_refused():
    engine = Engine(tiny.make_llama(0), tiny.make_tokenizer())
    with pytest.raises(InvalidArgumentError, match="does not render tools"):
        engine.generate(ASK, tools=[WEATHER], max_tokens=2)
    with pytest.raises(InvalidArgumentError, match="tools need a prompt of chat messages"):
        Engine(tiny.make_llama(0), tiny.make_tokenizer(tiny.TOOLS_TEMPLATE)).generate("hi", tools=[WEATHER])
    with pytest.raises(InvalidArgumentError, match="only function tools"):
        engine.generate(ASK, tools=[{"type": "code_interpreter"}])


@pytest.mark.parametrize("options", [{}, {"speculative": False}, {"tree": "off", "num_draft": 4}])
def test_a_scripted_call_comes_out_token_for_token(options):
    tok = tiny.make_tokenizer(tiny.TOOLS_TEMPLATE)
    model = tiny.ScriptedModel()
    engine = Engine(model, tok)
    script = call_text("get_weather", {"city": "Paris"})
    model.say(tok.encode(script, add_special_tokens=False), len(encode_prompt(ASK, tok, tiny.VOCAB, tools=[WEATHER])))
    r = engine.generate(ASK, tools=[WEATHER], max_tokens=200, **options)
    assert (r.text, r.finish_reason) == (script, "stop")
    assert engine.tool_format.name == "json_tools"


@pytest.mark.parametrize("text, expected", [
    ("Answer " + call_text("f", {}) + " then some text after.", "Answer then some text after."),
    ("Checking.\n" + call_text("f", {}) + "\n" + call_text("g", {}) + "\n Done.\n", "Checking.\nDone."),
    (call_text("f", {}) + "\n\nHi", "Hi"),  # no text before the call: nothing to separate
    ("A" + call_text("f", {}) + "B", "AB"),  # the model wrote no space: none is added
])
def test_text_a_call_parts_keeps_one_separator(text, expected):
    rng = random.Random(4)
    for _ in range(50):
        got, calls = read_in_pieces(ToolCallReader(JSON_CALLS, None), text, rng)
        assert got == expected and calls


def test_one_call_reads_the_first_call_alone():
    """parallel_tool_calls false: a format whose calls share a body (a list) gives its first; a
    second body's calls are dropped too; the text around them is kept."""
    as_list = ToolFormat("[CALLS]", "", lambda body, tools: json.loads(body))
    text = 'Two: [CALLS][{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]'
    rng = random.Random(5)
    for _ in range(30):
        got, calls = read_in_pieces(ToolCallReader(as_list, None, one=True), text, rng)
        assert got == "Two:" and [c["function"]["name"] for c in calls] == ["a"]
        got, calls = read_in_pieces(ToolCallReader(JSON_CALLS, None, one=True),
                                    "x " + call_text("f", {}) + call_text("g", {}) + " y", rng)
        assert got == "x y" and [c["function"]["name"] for c in calls] == ["f"]
    assert len(read_in_pieces(ToolCallReader(as_list, None), text, rng)[1]) == 2


@pytest.mark.parametrize("options", [{}, {"speculative": False}, {"tree": "off", "num_draft": 4}])
def test_one_call_at_most_ends_the_answer_with_the_first_call(options):
    """parallel_tool_calls=False: the engine stops where the first call's end marker is written,
    the marker kept (the server reads the call from it), with no stop_reason; True writes on."""
    tok = tiny.make_tokenizer(tiny.TOOLS_TEMPLATE)
    model = tiny.ScriptedModel()
    engine = Engine(model, tok, drafter="ngram")
    first = "Checking. " + call_text("get_weather", {"city": "Paris"})
    script = first + "\n" + call_text("get_weather", {"city": "Rome"}) + " And more."
    model.say(tok.encode(script, add_special_tokens=False), len(encode_prompt(ASK, tok, tiny.VOCAB, tools=[WEATHER])))
    r = engine.generate(ASK, tools=[WEATHER], max_tokens=200, parallel_tool_calls=False, **options)
    assert (r.text, r.finish_reason, r.stop_reason) == (first, "stop", None)
    events = list(engine.stream(ASK, tools=[WEATHER], max_tokens=200, parallel_tool_calls=False, **options))
    assert "".join(ev.text for ev in events) == first and events[-1].stop_reason is None
    assert engine.generate(ASK, tools=[WEATHER], max_tokens=200, **options).text == script
    # without tools it is nothing to the answer; a bad value is refused
    model.say(tok.encode(script, add_special_tokens=False), len(encode_prompt(ASK, tok, tiny.VOCAB)))
    assert engine.generate(ASK, max_tokens=200, parallel_tool_calls=False, **options).text == script
    with pytest.raises(InvalidArgumentError, match="parallel_tool_calls must be True or False, got 'no'"):
        engine.generate(ASK, tools=[WEATHER], parallel_tool_calls="no")

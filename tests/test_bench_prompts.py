"""The builtin suite and the validation of users' --prompts files."""

import json

import pytest

from mlxspec.bench.prompts import CATEGORIES, builtin_suite, load_prompts, parse_suite, select, stratified
from mlxspec.errors import InvalidArgumentError


def test_builtin_suite_covers_six_categories_with_unique_ids():
    suite = builtin_suite()
    assert len(suite) >= 24
    assert len({p.id for p in suite}) == len(suite)
    for cat in CATEGORIES:
        assert sum(p.category == cat for p in suite) >= 4, cat
    assert {p.category for p in suite} == set(CATEGORIES)


def test_input_grounded_prompts_carry_their_input():
    suite = builtin_suite()
    for p in suite:
        if p.category == "summarization":
            passage = p.prompt.split("\n\n", 1)[1]
            assert 150 <= len(passage.split()) <= 250, (p.id, len(passage.split()))
        if p.category == "code-edit":
            assert "```" in p.prompt, p.id


def test_short_suite_is_stratified_over_all_categories():
    short = select(builtin_suite(), full=False, limit=None)
    assert len(short) == 8
    assert {p.category for p in short} == set(CATEGORIES)
    assert select(builtin_suite(), full=True, limit=None) == builtin_suite()
    assert len(select(builtin_suite(), full=True, limit=3)) == 3


def test_stratified_takes_round_robin():
    ps = parse_suite("\n".join(json.dumps({"prompt": f"q{i}", "category": c}) for i, c in enumerate("aaabbc")))
    assert [p.prompt for p in stratified(ps, 4)] == ["q0", "q3", "q5", "q1"]


def test_prompts_are_chat_messages():
    p = builtin_suite()[0]
    assert p.messages() == [{"role": "user", "content": p.prompt}]


def test_user_file_defaults_and_blank_lines(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"prompt": "one"}\n\n{"prompt": "two", "id": "b", "category": "code"}\n')
    ps = load_prompts(f)
    assert [(p.id, p.category, p.prompt) for p in ps] == [("line-1", "other", "one"), ("b", "code", "two")]


@pytest.mark.parametrize("text, line, words", [
    ('{"prompt": "ok"}\nnot json\n', 2, "not valid JSON"),
    ('{"prompt": "ok"}\n{"id": "x"}\n', 2, "'prompt' must be a non-empty string"),
    ('["a list"]\n', 1, "expected a JSON object"),
    ('{"prompt": "a", "category": 3}\n', 1, "'category' must be a string"),
    ('{"prompt": "a", "id": true}\n', 1, "'id' must be a string or an integer"),
    ('{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "x"}\n', 2, "duplicate id"),
])
def test_bad_lines_are_named(tmp_path, text, line, words):
    f = tmp_path / "bad.jsonl"
    f.write_text(text)
    with pytest.raises(InvalidArgumentError, match=f"line {line}: .*{words}"):
        load_prompts(f)


def test_a_byte_order_mark_and_integer_ids_are_read(tmp_path):
    f = tmp_path / "notepad.jsonl"
    f.write_bytes('{"prompt": "one", "id": 7}\n{"prompt": "two"}\n'.encode("utf-8-sig"))
    assert [(p.id, p.prompt) for p in load_prompts(f)] == [("7", "one"), ("line-2", "two")]


def test_empty_and_missing_files(tmp_path):
    f = tmp_path / "empty.jsonl"
    f.write_text("\n\n")
    with pytest.raises(InvalidArgumentError, match="no prompts"):
        load_prompts(f)
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        load_prompts(tmp_path / "missing.jsonl")


def test_cli_rejects_a_bad_file_before_loading_models(tmp_path, monkeypatch, capsys):
    from mlxspec import cli
    from mlxspec.commands import modelargs

    def no_load(*a, **k):
        raise AssertionError("models must not load when the prompts file is bad")

    monkeypatch.setattr(modelargs, "load_engine", no_load)
    f = tmp_path / "bad.jsonl"
    f.write_text('{"prompt": "fine"}\n{"prompt": ""}\n')
    assert cli.main(["bench", "--prompts", str(f)]) == 1
    assert "line 2" in capsys.readouterr().err


def test_a_file_that_is_not_utf8_is_named(tmp_path):
    f = tmp_path / "latin1.jsonl"
    f.write_bytes('{"prompt": "ok"}\n{"prompt": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(InvalidArgumentError, match="not UTF-8 text .*line 2"):
        load_prompts(f)


def test_a_line_may_be_a_whole_conversation(tmp_path):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": [{"type": "text", "text": "Name a"}, {"type": "text", "text": "colour."}]}]
    f = tmp_path / "chats.jsonl"
    f.write_text(json.dumps({"messages": chat, "id": "c", "category": "long"}) + "\n" + json.dumps({"prompt": "q"}) + "\n")
    conv, plain = load_prompts(f)
    assert conv.messages() == chat and conv.messages() is not conv.messages()  # a fresh copy each time
    assert (conv.id, conv.category, conv.prompt) == ("c", "long", "Name a\ncolour.")
    assert plain.messages() == [{"role": "user", "content": "q"}]
    assert select([conv, plain], full=False, limit=None) == [conv, plain]


def test_a_conversation_encodes_through_the_chat_template():
    from mlxspec.prompts import encode_prompt

    class Tok:  # renders each turn as "role: text", so the whole conversation must reach it
        chat_template = "x"

        def apply_chat_template(self, messages, add_generation_prompt, tokenize, **kw):
            assert add_generation_prompt and not tokenize
            return "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|assistant:"

        def encode(self, text, add_special_tokens):
            return [ord(c) for c in text]

    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    p = parse_suite(json.dumps({"messages": chat}))[0]
    assert "".join(map(chr, encode_prompt(p.messages(), Tok(), 256))) == "user:a|assistant:b|user:c|assistant:"


@pytest.mark.parametrize("line, words", [
    ({"messages": []}, "'messages' must be a non-empty list"),
    ({"messages": "hi"}, "'messages' must be a non-empty list"),
    ({"messages": [{"content": "hi"}]}, "message 0 must be an object with a string 'role'"),
    ({"messages": [{"role": "user", "content": 5}]}, "message 0's content must be a string or a list"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
     "its role must be user or tool, got 'assistant'"),
    ({"messages": [{"role": "user", "content": "  "}]}, "the last message's content must be non-empty"),
    ({"messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}, "'prompt' or 'messages', not both"),
])
def test_bad_conversations_are_named(line, words):
    with pytest.raises(InvalidArgumentError, match=f"line 1: .*{words}"):
        parse_suite(json.dumps(line))


def test_an_assistant_turn_with_tool_calls_needs_no_content():
    chat = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function",
                                                                     "function": {"name": "w", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "1", "content": "sunny"}]
    assert parse_suite(json.dumps({"messages": chat}))[0].messages() == chat

"""The training scripts' prompt sources beyond the templates: --prompt-file (mlx-lm's JSONL
formats, checked line by line with errors that say what is allowed), scripts/code_prompts.py
(prompts built from the standard library) and scripts/chat_prompts.py's asking and cleaning
(the target writing chat prompts; its generation needs torch, these parts do not)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import chat_prompts  # noqa: E402
import code_prompts  # noqa: E402
import draft_prompts  # noqa: E402
import train_eagle  # noqa: E402
from draft_prompts import chat_ids, read_prompt_file  # noqa: E402


def _write(tmp_path, lines, name="p.jsonl"):
    path = tmp_path / name
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_prompt_and_messages_lines(tmp_path):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."}]
    path = _write(tmp_path, [{"prompt": "What is 2+2?", "completion": "4", "kind": "math"}, "",
                             {"messages": chat}])
    got = read_prompt_file(path)
    assert got[0] == {"kind": "math", "prompt": "What is 2+2?"}
    # a chat is answered after its last user message: the final assistant turn is the target's to write
    assert got[1] == {"kind": "file", "prompt": chat[:4]}


@pytest.mark.parametrize("line,where", [
    ("{not json", "line 2: not JSON"),
    ({"text": "no prompt"}, 'line 2: each line must be a JSON object with "prompt"'),
    ({"prompt": "  "}, "line 2: each line"),
    ({"prompt": 3}, "line 2: each line"),
    ([1, 2], "line 2: each line"),
    ({"messages": [{"role": "assistant", "content": "hi"}]}, "line 2: \"messages\" has no user message"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "line 2: \"messages\" must be a list of"),
    ({"messages": "hi"}, "line 2: \"messages\" must be a list of"),
])
def test_bad_lines_name_the_line_and_what_is_allowed(tmp_path, line, where):
    path = _write(tmp_path, [{"prompt": "fine"}, line])
    with pytest.raises(SystemExit, match=where):
        read_prompt_file(path)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(SystemExit, match="no such file"):
        read_prompt_file(tmp_path / "absent.jsonl")
    with pytest.raises(SystemExit, match="no prompts in it"):
        read_prompt_file(_write(tmp_path, ["", "  "]))


def test_prompt_files_are_keyed_by_content(tmp_path):
    a = _write(tmp_path, [{"prompt": "one"}], "a.jsonl")
    b = _write(tmp_path, [{"prompt": "one"}], "b.jsonl")
    c = _write(tmp_path, [{"prompt": "two"}], "c.jsonl")
    ka, kb, kc = (list(draft_prompts.prompt_files([p]))[0] for p in (a, b, c))
    assert ka == kb != kc  # the same prompts reuse their answers; edited ones get new shards
    assert ka.startswith("file-")


class _Tok:
    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def encode(self, text, add_special_tokens):
        return [ord(ch) for ch in text]


def test_chat_ids_takes_a_string_or_messages():
    tok = _Tok()
    one = chat_ids(tok, "Hi")
    assert one == chat_ids(tok, [{"role": "user", "content": "Hi"}])
    assert "".join(map(chr, chat_ids(tok, [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]))) \
        == "<system>S<user>Hi<assistant>"


def test_code_prompts_are_distinct_seeded_and_well_formed(tmp_path):
    a = code_prompts.make_code_prompts(60, seed=3)
    assert a == code_prompts.make_code_prompts(60, seed=3)
    assert a != code_prompts.make_code_prompts(60, seed=4)
    assert len({x["prompt"] for x in a}) == 60
    assert {x["kind"] for x in a} <= {"code", "code-edit", "summarization"}
    for x in a:
        if x["kind"] != "summarization":
            assert "```python\ndef " in x["prompt"] and x["prompt"].endswith("\n```")
        assert "{old}" not in x["prompt"] and "{new}" not in x["prompt"]
    out = tmp_path / "c.jsonl"
    code_prompts.main(["--n", "12", "--seed", "1", "--out", str(out)])
    assert read_prompt_file(out) == code_prompts.make_code_prompts(12, seed=1)  # round trip through --prompt-file


def test_chat_meta_prompts_cover_the_grid_before_repeating():
    grid = len(chat_prompts.INTENTS) * (len(chat_prompts.EVERYDAY) + len(chat_prompts.TOPICS))
    a = chat_prompts.meta_prompts(grid + 5, seed=0)
    assert a == chat_prompts.meta_prompts(grid + 5, seed=0) and a != chat_prompts.meta_prompts(grid + 5, seed=1)
    assert len({m[2] for m in a[:grid]}) == grid  # every (intent, topic) once, then repeats (sampling differs)
    assert a[grid:] == a[:5]
    for intent, topic, meta in a[:50]:
        assert intent.format(t=topic) in meta and "{t}" not in meta


def test_chat_prompt_cleaning():
    clean = chat_prompts.clean
    # labels and wrappers go; the user's message stays
    assert clean("User: What is a good name for a puppy?", True) == "What is a good name for a puppy?"
    assert clean('Sure, here\'s a message:\n\n"Hey AI, can you help me plan a garden?"', True) \
        == "Hey AI, can you help me plan a garden?"
    assert clean('A user might send: "Which bread is easiest to bake at home?', False) \
        == "Which bread is easiest to bake at home?"
    assert clean('"Give me three ideas for a rainy weekend."', True) == "Give me three ideas for a rainy weekend."
    # stopped by the length limit: whole sentences only, or nothing
    assert clean("Tell me about knitting. I want to start with a scarf and", False) == "Tell me about knitting."
    assert clean("Tell me about knitting and scarves and wool and", False) is None
    # too short, too few words, too long
    assert clean("Hi there", True) is None
    assert clean("Supercalifragilisticexpialidocious!!", True) is None
    assert clean("Why? " * 200, True) is None

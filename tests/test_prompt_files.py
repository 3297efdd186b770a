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
import public_prompts  # noqa: E402
import split_prompts  # noqa: E402
from mlxspec.training import draft_prompts  # noqa: E402
from mlxspec.training.draft_prompts import chat_ids, read_prompt_file  # noqa: E402


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
    # round trip through --prompt-file (which keeps kind and prompt; "source" is for split_prompts.py)
    assert read_prompt_file(out) == [{"kind": x["kind"], "prompt": x["prompt"]}
                                     for x in code_prompts.make_code_prompts(12, seed=1)]
    for x in a:  # the source names the function or docstring the prompt shows
        name = x["source"].rsplit(":", 1)[1]
        assert x["source"].split(":")[0].endswith(".py")
        assert x["kind"] == "summarization" or f"def {name}(" in x["prompt"]


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


def test_an_eval_suite_can_be_a_prompt_file(tmp_path):
    path = _write(tmp_path, [{"prompt": "Held out, never trained on.", "kind": "chat-self"}])
    assert draft_prompts.eval_suite(str(path)) == [{"kind": "chat-self", "prompt": "Held out, never trained on."}]
    assert draft_prompts.eval_suite("bench")[0]["kind"] == "chat"  # the names still mean the builtin suites
    with pytest.raises(SystemExit, match=r"^--suite .*absent\.jsonl: no such file"):
        draft_prompts.eval_suite(str(tmp_path / "absent.jsonl"))


def test_split_holds_out_whole_values():
    lines = [{"prompt": f"p{i}", "topic": f"t{i % 10}"} for i in range(60)]
    train, held = split_prompts.split(lines, 4, "topic", seed=1)
    assert (train, held) == split_prompts.split(lines, 4, "topic", seed=1)
    assert len(held) == 4 and len({x["topic"] for x in held}) == 4
    assert not {x["topic"] for x in train} & {x["topic"] for x in held}  # no held-out topic is trained on
    assert len(train) == 60 - 4 * 6  # every line of a held-out topic left the train file
    by_line_train, by_line_held = split_prompts.split(lines, 5, None, seed=1)
    assert len(by_line_held) == 5 and len(by_line_train) == 55
    assert not {x["prompt"] for x in by_line_train} & {x["prompt"] for x in by_line_held}


@pytest.mark.parametrize("n,by,match", [
    (0, "topic", "--held-out 0: must be at least 1 and below the 3 distinct 'topic' values"),
    (3, "topic", "--held-out 3: must be at least 1"),
    (1, "source", "--by source: line 1 has no 'source' field"),
])
def test_split_refuses_what_cannot_be_held_out(n, by, match):
    lines = [{"prompt": "a", "topic": "x"}, {"prompt": "b", "topic": "y"}, {"prompt": "c", "topic": "z"}]
    with pytest.raises(SystemExit, match=match):
        split_prompts.split(lines, n, by)


def test_split_cli_writes_both_files(tmp_path):
    src = tmp_path / "code.jsonl"
    code_prompts.main(["--n", "40", "--seed", "2", "--out", str(src)])
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    split_prompts.main([str(src), "--held-out", "6", "--by", "source", "--train", str(train), "--eval", str(held)])
    t, h = read_prompt_file(train), draft_prompts.eval_suite(str(held))
    assert len(h) == 6 and len(t) <= 34
    codes = lambda rows: {r["prompt"].split("\n\n", 1)[1] for r in rows}  # the code or documentation shown
    assert not codes(t) & codes(h)


def _public_sources(tmp_path):
    """A miniature GSM8K split and GPTeacher checkout in their real formats."""
    gsm_train = _write(tmp_path, [{"question": f"Tom has {i} apples. How many?", "answer": "#### 1"} for i in range(30)],
                       "train.jsonl")
    gsm_test = _write(tmp_path, [{"question": f"Ann has {i} pears. How many?", "answer": "#### 2"} for i in range(10)],
                      "test.jsonl")
    root = tmp_path / "gpteacher"
    (root / "Codegen").mkdir(parents=True)
    (root / "Roleplay").mkdir()
    code = [{"instruction": f"Write a function number {i}.", "input": "x = 1" if i % 2 else "", "response": "..."}
            for i in range(20)] + [{"instruction": "Write a function number 0.", "input": "", "response": "dup"}]
    (root / "Codegen/codegen-instruct.json").write_text(json.dumps(code))
    (root / "Roleplay/roleplay-simple-deduped-roleplay-instruct.json").write_text(
        json.dumps([{"instruction": f"You are a pirate {i}.", "input": "", "response": "Arr"} for i in range(12)]))
    _write(root, [{"instruction": f"Seed task {i}", "instances": [{"input": f"in {i}", "output": "o"}]}
                  for i in range(8)], "seedprompts.jsonl")
    return gsm_train, gsm_test, root


def test_public_prompts_hold_out_per_kind(tmp_path):
    gsm_train, gsm_test, root = _public_sources(tmp_path)
    train, held = tmp_path / "t.jsonl", tmp_path / "h.jsonl"
    argv = ["--gsm8k-train", str(gsm_train), "--gsm8k-test", str(gsm_test), "--gpteacher", str(root),
            "--take", "math=25,code=100", "--held-out", "3", "--train", str(train), "--eval", str(held)]
    public_prompts.main(argv)
    t, h = read_prompt_file(train), draft_prompts.eval_suite(str(held))
    kinds = lambda rows: {k: sum(r["kind"] == k for r in rows) for k in ("math", "code", "roleplay", "seed-task")}
    assert kinds(h) == {"math": 3, "code": 3, "roleplay": 3, "seed-task": 3}
    # math: 25 of the train split (its held-out prompts come from the test split); code: all 20
    # distinct instructions but the 3 held out (the duplicate line is dropped); the rest: all but 3
    assert kinds(t) == {"math": 25, "code": 17, "roleplay": 9, "seed-task": 5}
    assert all("pears" in r["prompt"] for r in h if r["kind"] == "math")
    assert not {r["prompt"] for r in t} & {r["prompt"] for r in h}
    assert "Write a function number 1.\n\nx = 1" in {r["prompt"] for r in t + h}  # the input follows the instruction
    assert "Seed task 0\n\nin 0" in {r["prompt"] for r in t + h}  # a seed task's first instance
    lengths = [len(r["prompt"]) for r in t]
    assert lengths == sorted(lengths)  # a generation batch pads to its longest prompt
    first = (train.read_text(), held.read_text())
    public_prompts.main(argv)
    assert (train.read_text(), held.read_text()) == first  # same inputs, same seed: same files


@pytest.mark.parametrize("argv,match", [
    ([], "no source given"),
    (["--gsm8k-test", "T"], "--gsm8k-test needs --gsm8k-train"),
    (["--gsm8k-train", "absent.jsonl"], "--gsm8k-train: absent.jsonl is not a file"),
    (["--gpteacher", "G", "--take", "poetry=3"], "--take 'poetry=3': expected KIND=N with KIND one of"),
    (["--gpteacher", "G", "--held-out", "0"], "--held-out 0: must be at least 1"),
])
def test_public_prompts_refuse_bad_input(tmp_path, monkeypatch, argv, match):
    _, _, root = _public_sources(tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = [str(root) if a == "G" else a for a in argv]
    with pytest.raises(SystemExit, match=match):
        public_prompts.main(argv + ["--train", "t.jsonl", "--eval", "h.jsonl"])
    assert not (tmp_path / "t.jsonl").exists()  # nothing half-written


def test_public_prompts_refuse_one_file_for_both_and_skip_blank_questions(tmp_path, capsys):
    gsm_train, gsm_test, root = _public_sources(tmp_path)
    with pytest.raises(SystemExit):
        public_prompts.main(["--gpteacher", str(root), "--train", str(tmp_path / "x.jsonl"),
                             "--eval", str(tmp_path / "." / "x.jsonl")])
    assert "--train and --eval are the same file" in capsys.readouterr().err
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"question": "  ", "answer": "a"}\n{"question": "How many?", "answer": "2"}\n')
    assert public_prompts.gsm8k(blank, "--gsm8k-train") == ["How many?"]


def test_public_prompts_name_a_malformed_file(tmp_path):
    bad = tmp_path / "train.jsonl"
    bad.write_text('{"answer": "no question"}\n')
    with pytest.raises(SystemExit, match='every line needs a "question" string'):
        public_prompts.gsm8k(bad, "--gsm8k-train")
    bad.write_text("{oops\n")
    with pytest.raises(SystemExit, match="neither a JSON array nor JSON lines"):
        public_prompts.gsm8k(bad, "--gsm8k-train")


def test_files_that_cannot_be_read_are_said_not_raised(tmp_path):
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes('{"prompt": "caf\xe9"}\n'.encode("latin-1"))
    for path, says in ((tmp_path / "missing.jsonl", "no such file"), (tmp_path, "no such file"),
                       (bad, "cannot be read as UTF-8")):
        with pytest.raises(SystemExit, match=says):
            draft_prompts.prompt_files([path])


def test_a_chat_given_as_prompt_follows_the_messages_rules(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": ["a"]}\n')
    with pytest.raises(SystemExit, match=r'line 1: "messages" must be a list of'):
        draft_prompts.read_prompt_file(f)
    f.write_text('{"prompt": [{"role": "user", "content": "hi"}]}\n')
    assert draft_prompts.read_prompt_file(f)[0]["prompt"] == [{"role": "user", "content": "hi"}]


def test_write_jsonl_refuses_a_folder_and_leaves_no_temporary_file(tmp_path):
    with pytest.raises(SystemExit, match="is a folder"):
        draft_prompts.write_jsonl(tmp_path, [{"prompt": "x"}])
    with pytest.raises(SystemExit, match="does not exist"):
        draft_prompts.write_jsonl(tmp_path / "no" / "x.jsonl", [{"prompt": "x"}])
    assert list(tmp_path.parent.glob(tmp_path.name + ".tmp")) == []

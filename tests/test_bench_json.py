"""`mlxspec bench --json/--csv/--plot` end to end on tiny models (the loader is replaced by a tiny engine)."""

import csv
import json
import os
import sys

import mlx.core as mx
import pytest
from bench_helpers import bench_cli_json, tiny_engine

from tiny import VOCAB, RoundingModel, accept_every_draft

from mlxspec import cli, loop
from mlxspec.bench.prompts import builtin_suite, select
from mlxspec.commands import modelargs
from mlxspec.engine import Engine
from mlxspec.warmup import default_max_j

TOP = {"mlxspec_version", "device", "pair", "settings", "runs", "summary"}
RUN_TYPES = {
    "prompt_id": str, "category": str, "mode": str, "drafter": (str, type(None)), "num_draft": str,
    "prompt_tokens": int, "prompt_seconds": float, "tokens": int, "seconds": float, "tokens_per_second": float,
    "rounds": int, "drafted": int, "accepted": int, "acceptance_rate": float, "tokens_per_target_pass": float,
    "peak_memory_bytes": int, "matches_vanilla": (bool, type(None)),
}


@pytest.fixture(scope="module")
def bench_json(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    mp = pytest.MonkeyPatch()
    mp.setenv("MLXSPEC_HOME", str(tmp / "home"))
    eng = tiny_engine()
    mp.setattr(modelargs, "load_engine", lambda args, **kw: eng)
    out = tmp / "b.json"
    code = cli.main(["bench", "--limit", "2", "--max-tokens", "5", "--num-draft", "auto,2",
                     "--drafter", "model,ngram", "--json", str(out), "--csv", str(tmp / "b.csv")])
    mp.undo()
    return code, json.loads(out.read_text()), tmp / "b.csv"


def test_exit_status_and_top_level_keys(bench_json):
    code, doc, _ = bench_json
    assert code == 0
    assert TOP <= set(doc)
    assert isinstance(doc["mlxspec_version"], str)
    assert set(doc["device"]) >= {"backend", "name", "os", "blas"} and doc["device"]["backend"] in ("cpu", "metal", "cuda")
    assert set(doc["pair"]) >= {"name", "target", "draft", "drafters"}
    assert doc["pair"]["drafters"] == ["model", "ngram"] and isinstance(doc["pair"]["draft"], str)


def test_settings_keys_and_types(bench_json):
    s = bench_json[1]["settings"]
    assert s["max_tokens"] == 5 and isinstance(s["max_tokens"], int)
    assert s["temperature"] == 0.0 and isinstance(s["temperature"], float)
    assert s["num_draft"] == ["auto", "2"]
    assert s["seed"] == 0


def test_run_keys_and_types(bench_json):
    runs = bench_json[1]["runs"]
    assert len(runs) == 2 * 6  # 2 prompts x (vanilla + 4 speculative + peer)
    for r in runs:
        for key, typ in RUN_TYPES.items():
            assert key in r, key
            assert isinstance(r[key], typ), (key, r[key])
        assert r["mode"] in ("vanilla", "speculative", "mlx-lm")
    assert {r["drafter"] for r in runs if r["mode"] == "vanilla"} == {None}
    assert {r["drafter"] for r in runs if r["mode"] == "mlx-lm"} == {"model"}


def test_summary_keys_and_types(bench_json):
    s = bench_json[1]["summary"]
    assert isinstance(s["speedup_vs_vanilla"], float)
    assert isinstance(s["speedup_vs_mlx_lm"], float)  # the pair has a draft model, so the peer ran
    assert isinstance(s["mismatches"], int) and s["mismatches"] == 0
    for cat, entry in s["by_category"].items():
        assert isinstance(cat, str) and isinstance(entry["speedup_vs_vanilla"], float)
        assert entry["prompts"] == len({r["prompt_id"] for r in bench_json[1]["runs"] if r["category"] == cat})


def test_greedy_checks_and_warm_up_are_reported(bench_json):
    doc = bench_json[1]
    s = doc["summary"]
    assert (s["bugs"], s["rounding_divergences"], s["unclassified"]) == (0, 0, 0)
    assert s["rounding_divergence_rate"] == 0.0 and doc["pair"]["working_dtype"] == "float32"
    assert all(r["divergence"] is None for r in doc["runs"])
    assert s["engine_warmup_seconds"] > 0 and s["peer_warmup_seconds"] > 0
    assert s["warmup_seconds"] == pytest.approx(s["engine_warmup_seconds"] + s["peer_warmup_seconds"])
    for row in s["settings"]:
        assert row["bugs"] == row["mismatches"] == 0
        mine = row["mode"] != "mlx-lm"
        assert row["warmup"] == ("engine.warmup (shared)" if mine else "untimed runs")
        assert row["warmup_seconds"] == s["engine_warmup_seconds" if mine else "peer_warmup_seconds"]


def bench_exit(monkeypatch, tmp_path, engine, *argv):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(modelargs, "load_engine", lambda args, **kw: engine)
    return cli.main(["bench", "--limit", "1", "--max-tokens", "6", "--num-draft", "2", "--no-peer", *argv])


def test_check_fails_on_a_bug(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(loop, "read", accept_every_draft)  # a wrong verifier

    def engine():  # a draft that never proposes the tiny target's argmax, and a verifier that takes it anyway
        base = tiny_engine()
        return Engine(base.target_model, base.tokenizer, RoundingModel(255, vocab=VOCAB, dtype=mx.float32))

    assert bench_exit(monkeypatch, tmp_path, engine(), "--drafter", "model") == 0  # measured, not checked
    assert bench_exit(monkeypatch, tmp_path, engine(), "--drafter", "model", "--check") == 1
    out = capsys.readouterr()
    assert "MISMATCH" in out.err and "a faster but different output is a bug" in out.out
    assert "0 rounding divergence(s), 1 bug(s)" in out.out


def test_check_passes_rounding_divergences(monkeypatch, tmp_path, capsys):
    from test_bench_runner import rounding_engine

    first = select(builtin_suite(), full=False, limit=1)[0]
    assert bench_exit(monkeypatch, tmp_path, rounding_engine(first), "--drafter", "model", "--check") == 0
    out = capsys.readouterr()
    assert "MISMATCH" not in out.err and "bug, not a result" not in out.out
    assert "1 rounding divergence(s)" in out.out and "0 bug(s)" in out.out
    assert f"rounding: {first.id} model k=2 at token 2: float32 gap 0.0938 = 0.75 bfloat16 ulp" in out.out


def test_curve_is_reported(bench_json):
    curve = bench_json[1]["curve"]
    assert curve["source"] == "warm-up"  # the warm-up's own timings: the bench measures no curve of its own
    assert curve["ratios"]["1"] == pytest.approx(1.0) and len(curve["ratios"]) == default_max_j()


def test_a_calibration_curve_the_cost_models_started_from_is_named(monkeypatch, tmp_path, capsys):
    from mlxspec.calibration import calibrate, calibration_path, save

    assert bench_exit(monkeypatch, tmp_path, tiny_engine(), "--json", str(tmp_path / "none.json")) == 0
    assert json.loads((tmp_path / "none.json").read_text())["curve"]["prior"] is None
    assert "calibration file" not in capsys.readouterr().out
    engine = tiny_engine()
    save(calibrate(engine.target_model, max_j=4, prefix=8, repeats=1))  # in the test's MLXSPEC_HOME
    assert bench_exit(monkeypatch, tmp_path, engine, "--json", str(tmp_path / "cal.json")) == 0
    curve = json.loads((tmp_path / "cal.json").read_text())["curve"]
    assert curve["prior"] == str(calibration_path()) and curve["source"] == "warm-up"
    assert f"started from the calibration file {calibration_path()}" in capsys.readouterr().out


def test_outputs_that_name_one_file_are_refused_before_loading(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(modelargs, "load_engine", lambda *a, **k: pytest.fail("must fail before loading"))
    same = str(tmp_path / "out.x")
    assert cli.main(["bench", "--json", same, "--csv", str(tmp_path / "." / "out.x")]) == 1
    assert f"--json and --csv name the same file {same!r}" in capsys.readouterr().err


def test_a_file_that_cannot_be_written_at_the_end_is_named_and_the_others_are_written(monkeypatch, tmp_path,
                                                                                      capsys):
    from mlxspec.bench import report

    def fail(doc, path):
        raise FileNotFoundError(2, "No such file or directory", str(tmp_path / ".b.json-x.tmp"))

    monkeypatch.setattr(report, "write_json", fail)
    csv_path = tmp_path / "b.csv"
    assert bench_exit(monkeypatch, tmp_path, tiny_engine(), "--json", str(tmp_path / "b.json"), "--csv",
                      str(csv_path)) == 1
    err = capsys.readouterr().err
    assert f"cannot write --json {tmp_path / 'b.json'}: No such file or directory" in err and ".tmp" not in err
    assert csv_path.exists() and f"wrote {csv_path}" in err


def test_a_prompt_past_the_context_is_named_before_any_run(monkeypatch, tmp_path, capsys):
    engine = tiny_engine()
    suite = tmp_path / "s.jsonl"
    suite.write_text(json.dumps({"prompt": "x " * engine.context, "id": "huge"}) + "\n")  # (bench_exit: --limit 1)
    monkeypatch.setattr(Engine, "warmup", lambda *a, **k: pytest.fail("no run before the check"))
    assert bench_exit(monkeypatch, tmp_path, engine, "--prompts", str(suite), "--json", str(tmp_path / "o.json")) == 1
    err = capsys.readouterr().err
    assert "prompt 'huge' has" in err and f"the model's context is {engine.context}" in err
    assert "--max-kv-size" in err and not (tmp_path / "o.json").exists()


def test_an_output_path_checked_leaves_its_folder_as_it_was(tmp_path):
    from mlxspec.commands.argtypes import output_path

    (tmp_path / "old.json").write_text("{}")
    assert output_path(str(tmp_path / "new.json")) == str(tmp_path / "new.json")
    assert output_path(str(tmp_path / "old.json")) == str(tmp_path / "old.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]  # no probe left, nothing created
    assert (tmp_path / "old.json").read_text() == "{}"


def test_json_to_stdout_leaves_the_report_to_stderr(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)  # where a file named "-" would land
    assert bench_exit(monkeypatch, tmp_path, tiny_engine(), "--json", "-") == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)  # stdout is the document alone, for a pipe into jq
    assert doc["runs"] and "greedy checks vs vanilla" in err and "wrote" not in err
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("where, says", [
    ("{tmp}", "is a folder; give a file path in it"),
    ("{tmp}/no-such-folder/b.json", "does not exist; create it"),
    ("{tmp}/a-file/b.json", "/a-file' is a file, not a folder"),
    # permission bits pass there (as root, or a read-only mount), but no file can be made
    pytest.param("/proc/b.json", "cannot write in the folder '/proc'" if os.access("/proc", os.W_OK)
                 else "the folder '/proc' is not writable",
                 marks=pytest.mark.skipif(not os.path.isdir("/proc"), reason="no /proc here")),
])
def test_output_paths_are_checked_when_parsed(monkeypatch, tmp_path, capsys, where, says):
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setattr(modelargs, "load_engine", lambda *a, **k: pytest.fail("must fail before loading"))
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--json", where.format(tmp=tmp_path)])
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_options_that_compare_nothing_are_said(monkeypatch, tmp_path, capsys):
    assert bench_exit(monkeypatch, tmp_path, tiny_engine(), "--drafter", "ngram", "--lookup", "on,off") == 0
    assert "note: --lookup off changes nothing here" in capsys.readouterr().err
    assert bench_exit(monkeypatch, tmp_path, tiny_engine(), "--drafter", "model", "--tree", "auto,off") == 0
    err = capsys.readouterr().err  # bench_exit's fixed --num-draft 2 drafts chains
    assert "note: --tree compares nothing here" in err and "--lookup" not in err
    assert bench_exit(monkeypatch, tmp_path, tiny_engine(), "--drafter", "model", "--lookup", "on,off") == 0
    assert "note:" not in capsys.readouterr().err  # a model drafter's chains copy or not: two settings


def test_csv_has_one_row_per_run(bench_json):
    _, doc, path = bench_json
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == len(doc["runs"])
    assert [r["mode"] for r in rows] == [r["mode"] for r in doc["runs"]]
    assert json.loads(rows[1]["k_histogram"]) == doc["runs"][1]["k_histogram"]


def test_plot_without_matplotlib_says_how_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setattr(modelargs, "load_engine", lambda *a, **k: pytest.fail("must fail before loading"))
    assert cli.main(["bench", "--plot", str(tmp_path / "p.png")]) == 1
    assert "pip install matplotlib" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["--num-draft", "auto,x"], "--num-draft: 'x' is not valid: expected 'auto' or an integer in 0.."),
    (["--temperature", "0,-1"], "--temperature: '-1' is not valid: expected a finite number >= 0"),
    (["--temperature", "inf"], "--temperature: 'inf' is not valid: expected a finite number >= 0"),
    (["--drafter", "ngram,none"], "--drafter: 'none' is not valid: expected ngram, model or eagle"),
    (["--max-tokens", "0"], "--max-tokens: expected an integer >= 1, got '0'"),
    (["--limit", "0"], "--limit: expected an integer >= 1, got '0'"),
    (["--lookup", "on,maybe"], "--lookup: 'maybe' is not valid: expected 'on' or 'off'"),
    (["--tree", "auto,99"], "--tree: '99' is not valid: expected 'auto', 'off' or an integer in 1.."),
    (["--num-draft", ","], "--num-draft: needs at least one value, got ','"),
])
def test_bad_options_are_rejected_with_the_usage_before_loading(monkeypatch, capsys, argv, words):
    """As every command's: exit 2 with the usage (README, "Use it")."""
    monkeypatch.setattr(modelargs, "load_engine", lambda *a, **k: pytest.fail("must fail before loading"))
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: mlxspec bench") and words in err


@pytest.mark.parametrize("blas, hint", [("reference", True), ("openblas", False)])
def test_report_names_the_blas_and_says_how_to_get_a_faster_one(bench_json, blas, hint):
    from rich.console import Console

    from mlxspec.bench.report import print_report

    doc = json.loads(json.dumps(bench_json[1]))
    doc["device"].update(backend="cpu", blas=blas)
    console = Console(record=True, width=300)
    print_report(doc, console)
    text = console.export_text()
    assert ("reference BLAS" if blas == "reference" else "OpenBLAS") in text
    assert ("apt install libopenblas0" in text) == hint


def test_repeats_are_passes_over_the_prompts(monkeypatch, tmp_path, capsys):
    doc = bench_cli_json(monkeypatch, tmp_path, "--limit", "2", "--max-tokens", "4", "--drafter", "ngram",
                         "--no-peer", "--repeats", "2")
    assert doc["settings"]["repeats"] == 2
    modes = [("vanilla", "speculative"), ("speculative", "vanilla")]  # the order rotates block by block
    assert [(r["repeat"], r["mode"]) for r in doc["runs"]] == [(rep, m) for rep in (0, 1) for i in range(2)
                                                               for m in modes[i]]
    assert "2 prompts x 2 passes" in capsys.readouterr().out


def test_report_labels_say_tree_lookup_and_the_headline_temperature(bench_json):
    from rich.console import Console

    from mlxspec.bench.report import print_report, rounding_lines

    doc = json.loads(json.dumps(bench_json[1]))
    spec = next(r for r in doc["summary"]["settings"] if r["mode"] == "speculative")
    doc["summary"]["settings"].append(dict(spec, tree="off", label=spec["label"] + " tree=off"))
    doc["settings"]["temperatures"] = [0.0, 0.7]
    doc["summary"]["default_setting"]["temperature"] = 0.7
    console = Console(record=True, width=300)
    print_report(doc, console)
    text = console.export_text()
    assert f"{spec['drafter']} tree=off" in text  # the by-k table's row is not a twin of the tree=auto one
    assert " at T=0.7: " in text  # the headline says which temperature it reports
    run = dict(doc["runs"][0], mode="speculative", drafter="ngram", num_draft="2", tree="off", lookup="on",
               divergence="rounding", mismatch={"position": 5, "reason": "near tie"})
    assert "ngram k=2 tree=off at token 5" in rounding_lines({"runs": [run]})[0]



@pytest.mark.parametrize("option", ["--max-j", "--prefix", "--repeats"])
def test_calibrate_rejects_bad_counts_when_parsed(option, capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["calibrate", option, "0"])
    assert f"argument {option}: expected an integer >= 1, got '0'" in capsys.readouterr().err


def test_a_suite_of_conversations_runs_whole_conversations(monkeypatch, tmp_path):
    from bench_helpers import tiny_engine

    from mlxspec.prompts import encode_prompt

    chat = [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello there, friend."},
            {"role": "user", "content": "Again."}]
    suite = tmp_path / "chats.jsonl"
    suite.write_text(json.dumps({"id": "long", "category": "chat", "messages": chat}) + "\n")
    eng = tiny_engine()
    doc = bench_cli_json(monkeypatch, tmp_path, "--prompts", str(suite), "--max-tokens", "4", "--drafter", "ngram",
                         "--no-peer", engine=eng)
    whole = len(encode_prompt(chat, eng.tokenizer, eng.vocab_size))
    assert whole > len(encode_prompt(chat[-1:], eng.tokenizer, eng.vocab_size))
    assert {r["prompt_id"] for r in doc["runs"]} == {"long"}
    assert {r["prompt_tokens"] for r in doc["runs"]} == {whole}
    assert all(r["matches_vanilla"] for r in doc["runs"])


@pytest.mark.parametrize("width", [80, 100, 300])
def test_report_tables_cut_no_figure_on_a_narrow_terminal(bench_json, width):
    """An 80-column terminal once got every figure cut to "1.…": a narrow console gets the
    columns in several tables instead, each led by the setting, and no line is wider than it."""
    import io

    from rich.console import Console

    from mlxspec.bench.report import print_report

    doc = bench_json[1]
    out = io.StringIO()
    print_report(doc, Console(file=out, width=width, soft_wrap=False))
    text = out.getvalue()
    tables = [line for line in text.splitlines() if line.startswith(("┏", "┃", "│", "┗", "└"))]
    assert "…" not in "\n".join(tables) and all(len(line) <= width for line in tables)
    assert all(line.rstrip().endswith(("┓", "┃", "│", "┘")) for line in tables)  # every table whole, to its edge
    for r in doc["summary"]["settings"]:  # each setting's figures, whole
        for key in ("tokens_per_second", "tokens_per_target_pass"):
            assert f"{r[key]:.1f}" in text or f"{r[key]:.2f}" in text
        if r["speedup_vs_vanilla"] is not None:
            assert f"{r['speedup_vs_vanilla']:.2f}x" in text
    assert ("(1 of 2)" in text) == (width < 140)


def test_a_report_table_without_rows_or_words_prints_its_header():
    import io

    from rich.console import Console

    from mlxspec.bench.report import _print_table

    out = io.StringIO()
    _print_table(Console(file=out, width=80), "By category", ("category", "vs vanilla"), [])  # no category measured
    _print_table(Console(file=out, width=80), "Blank", ("setting", "x"), [("vanilla", "")])
    assert "category" in out.getvalue() and "vanilla" in out.getvalue()


def test_a_sharded_target_is_said_in_the_json_and_the_headline(bench_json):
    """Two ranks' figures must not pass for one process's: the JSON says how the target was
    sharded, and the headline that memory figures are rank 0's."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from mlxspec.bench.report import pair_info, print_report

    doc = json.loads(json.dumps(bench_json[1]))
    assert doc["pair"]["sharded"] is None  # one process
    engine = tiny_engine()
    engine.coord = SimpleNamespace(active=True, size=2)  # what load(..., distributed=True) leaves over 2 ranks
    engine.target_info = SimpleNamespace(ref="t", sharding="tensor-mlp", adapter=None)
    doc["pair"] = pair_info(engine, ["ngram"])
    assert doc["pair"]["sharded"] == {"ranks": 2, "how": "tensor-mlp"}
    out = io.StringIO()
    print_report(doc, Console(file=out, width=300))
    assert "the target sharded over 2 ranks, memory figures rank 0's" in out.getvalue()


def test_ctrl_c_prints_the_report_of_what_ran_whole_and_writes_no_file(monkeypatch, tmp_path, capsys):
    from mlxspec.bench import runner

    real, runs = runner._run_one, []

    def run_one(*a, **kw):
        if len(runs) == 3:  # the second prompt's second run (vanilla and model k=2 for each)
            raise KeyboardInterrupt
        runs.append(real(*a, **kw))
        return runs[-1]

    monkeypatch.setattr(runner, "_run_one", run_one)
    out = tmp_path / "b.json"
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(modelargs, "load_engine", lambda args, **kw: tiny_engine())
    code = cli.main(["bench", "--limit", "2", "--max-tokens", "5", "--num-draft", "2", "--no-peer", "--drafter",
                     "model", "--json", str(out)])
    assert code == 130 and not out.exists()
    said = capsys.readouterr().out
    assert "Settings (medians over prompts" in said
    assert "interrupted: the figures above cover 2 of the 4 runs planned" in said and "--json not written" in said


def test_the_category_table_counts_its_prompts_and_says_when_one_run_is_all_it_has(bench_json):
    from rich.console import Console

    from mlxspec.bench.report import print_report

    def report(doc) -> str:
        console = Console(record=True, width=300)
        print_report(doc, console)
        return console.export_text()

    doc = json.loads(json.dumps(bench_json[1]))
    assert {e["prompts"] for e in doc["summary"]["by_category"].values()} == {1}  # --limit 2: two categories
    text = report(doc)
    row = next(line for line in text.splitlines() if line.startswith("┃ category"))
    assert row.split("┃")[2].strip() == "prompts"
    assert "a category of one prompt, timed once, moves with this machine's noise" in text
    doc["settings"]["repeats"] = 3  # each timed three times: its median is steadier
    assert "a category of one prompt" not in report(doc)
    doc["settings"]["repeats"] = 1
    for entry in doc["summary"]["by_category"].values():
        entry["prompts"] = 4
    assert "a category of one prompt" not in report(doc)

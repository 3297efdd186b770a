"""`mlxspec train-eagle`: the MLX trainer (mlxspec/training/) as a command of the installed package."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

import tiny
from test_train_eagle_mlx import _prompt_file, _save

from mlxspec.cli import main
from mlxspec.training import eagle_args, train_common, train_eagle

SMALL = ["--prompts", "8", "--held-out", "4", "--max-new", "16", "--gen-batch", "6", "--epochs", "2", "--batch", "4",
         "--ckpt-every", "8", "--draft-vocab", "96"]


def test_trains_a_head_into_mlxspec_s_cache_by_default_and_a_rerun_resumes(tmp_path, monkeypatch, capsys):
    from mlxspec.drafters.eagle import load_head
    from mlxspec.loading.model import load_model

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "home"))
    target = _save(tmp_path / "target", tiny.make_llama(21, tie_embeddings=False))
    argv = ["train-eagle", "--target", str(target), "--out", str(tmp_path / "head"),
            "--prompt-file", str(_prompt_file(tmp_path / "p.jsonl")), *SMALL]
    assert main(argv) == 0
    first = capsys.readouterr().out
    works = list((tmp_path / "home" / "train-eagle").iterdir())
    assert len(works) == 1 and works[0].name.startswith("target-") and f"work folder {works[0]}" in first
    assert (works[0] / "answers.json").exists()
    assert f"draft with it: mlxspec generate --target {target} --head {tmp_path / 'head'}" in first
    assert f"The work folder {works[0]} holds" in first
    model = load_model(str(target))[0]
    assert json.loads((tmp_path / "head" / "config.json").read_text())["training"]["script"] == "mlxspec train-eagle"
    assert "Written by `mlxspec train-eagle`" in (tmp_path / "head" / "README.md").read_text()
    head = load_head(tmp_path / "head", model)  # made for this target: loads against it
    assert head is not None
    # the same command again finds every stage done: no answer is generated anew
    assert main(argv) == 0
    again = capsys.readouterr().out
    assert "generate 1/" in first and "generate 1/" not in again, again
    assert list((tmp_path / "home" / "train-eagle").iterdir()) == works


def test_pair_adds_the_head_to_the_user_s_models_toml_once_and_a_clash_is_refused_before_any_work(
        tmp_path, monkeypatch, capsys):
    import mlxspec
    from mlxspec.loading.registry import pairs

    home = tmp_path / "home"
    home.mkdir()
    mine = '[[pair]]\nname = "theirs"  # a comment kept\ntarget = "org/model"\n'
    (home / "models.toml").write_text(mine)
    monkeypatch.setenv("MLXSPEC_HOME", str(home))
    target = _save(tmp_path / "target", tiny.make_llama(23, tie_embeddings=False))
    argv = ["train-eagle", "--target", str(target), "--out", str(tmp_path / "head"), "--pair", "my pair",
            "--prompt-file", str(_prompt_file(tmp_path / "p.jsonl")), *SMALL]
    assert main(argv) == 0
    assert f"pair 'my pair' added to {home / 'models.toml'}" in capsys.readouterr().out
    text = (home / "models.toml").read_text()
    assert text.startswith(mine) and text.count("[[pair]]") == 2  # the user's own lines kept as they were
    pair = pairs()["my pair"]
    assert (pair.target, pair.head, pair.drafter, pair.draft) == (str(target), str(tmp_path / "head"), "eagle", "ngram")
    engine = mlxspec.load("my pair")
    assert engine.eagle is not None and engine.generate("count to ten", max_tokens=4).text
    assert main(argv) == 0  # the same command again: resumed, the pair left as it is
    assert "already in" in capsys.readouterr().out and (home / "models.toml").read_text() == text
    works = sorted((home / "train-eagle").iterdir())
    for clash, says in ((["--out", str(tmp_path / "other"), "--max-new", "12"], "already has a pair 'my pair'"),
                        (["--pair", "demo", "--out", str(tmp_path / "other")], "curated pair's name")):
        assert main([*argv, *clash]) == 1
        assert says in capsys.readouterr().err
        assert sorted((home / "train-eagle").iterdir()) == works and not (tmp_path / "other").exists()
    assert (home / "models.toml").read_text() == text


def _args(**kw):
    base = dict(target="org/model", gguf=None, adapter_path=None, max_new=128, temperature=0.7, seed=0, held_out=32,
                epochs=3.5, lr=1e-3)
    return argparse.Namespace(**{**base, **kw})


def test_the_default_work_folder_changes_with_what_the_answers_depend_on_only(tmp_path, monkeypatch):
    """Another target, adapter or way of answering gets its own folder (one folder holds one way of
    answering: `eagle_data.check_work` refuses the others); training settings share the answers."""
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    base = eagle_args.default_work(_args())
    assert base.parent == tmp_path / "train-eagle" and base.name.startswith("model-")
    assert eagle_args.default_work(_args(epochs=8, lr=3e-4)) == base
    others = [_args(target="org/other"), _args(adapter_path=str(tmp_path)), _args(max_new=64),
              _args(temperature=0.0), _args(seed=1), _args(held_out=8)]
    assert len({base, *map(eagle_args.default_work, others)}) == 1 + len(others)


def test_help_lists_the_command_without_the_pytorch_trainer_and_stays_light():
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-m", "mlxspec", "train-eagle", "--help"], capture_output=True, text=True,
                         cwd=root, check=True)
    assert "--target REF" in run.stdout and "--prompt-file" in run.stdout and "--gguf SmolLM2" not in run.stdout
    assert not any(line.lstrip().startswith(("--gguf", "--threads", "--precision")) for line in run.stdout.splitlines())
    assert "train-eagle" in subprocess.run([sys.executable, "-m", "mlxspec", "--help"], capture_output=True, text=True,
                                           cwd=root, check=True).stdout
    # every command builds its parser at start-up: this one's imports no NumPy (nor the trainers)
    code = ("import sys; from mlxspec.cli import build_parser; build_parser(); "
            "print(sorted(m for m in sys.modules if m == 'numpy' or m.startswith('mlxspec.training.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True).stdout
    assert out.strip() == "['mlxspec.training.draft_prompts', 'mlxspec.training.eagle_args', " \
                          "'mlxspec.training.train_common']", out


def test_a_refusal_is_one_line_exit_status_1_and_ctrl_c_says_the_command_resumes(tmp_path, monkeypatch, capsys):
    target = _save(tmp_path / "target", tiny.make_llama(22))
    argv = ["train-eagle", "--target", str(target), "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"),
            *SMALL]
    assert main([*argv[:-len(SMALL)], "--prompts", "0", "--held-out", "1", "--max-new", "4"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mlxspec train-eagle: error: no train answers") and len(err.strip().splitlines()) == 1, err

    def stopped(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_eagle, "run", stopped)
    assert main(argv) == 130
    assert "interrupted: the same command resumes" in capsys.readouterr().err


def test_a_target_not_found_is_one_line_and_leaves_no_work_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "home"))
    assert main(["train-eagle", "--target", str(tmp_path / "no-such-model"), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mlxspec train-eagle: error: ") and "no-such-model" in err and "Traceback" not in err, err
    assert not (tmp_path / "home" / "train-eagle").exists() and not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv, says", [
    (["--target", "t", "--gguf", "x.gguf"], "unrecognized arguments: --gguf"),
    (["--target", "t", "--precision", "bfloat16"], "unrecognized arguments: --precision"),
    (["--out", "o"], "the following arguments are required: --target"),
    (["--target", "t"], "--out is required"),
])
def test_bad_flags_are_refused_before_any_work(argv, says, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train-eagle", *argv])
    assert e.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize("name, head", [('say "hi"', "/tmp/a\\b"), ("é café", "/tmp/ü"), ("tab\there", "/x y/h")])
def test_an_added_pair_reads_back_as_written_whatever_its_characters(name, head, tmp_path, monkeypatch):
    """TOML's basic strings take JSON's escapes: a quote, a backslash or a tab in a name or path
    cannot break the user's file."""
    from mlxspec.loading.registry import add_own_pair, pairs

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "new" / "home"))  # made if missing
    entry = {"name": name, "target": "org/model", "head": head, "drafter": "eagle"}
    assert add_own_pair(entry) is True and add_own_pair(entry) is False
    got = pairs()[name]
    assert (got.name, got.target, got.head, got.drafter) == (name, "org/model", head, "eagle")


def test_a_local_target_is_named_by_its_absolute_path_a_repo_id_as_given(tmp_path, monkeypatch):
    """The pair and the default work folder name the same target wherever the command was run from."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    here = _args(target="model", pair="p", out="head")
    assert eagle_args.pair_entry(here)["target"] == str(tmp_path / "model")
    assert eagle_args.pair_entry(_args(target="org/model", pair="p", out="head"))["target"] == "org/model"
    assert eagle_args.default_work(_args(target=str(tmp_path / "model"))) == eagle_args.default_work(here)


def test_the_disk_need_is_said_first_and_a_full_disk_ends_in_one_line_that_frees_the_partial_file_and_resumes(
        tmp_path, monkeypatch, capsys):
    import errno
    import re
    import shutil

    import numpy as np

    from mlxspec.training import eagle_data

    target = _save(tmp_path / "target", tiny.make_llama(25, tie_embeddings=False))
    work = tmp_path / "work"
    (work / "mine.tmp").parent.mkdir()
    (work / "mine.tmp").write_text("the user's own")  # not a name the stages write: kept
    argv = ["train-eagle", "--target", str(target), "--out", str(tmp_path / "head"), "--work", str(work),
            "--prompt-file", str(_prompt_file(tmp_path / "p.jsonl")), *SMALL]
    real_savez, real_usage, shards = np.savez, shutil.disk_usage, []

    def savez(path, **arrays):  # the third shard's write fills the disk halfway through
        shards.append(path)
        if len(shards) == 3:
            Path(path).write_bytes(b"\0" * 5000)
            raise OSError(errno.ENOSPC, "No space left on device")
        real_savez(path, **arrays)
    real_say, need = train_common.say_space, []

    def say_space(*args):
        need.append(real_say(*args))
    monkeypatch.setattr(train_common, "say_space", say_space)
    monkeypatch.setattr(eagle_data.np, "savez", savez)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 10**4, 10**4))
    assert main(argv) == 1
    out, err = capsys.readouterr()
    said = re.search(r"still to write take up to [\d.]+ MB in (\S+) \(0\.0 MB free there\)", out)
    assert said and said.group(1) == str(next(work.glob("eagle-gen-mlx-*"))), out
    assert "warning: they may not fit on that disk" in out
    assert err.count("\n") == 1 and err.startswith("mlxspec train-eagle: error: the disk is full")
    assert "the unfinished file was removed" in err and "the same command resumes" in err
    assert re.search(r"writing \S+/eagle-gen-mlx-\S+/[^./]+\.npz\)", err), err  # the shard, not its temporary file
    assert not [f for f in work.rglob("*tmp*") if f.name != "mine.tmp"] and (work / "mine.tmp").exists()
    assert len(list(work.rglob("*.npz"))) == 2

    monkeypatch.setattr(eagle_data.np, "savez", real_savez)
    monkeypatch.setattr(shutil, "disk_usage", real_usage)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "warning" not in out and "generate 1/" not in out and "generate 3/" in out, out
    # the need said before the first run bounds what its shards hold (every answer at --max-new)
    written = sum(p.stat().st_size for p in work.rglob("*.npz"))
    assert len(need) == 2 and need[1] < need[0] and written / 3 < need[0] and written <= need[0] + 2000 * len(shards)


def test_a_disk_that_fills_at_a_checkpoint_ends_in_the_same_one_line_and_the_rerun_finishes(
        tmp_path, monkeypatch, capsys):
    import re
    import shutil

    import mlx.core as mx

    target = _save(tmp_path / "target", tiny.make_llama(26, tie_embeddings=False))
    work = tmp_path / "work"
    argv = ["train-eagle", "--target", str(target), "--out", str(tmp_path / "head"), "--work", str(work),
            "--prompt-file", str(_prompt_file(tmp_path / "p.jsonl")), *SMALL]
    real_save, real_usage = mx.save_safetensors, shutil.disk_usage

    def save(path, arrays):  # MLX's own failure: half a file, and a RuntimeError with no errno
        Path(path).write_bytes(b"\0" * 3000)
        raise RuntimeError("[write] Unable to write 12345 bytes to file.")
    monkeypatch.setattr(mx, "save_safetensors", save)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 10**4, 10**4))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: the disk is full" in err and "unfinished file was removed" in err, err
    assert re.search(r"writing \S+/head_ckpt-[^ ]+\.safetensors\)", err) and ".tmp" not in err, err
    assert not list(work.glob("*tmp*")) and list(work.rglob("*.npz"))  # the answers are kept
    monkeypatch.setattr(mx, "save_safetensors", real_save)
    monkeypatch.setattr(shutil, "disk_usage", real_usage)
    assert main(argv) == 0
    assert "generate 1/" not in capsys.readouterr().out and (tmp_path / "head" / "model.safetensors").exists()

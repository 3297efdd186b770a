"""scripts/train_draft.py without torch: its run tags (the trained draft is cached under a name
made from its answer shards and settings, so more prompts or another setting never export a
stale draft, and a rerun with the same ones reuses its own) and its generate plan with
--prompt-file (every prompt answered once, files after the templates, shards named by content
and by a batch size other than the default)."""
import json
from pathlib import Path

import pytest

from mlxspec.training import draft_answers
from mlxspec.training import train_draft

ARGS = train_draft.parse_args(["--gguf", "t.gguf", "--work", "w", "--out", "o"])
SHARDS = [Path("w/gen") / f"train-t0-{i:03d}.npz" for i in range(4)] + [Path("w/gen/held_out-t0-000.npz")]


def _tag(shards=SHARDS, **kw):
    args = train_draft.parse_args(["--gguf", "t.gguf", "--work", "w", "--out", "o"])
    for k, v in kw.items():
        setattr(args, k, v)
    return train_draft.run_tag(args, shards)


def test_same_answers_and_settings_reuse_the_run():
    assert _tag() == _tag() == _tag(shards=list(reversed(SHARDS)))
    assert train_draft.final_path(ARGS, Path("w"), SHARDS).name == f"draft_final-{_tag()}.pt"


def test_more_answers_or_other_settings_start_a_new_run():
    more = SHARDS + [Path("w/gen/train-t0.7-000.npz")]
    others = [_tag(shards=more), _tag(shards=SHARDS[1:]), _tag(lr=1e-3), _tag(epochs=2.0), _tag(layers=3),
              _tag(hidden=320), _tag(seed=1), _tag(max_len=256)]
    assert len(set(others)) == len(others) and _tag() not in others


def _prompts(n_train, n_held, files=()):
    out = {"train": [{"prompt": f"t{i}"} for i in range(n_train)],
           "held_out": [{"prompt": f"h{i}"} for i in range(n_held)]}
    out.update(files)
    return out


def test_generate_plan_answers_every_prompt_once_files_last(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"mine {i}"}) + "\n" for i in range(7)))
    args = train_draft.parse_args(["--gguf", "t.gguf", "--work", "w", "--out", "o", "--prompt-file", str(f), "--gen-batch", "3"])
    files = train_draft.logged_prompt_files(args.prompt_file)
    (key,) = files
    plain = draft_answers.plan_batches(args, _prompts(10, 2))
    planned = draft_answers.plan_batches(args, _prompts(10, 2, files))
    assert planned[:len(plain)] == plain  # a file appends batches: the templates' shards and seeds stay
    names = [b[0] for b in planned]
    assert names[0] == "held_out-t0-000-b3" and len(set(names)) == len(names)
    extra = planned[len(plain):]
    assert all(b[0].startswith(key + "-t") for b in extra)
    jobs = [j for b in planned for j in b[2]]
    want = {("train", i) for i in range(10)} | {("held_out", i) for i in range(2)} | {(key, i) for i in range(7)}
    assert sorted((j[0], j[1]) for j in jobs) == sorted(want)  # each prompt exactly once
    for j in jobs:  # held-out greedy; the rest alternate greedy and T by index
        assert j[2] == (0.0 if j[0] == "held_out" or j[1] % 2 == 0 else args.temperature)
    assert all(j[2] == b[1] for b in planned for j in b[2])  # one temperature per batch
    assert [b[1] for b in extra[:2]] == [0.0, args.temperature]  # interleaved, so a stopped run has both


def test_another_batch_size_never_takes_the_defaults_shards():
    """Shard n of 48 prompts is not shard n of 96: another --gen-batch writes shards of its own
    names (a work dir answered at 48 keeps its names and resumes), never reading 48's as done."""
    default = train_draft.parse_args(["--gguf", "t.gguf", "--work", "w", "--out", "o"])
    assert default.gen_batch == 48
    wide = train_draft.parse_args(["--gguf", "t.gguf", "--work", "w", "--out", "o", "--gen-batch", "96"])
    plan = {a.gen_batch: draft_answers.plan_batches(a, _prompts(200, 4)) for a in (default, wide)}
    assert plan[48][0][0] == "held_out-t0-000" and plan[48][1][0] == "train-t0-000"
    assert not {b[0] for b in plan[48]} & {b[0] for b in plan[96]}
    assert all(len(b[2]) <= 96 for b in plan[96]) and max(len(b[2]) for b in plan[96]) == 96


@pytest.mark.parametrize("bad", ["0", "-4", "x", "1.5"])
def test_a_batch_size_must_be_a_whole_number(bad, capsys):
    with pytest.raises(SystemExit):
        train_draft.parse_args(["--gguf", "t.gguf", "--work", "w", "--out", "o", "--gen-batch", bad])
    assert "give a whole number of at least 1" in capsys.readouterr().err


def test_out_is_required_and_folders_that_cannot_be_written_are_said_first(tmp_path, capsys):
    """No default --out: a trial run must not replace the shipped draft; a folder under a file is
    refused when parsed, not at export."""
    with pytest.raises(SystemExit):
        train_draft.parse_args(["--gguf", "t.gguf", "--work", "w"])
    assert "--out is required" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    for argv in (["--work", "w", "--out", str(tmp_path / "file" / "o")], ["--work", str(tmp_path / "file"), "--out", "o"]):
        with pytest.raises(SystemExit):
            train_draft.parse_args(["--gguf", "t.gguf", *argv])
        assert "is a file" in capsys.readouterr().err


def test_the_draft_takes_the_targets_vocabulary_special_tokens_context_and_rope_from_its_gguf(tmp_path):
    import gguf
    import numpy as np

    from mlxspec.training.train_draft import target_tokens

    def write(path, **ids):
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_context_length(512)
        w.add_rope_freq_base(5e5)
        for key, value in ids.items():
            w.add_uint32(f"tokenizer.ggml.{key}", value)
        w.add_tensor("token_embd.weight", np.zeros((11, 4), np.float32))  # 11 rows of 4
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path

    got = target_tokens(write(tmp_path / "a.gguf", bos_token_id=5, eos_token_id=7, padding_token_id=9))
    assert got == {"vocab_size": 11, "bos_token_id": 5, "eos_token_id": 7, "pad_token_id": 9,
                   "max_position_embeddings": 512, "rope_theta": 5e5}
    assert target_tokens(write(tmp_path / "b.gguf", bos_token_id=5, eos_token_id=7))["pad_token_id"] == 7


def test_quantized_widths_that_are_not_multiples_of_64_are_refused_before_any_work(tmp_path, capsys):
    for flags in (["--hidden", "96"], ["--intermediate", "100"]):
        with pytest.raises(SystemExit) as e:
            train_draft.parse_args(["--gguf", "x.gguf", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"),
                                    *flags])
        assert e.value.code == 2 and f"{flags[0]} {flags[1]}: --bits 8 quantizes in groups of 64" in \
            capsys.readouterr().err
    assert train_draft.parse_args(["--gguf", "x.gguf", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"),
                                   "--hidden", "96", "--bits", "16"]).hidden == 96

"""scripts/train_eagle.py's settings, without training (no torch needed): the --feature-layers
forms, their errors, and run tags that keep other settings' heads apart (resuming must never
continue a run trained with other settings), and what the --gguf path needs (torch, a llama file)."""
import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from mlxspec.training import eagle_args, eagle_data
from mlxspec.training import eagle_training
from mlxspec.training import train_eagle


@pytest.mark.parametrize("spec,want", [("final", []), ("auto", [2, 14, 26]), ("0,15,29", [0, 15, 29]), ("7", [7])])
def test_feature_layer_forms(spec, want):
    assert eagle_data.feature_layers(spec, 30) == want


@pytest.mark.parametrize("spec", ["3,3", "30", "-1", "a,b", "", "1,,2"])
def test_bad_feature_layers_say_what_is_allowed(spec):
    with pytest.raises(SystemExit, match=r"distinct layer indices in 0\.\.29, or 'auto' or 'final'"):
        eagle_data.feature_layers(spec, 30)


def _args(**kw):
    base = dict(draft_vocab=4096, intermediate=1536, epochs=3.5, batch=8, lr=1e-3, noise=0.1, unroll=2,
                unroll_weight=0.8, ce_weight=0.3, loss_on="answers", seed=0, layers=[], head_layers=1)
    return argparse.Namespace(**{**base, **kw})


def test_run_tags_follow_data_and_settings():
    train = [None] * 10
    tag = eagle_training.run_tag(_args(), train)
    assert tag == eagle_training.run_tag(_args(), train)  # resuming finds the same files
    others = {eagle_training.run_tag(_args(unroll=4), train), eagle_training.run_tag(_args(layers=[2, 14, 26]), train),
              eagle_training.run_tag(_args(lr=3e-3), train), eagle_training.run_tag(_args(), train[:9]),
              eagle_training.run_tag(_args(head_layers=2), train), eagle_training.run_tag(_args(context="target"), train)}
    assert tag not in others and len(others) == 6
    assert tag == eagle_training.run_tag(_args(context="head"), train)  # the default names no new run
    assert tag == eagle_training.run_tag(_args(precision="float32"), train)
    assert tag != eagle_training.run_tag(_args(precision="bfloat16"), train)  # other arithmetic, another run
    assert tag == eagle_training.run_tag(_args(generate_precision="float32"), train)
    assert tag != eagle_training.run_tag(_args(generate_precision="bfloat16"), train)  # other answers, another run
    # a head cut to a --train-minutes budget is never taken for the whole run, nor the whole for it
    assert tag == eagle_training.run_tag(_args(train_minutes=None), train)
    assert tag != eagle_training.run_tag(_args(train_minutes=2.5), train)
    assert eagle_training.run_tag(_args(train_minutes=2.5), train) == eagle_training.run_tag(_args(train_minutes=2.5), train)


def test_bfloat16_answers_are_kept_apart_from_float32s(tmp_path):
    """Answers generated in bfloat16 get their own shards and vocabulary (the same number of
    answers must not pick up float32's cached vocabulary), and float32's keep their old names."""
    import numpy as np

    f32, b16 = _args(generate_precision="float32"), _args(generate_precision="bfloat16")
    assert eagle_data.gen_dir(f32, tmp_path) == tmp_path / "eagle-gen"  # earlier work dirs still resume
    assert eagle_data.gen_dir(b16, tmp_path) == tmp_path / "eagle-gen-bfloat16"  # as --help names it
    vocabs = []
    for args, token in ((f32, 7), (b16, 9)):  # the same count of answers, other tokens
        args.draft_vocab, args.vocab_size, args.init_head = 1, 16, None
        train = [(np.array([1, token, token], np.int32), None, 1, None)] * 3
        vocabs.append(eagle_data.stage_vocab(args, tmp_path, train).tolist())
    assert vocabs == [[7], [9]]
    assert len(list(tmp_path.glob("vocab-*.npy"))) == 2


def test_another_answer_batch_has_its_own_shards_vocabulary_and_runs():
    """Batch n of 192 prompts holds other prompts than batch n of 48 (and other ones at T): its
    shards, vocabulary and runs are named apart. The held-out shard is one batch at any size."""
    prompts = {"held_out": [{"prompt": "h"}] * 3, "train": [{"prompt": "t"}] * 400}
    plans = {n: eagle_data.gen_batches(_args(gen_batch=n, temperature=0.7), prompts) for n in (48, 192)}
    assert [b[0] for b in plans[48][:3]] == ["held_out-000", "train-000", "train-001"]  # the names of old
    assert plans[192][0] == plans[48][0]
    assert not {b[0] for b in plans[48][1:]} & {b[0] for b in plans[192][1:]}
    assert sorted(i for b in plans[192][1:] for _, i in b[2]) == list(range(400))
    train = [None] * 400
    tags = {eagle_training.run_tag(_args(gen_batch=n, generate_precision=p), train)
            for n in (48, 192) for p in ("float32", "bfloat16")}
    assert len(tags) == 4
    assert eagle_data.data_tag(_args(gen_batch=192, generate_precision="bfloat16")) == "-gen-bfloat16-batch192"
    assert eagle_data.gen_dir(_args(gen_batch=192), Path("w")) == Path("w") / "eagle-gen"  # names differ


def test_continuing_a_head_is_its_own_run():
    train = [None] * 10
    a = eagle_training.run_tag(_args(init_head={"digest": "aaaaaaaaaa"}), train)
    b = eagle_training.run_tag(_args(init_head={"digest": "bbbbbbbbbb"}), train)
    assert len({a, b, eagle_training.run_tag(_args(), train)}) == 3
    assert a == eagle_training.run_tag(_args(init_head={"digest": "aaaaaaaaaa"}), train)  # and resumes


def test_a_continued_head_keeps_its_shape_and_vocabulary():
    import numpy as np

    layer = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256}
    init = {"layer": layer, "feature_layers": [1, 2], "num_layers": 2, "vocab": np.array([3, 5, 8], np.int32)}
    args = _args(init_head=init, intermediate=1536, draft_vocab=None, layers=[1, 2], head_layers=1)
    eagle_training.settle_draft_vocab(args)
    assert args.draft_vocab == 3  # no --draft-vocab: the head's own
    assert eagle_training.head_config(args, target_cfg=None) == {"feature_layers": [1, 2], "num_layers": 2, **layer}
    assert eagle_data.stage_vocab(args, work=None, train=None) is init["vocab"]  # no new vocabulary
    init = {**init, "feature_layers": [], "num_layers": 1, "context": "target"}  # a head that reads the target's keys
    assert eagle_training.head_config(_args(init_head=init), target_cfg=None) == {
        "feature_layers": [], "num_layers": 1, "context": "target", **layer}


def _answers(*seqs):
    """train rows as load_features gives them: (ids, features, prompt length, temperature)."""
    import numpy as np

    return [(np.array(ids, np.int32), None, p, 0.0) for p, ids in seqs]


def test_a_continued_heads_vocabulary_widens_by_the_datas_most_frequent_tokens(tmp_path):
    import numpy as np

    init = {"vocab": np.array([3, 9], np.int32), "digest": "aaaaaaaaaa"}
    # answers (after each prompt's 1 or 2 tokens): 7 x4, 9 x3, 5 x2, 3 x1, 6 x1; prompt tokens 1 and 2 never count
    train = _answers((1, [1, 7, 7, 9, 5, 6]), (2, [2, 1, 7, 7, 9, 9, 5, 3]))
    args = _args(init_head=init, draft_vocab=4, vocab_size=16)
    eagle_training.settle_draft_vocab(args)
    got = eagle_data.stage_vocab(args, work=tmp_path, train=train)
    assert got.tolist() == [3, 5, 7, 9]  # the head's 3 and 9 stay, the two most frequent others join
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vocab-4-n2-waaaaaaaaaa.npy"]  # cached by head and data
    fresh = _args(draft_vocab=None, vocab_size=16)
    eagle_training.settle_draft_vocab(fresh)
    assert fresh.draft_vocab == 16  # from scratch: the default, 4096, capped at the target's 16 tokens
    big = _args(draft_vocab=None, vocab_size=49152)
    eagle_training.settle_draft_vocab(big)
    assert big.draft_vocab == 4096
    fresh.draft_vocab = 2
    assert eagle_data.stage_vocab(fresh, work=tmp_path, train=train).tolist() == [7, 9]


@pytest.mark.parametrize("n,init,says", [(1, True, "can be widened .* not narrowed"),
                                         (0, False, "at least one token"),
                                         (17, False, "the target has 16 tokens; give at most 16"),
                                         (17, True, "the target has 16 tokens; give at most 16")])
def test_a_draft_vocabulary_that_cannot_be_says_why(n, init, says):
    import numpy as np

    args = _args(draft_vocab=n, init_head={"vocab": np.array([3, 9], np.int32)} if init else None, vocab_size=16)
    with pytest.raises(SystemExit, match=says):
        eagle_training.settle_draft_vocab(args)


@pytest.mark.parametrize("argv,says", [
    (["--context", "target", "--head-layers", "2"], "one decoder layer"),
    (["--context", "target", "--feature-layers", "auto"], "one decoder layer"),
])
def test_context_target_says_what_it_needs(argv, says, capsys):
    argv = ["--gguf", "t.gguf", *argv]
    with pytest.raises(SystemExit):
        train_eagle.parse_args(["--work", "w", *argv])
    assert says in capsys.readouterr().err


def test_bfloat16_steps_are_the_pytorch_trainers(capsys):
    with pytest.raises(SystemExit):
        train_eagle.parse_args(["--work", "w", "--target", "some/model", "--out", "o", "--precision", "bfloat16"])
    assert "only the PyTorch trainer (--gguf) autocasts" in capsys.readouterr().err
    assert train_eagle.parse_args(["--work", "w", "--gguf", "t.gguf", "--out", "o"]).precision == "float32"  # the default
    with pytest.raises(SystemExit):
        train_eagle.parse_args(["--work", "w", "--target", "m", "--out", "o", "--generate-precision", "bfloat16"])
    assert "--generate-precision bfloat16: only the PyTorch trainer" in capsys.readouterr().err
    assert train_eagle.parse_args(["--work", "w", "--gguf", "t.gguf", "--out", "o"]).generate_precision == "float32"


@pytest.mark.demo
def test_init_reads_the_shipped_head_for_the_demo_target(tmp_path):
    import numpy as np
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlxspec.drafters.eagle import load_head
    from mlxspec.loading import demo
    from mlxspec.loading.model import load_model
    from mlxspec.loading.resolve import BUILTIN_DIR

    if not demo.is_cached():
        pytest.skip("the demo GGUF is not cached (mlxspec pull demo)")
    gguf = demo.gguf_path()
    init = eagle_training.init_head("builtin:smollm2-eagle", gguf, tmp_path / "out")
    target, _, _ = load_model(str(gguf), download=False)
    head, ids, cfg = load_head(BUILTIN_DIR / "smollm2-eagle", target)
    assert init["layer"] == cfg["layer"] and init["feature_layers"] == [] and init["num_layers"] == 1
    assert np.array_equal(init["vocab"], np.array(ids))
    want = {k: np.array(v.astype(mx.float32)) for k, v in tree_flatten(head.parameters())}
    assert set(init["weights"]) == set(want)
    assert all(np.array_equal(init["weights"][k], want[k]) for k in want)
    # the lineage an export records names the reference, never a local folder's path
    about = json.loads((BUILTIN_DIR / "smollm2-eagle" / "config.json").read_text())["training"]
    assert init["lineage"] == {"head": "builtin:smollm2-eagle", "weights": init["digest"], "training": about}
    copy = shutil.copytree(BUILTIN_DIR / "smollm2-eagle", tmp_path / "my-head")
    assert eagle_training.init_head(str(copy), gguf, tmp_path / "out")["lineage"]["head"] == "my-head"
    with pytest.raises(SystemExit, match="--init and --out are the same folder"):
        eagle_training.init_head("builtin:smollm2-eagle", gguf, BUILTIN_DIR / "smollm2-eagle")


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS: MLX links Accelerate, no BLAS is loaded")
@pytest.mark.parametrize("script, flag, pytorch", [
    ("train_eagle.py", "--gguf", True), ("train_eagle.py", "--gguf=x.gguf", True), ("train_eagle.py", "--gg", True),
    ("train_eagle.py", "--target", False), ("train_draft.py", "--gguf", True)])
def test_the_pytorch_trainers_keep_mlxspec_s_blas_out_of_their_process(script, flag, pytorch):
    """`import mlxspec` puts the system OpenBLAS in the global symbol scope (mlxspec.blas), and
    torch loaded after it then runs its matmuls there (3.5x slower here: the --gguf path's
    first batch of answers took 116 s instead of 32). The trainers live in mlxspec.training, so
    scripts/train_eagle.py --gguf keeps MLX on its own BLAS (it runs MLX only to export); with
    --target, MLX trains and gets the faster one. scripts/train_draft.py is PyTorch's only."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    code = ("import runpy, sys\n"
            f"sys.argv = [{script!r}, {flag!r}, 'x.gguf', '--help']\n"
            f"try:\n    runpy.run_path('scripts/{script}', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "from mlxspec import blas\nprint(blas.info()['note'])")
    env = {k: v for k, v in os.environ.items() if k != "MLXSPEC_BLAS"}
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                         check=True).stdout
    assert (out.strip().splitlines()[-1] == "MLXSPEC_BLAS=off") == pytorch, out


def test_importing_the_trainer_loads_no_mlx():
    """--gguf's stages import torch before MLX (its export stage): the trainer's modules load
    neither MLX nor mlx-lm at import."""
    import subprocess

    code = ("import sys; from mlxspec.training import train_eagle; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'mlx', 'mlx_lm', 'torch'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_grown_last_batch_is_not_taken_for_the_shorter_one():
    """--prompts 3 then 6 (batches of 2): batch 1 held one prompt, then two; its shard must be made anew."""
    small = {"held_out": [{"prompt": "h"}], "train": [{"prompt": "t"}] * 3}
    grown = {"held_out": [{"prompt": "h"}], "train": [{"prompt": "t"}] * 6}
    names = {n: [b[0] for b in eagle_data.gen_batches(_args(gen_batch=2, temperature=0.7), p)]
             for n, p in (("small", small), ("grown", grown))}
    assert names["small"] == ["held_out-000", "train-000-b2", "train-001-b2-n1"]
    assert names["grown"] == ["held_out-000", "train-000-b2", "train-001-b2", "train-002-b2"]


def test_a_work_folder_keeps_to_one_target_and_one_way_of_answering(tmp_path):
    args = _args(max_new=16, temperature=0.7, seed=0, held_out=2)
    eagle_data.check_work(tmp_path, args, "a.gguf sha1:1")
    eagle_data.check_work(tmp_path, args, "a.gguf sha1:1")  # the same: resumes
    for target, change, says in (("b.gguf sha1:2", {}, "target 'a.gguf sha1:1' there, 'b.gguf sha1:2' now"),
                                 ("a.gguf sha1:1", {"max_new": 40}, "max_new 16 there, 40 now"),
                                 ("a.gguf sha1:1", {"seed": 1}, "seed 0 there, 1 now"),
                                 ("a.gguf sha1:1", {"held_out": 3}, "held_out 2 there, 3 now")):
        with pytest.raises(SystemExit, match=f"holds answers made otherwise .*{says}.*another --work"):
            eagle_data.check_work(tmp_path, _args(**{**vars(args), **change}), target)


def test_the_target_digest_tells_same_sized_files_apart(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"x" * 100)
    b.write_bytes(b"y" * 100)
    assert eagle_data.target_digest(a) != eagle_data.target_digest(b)


@pytest.mark.parametrize("flag,value", [("--batch", "0"), ("--ckpt-every", "0"), ("--unroll", "0"),
                                        ("--held-out", "0"), ("--max-new", "0"), ("--epochs", "0"),
                                        ("--lr", "-1"), ("--temperature", "-1"), ("--intermediate", "0"),
                                        ("--prompts", "-1"), ("--threads", "0"), ("--noise", "nan"),
                                        ("--train-minutes", "0")])
def test_numbers_that_cannot_work_are_refused_when_parsed(flag, value, capsys):
    with pytest.raises(SystemExit):
        train_eagle.parse_args(["--gguf", "x.gguf", "--work", "w", "--out", "o", flag, value])
    assert f"argument {flag}: '{value}': give a" in capsys.readouterr().err


def test_a_window_is_at_least_5_or_0_for_none(capsys):
    with pytest.raises(SystemExit):
        train_eagle.parse_args(["--gguf", "x.gguf", "--work", "w", "--out", "o", "--window", "3"])
    assert "--window 3: at least 5" in capsys.readouterr().err
    args = train_eagle.parse_args(["--gguf", "x.gguf", "--work", "w", "--out", "o", "--window", "0"])
    assert eagle_training.window_config(args) == {}  # the exported head attends to all its entries
    args = train_eagle.parse_args(["--gguf", "x.gguf", "--work", "w", "--out", "o"])
    assert eagle_training.window_config(args) == {"window": eagle_args.WINDOW}


def test_out_never_overwrites_a_file_or_a_folder_that_is_no_head(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    for out, says in ((tmp_path / "file", "is a file"), (model, "holds files but no EAGLE head")):
        with pytest.raises(SystemExit):
            train_eagle.parse_args(["--target", "demo", "--work", "w", "--out", str(out)])
        assert says in capsys.readouterr().err
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text('{"model_type": "eagle_head"}')
    for fine in (head, tmp_path / "new", eagle_args.SHIPPED):  # an earlier head, a new folder, the shipped one
        assert train_eagle.parse_args(["--target", "demo", "--work", "w", "--out", str(fine)]).out == str(fine)


def test_out_and_work_that_cannot_be_written_are_said_before_any_work(tmp_path, capsys):
    """A folder under a file (or a read-only one) is refused when parsed, not after hours of
    answers and training at export, with a traceback."""
    (tmp_path / "file").write_text("x")
    under = tmp_path / "file" / "head"
    for argv, says in ((["--work", "w", "--out", str(under)], f"--out {under}: {tmp_path / 'file'} is a file, so "
                        "no folder can be made under it"),
                       (["--work", str(under), "--out", str(tmp_path / "o")], f"--work {under}: {tmp_path / 'file'} "
                        "is a file")):
        for which in (["--gguf", "x.gguf"], ["--target", "demo"]):
            with pytest.raises(SystemExit):
                train_eagle.parse_args([*which, *argv])
            assert says in capsys.readouterr().err


def test_an_export_cut_short_does_not_block_the_next_one(tmp_path):
    """save_head stages its two files, then renames them: a run killed before (or between) the
    renames leaves only those, and the rerun may write there; a failed write leaves nothing."""
    from mlxspec.files import staged_path

    weights, config = (staged_path(name).name for name in ("model.safetensors", "config.json"))  # save_head's
    for left in ([weights], [weights, config], ["model.safetensors", config]):
        out = tmp_path / f"cut{len(left)}{left[0][0]}"
        out.mkdir()
        for name in left:
            (out / name).write_bytes(b"partial")
        assert eagle_args.unwritable_out(out) == ""
    alone = tmp_path / "weights-only"  # no staged config beside it: someone's model, maybe
    alone.mkdir()
    (alone / "model.safetensors").write_bytes(b"x")
    assert "holds files but no EAGLE head" in eagle_args.unwritable_out(alone)


def test_out_is_required_and_the_shipped_head_is_the_demo_target_s_only(tmp_path, capsys):
    for which in (["--gguf", "x.gguf"], ["--target", "demo"]):  # a trial run must not replace the shipped head
        with pytest.raises(SystemExit):
            train_eagle.parse_args([*which, "--work", "w"])
        assert "--out is required" in capsys.readouterr().err
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + bytes(100))
    digest = eagle_data.target_digest(other)
    with pytest.raises(SystemExit, match="only the demo target may replace"):
        train_eagle.check_out(argparse.Namespace(out=str(eagle_args.SHIPPED), gguf=str(other)), digest)
    train_eagle.check_out(argparse.Namespace(out="mine", gguf=str(other)), digest)  # any other folder
    from mlxspec.loading.demo import MODELS

    demo = next(iter(MODELS.values())).gguf_sha256
    train_eagle.check_out(argparse.Namespace(out=str(eagle_args.SHIPPED), gguf="demo.gguf"), demo)


@pytest.mark.parametrize("script,argv,says", [
    ("eval_eagle", ["--k", "0"], "argument --k: '0': give a whole number of at least 1"),
    ("eval_eagle", ["--prompts", "0"], "argument --prompts: '0'"),
    ("chain_ceiling", ["--prompts", "0"], "argument --prompts: '0'"),
    ("chain_ceiling", ["--step", "-1"], "argument --step: '-1': give a finite number of at least 0"),
])
def test_evaluation_scripts_refuse_numbers_that_cannot_work(script, argv, says):
    import subprocess

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "scripts" / f"{script}.py"), *argv], capture_output=True,
                          text=True, cwd=root, timeout=120)
    assert proc.returncode == 2 and says in proc.stderr


def test_without_torch_the_gguf_path_says_what_to_install_or_use_instead(tmp_path, monkeypatch):
    from mlxspec.training import train_draft

    monkeypatch.setitem(sys.modules, "torch", None)  # as where torch is not installed
    args = ["--gguf", str(tmp_path / "x.gguf"), "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit, match=r"PyTorch, which is not installed: pip install torch accelerate; .*--target"):
        train_eagle.main(args)
    # the draft model's trainer has no --target to offer
    with pytest.raises(SystemExit, match=r"not installed: pip install torch accelerate$"):
        train_draft.main(args)


def test_the_gguf_path_takes_llama_files_only(tmp_path, monkeypatch):
    """The PyTorch trainer starts the head from the target's last block by llama's names: another
    architecture is refused before anything runs, with --target named instead."""
    from mlxspec.training import train_common
    from tiny_gguf import write_tiny_gguf

    monkeypatch.setattr(train_common, "start", lambda args: (tmp_path / "w", 0.0))  # no torch needed up to the check
    gemma2 = tmp_path / "g.gguf"
    write_tiny_gguf(gemma2, arch="gemma2", pre="spm-no-prefix", layers=2, window=4, head_dim=24)
    with pytest.raises(SystemExit, match=rf"--gguf {gemma2}: a 'gemma2' GGUF; .*Give --target {gemma2} instead"):
        train_eagle.main(["--gguf", str(gemma2), "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")])
    llama = tmp_path / "l.gguf"
    write_tiny_gguf(llama)
    eagle_data.llama_gguf(llama)  # accepted
    with pytest.raises(SystemExit, match="is not a readable GGUF file"):
        eagle_data.llama_gguf(Path(__file__))


class _Clock:
    """A clock that moves only when the test moves it."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _steps(budget, clock, total, warm, pace, until=None, step=None):
    """Run `budget` over steps taking `pace` seconds each, from `step` (default its start) to
    `until` or the run's end; returns (the last step, the run's total)."""
    step = budget.start if step is None else step
    while step < total and (until is None or step < until):
        clock.now += pace
        step += 1
        total = budget.total(step, total, warm)
    return step, total


def test_a_time_budget_cuts_the_run_to_the_steps_that_fit(capsys):
    """1 minute at 0.1 s a step holds about 600 steps of a 2,000-step run: cut after the timed
    probe to 95 % of what the rest of the minute holds, refitted later at the same pace, the run
    ends by its schedule (not by running out) within the minute, having used at least 95 % of it."""
    clock = _Clock()
    budget = eagle_training.TimeBudget(1.0, 0, clock=clock)
    step, total = _steps(budget, clock, 2000, 66, 0.1)
    out = capsys.readouterr().out
    probe_end = sum(eagle_training.TimeBudget.PROBE)
    first = probe_end + 0.95 * (60 - 0.1 * probe_end) / 0.1
    assert f"{int(first) - 1} of the run's 2000 steps fit" in out or f"{int(first)} of the run's 2000" in out
    assert total == step and "ran out" not in out
    assert 0.95 * 60 <= clock.now - 1000.0 <= 60.0


def test_a_slower_pace_after_the_probe_is_refitted_before_the_budget_runs_out(capsys):
    """Probed at 0.1 s a step, the run then takes 0.12 s (held-out checks, a busier machine): the
    refit moves the schedule's end so that it still ends by it, inside the minute."""
    clock = _Clock()
    budget = eagle_training.TimeBudget(1.0, 0, clock=clock)
    step, total = _steps(budget, clock, 2000, 66, 0.1, until=sum(eagle_training.TimeBudget.PROBE))
    step, total = _steps(budget, clock, total, 66, 0.12, step=step)
    out = capsys.readouterr().out
    assert total == step and "ran out" not in out
    assert out.count("steps fit") >= 2
    assert clock.now - 1000.0 <= 60.0


def test_a_run_that_fits_its_budget_is_not_cut():
    clock = _Clock()
    budget = eagle_training.TimeBudget(10.0, 0, clock=clock)
    assert _steps(budget, clock, 2000, 66, 0.1) == (2000, 2000)


def test_a_run_that_slows_past_its_budget_ends_at_the_budget():
    """Cut at 0.1 s a step, the machine then slows to 1 s a step: the run ends once the minute is
    spent, not at its fitted total."""
    clock = _Clock()
    budget = eagle_training.TimeBudget(1.0, 0, clock=clock)
    step, total = _steps(budget, clock, 2000, 66, 0.1, until=100)
    fitted = total
    step, total = _steps(budget, clock, total, 66, 1.0, step=step)
    assert step == total < fitted
    assert 60.0 <= clock.now - 1000.0 < 61.0


def test_a_resumed_run_times_its_probe_from_where_it_resumed(capsys):
    """Resumed at step 500, the probe times steps 511-560: the first fit is 560 + 95 % of the
    54 s left at 0.1 s a step (and the run ends within its minute)."""
    clock = _Clock()
    budget = eagle_training.TimeBudget(1.0, 500, clock=clock)
    step, total = _steps(budget, clock, 2000, 66, 0.1)
    first = int(capsys.readouterr().out.split(" of the run's")[0].rsplit(" ", 1)[1])
    probe_end = sum(eagle_training.TimeBudget.PROBE)
    assert abs(first - (500 + probe_end + 0.95 * (60 - 0.1 * probe_end) / 0.1)) <= 1  # int() of a float's rounding
    assert total == step and clock.now - 1000.0 <= 60.0


def test_a_fitted_total_keeps_the_schedule_whole_and_the_budget_still_ends_it():
    """A budget shorter than the warm-up: the fitted total stays past the warm-up (the cosine's
    length is never zero), and the run still ends when the budget is spent."""
    clock = _Clock()
    budget = eagle_training.TimeBudget(0.01, 0, clock=clock)  # 0.6 s at 1 ms a step: 600 steps
    step, total = _steps(budget, clock, 2000, 1000, 0.001, until=sum(eagle_training.TimeBudget.PROBE) + 1)
    assert total == 1001
    step, total = _steps(budget, clock, total, 1000, 0.001, step=step)
    assert step == total and abs(step - 600) <= 1


def test_a_card_is_written_beside_the_head_but_never_over_one_written_by_hand(tmp_path):
    """The shipped head's card (and any a user wrote) stays; a card this wrote is brought up to date."""
    from mlxspec.training import eagle_card

    record = {"script": "scripts/train_eagle.py", "date": "2026-12-05", "mlxspec": "0.1.0", "seed": 0,
              "data": {"templated_prompts": 4, "held_out_prompts": 2, "prompt_files": {}, "max_new_tokens": 8,
                       "temperature": 0.0},
              "sequences": 4, "entries": 236, "epochs": 1.0, "batch": 2, "lr": 1e-3, "steps": 2, "train_minutes": 0.01}
    history = [{"step": 2, "held_loss": 6.5, "held_top1": [0.0625, 0.0625]}]
    card = eagle_card.write_card(tmp_path, record, "t.gguf", history)
    assert card.read_text().startswith("# An EAGLE head for t.gguf") and "| 2 | 6.5000 | 0.062 / 0.062 |" in card.read_text()
    assert "all greedy" in card.read_text() and "1 epoch, batch 2" in card.read_text()
    eagle_card.write_card(tmp_path, dict(record, steps=3), "t.gguf", history)
    assert "3 steps in" in card.read_text()  # its own card: rewritten
    card.write_text("---\nlicense: apache-2.0\n---\n# my head\n")
    assert eagle_card.write_card(tmp_path, record, "t.gguf", history) is None
    assert card.read_text().endswith("# my head\n")  # one written by hand: left alone
    shipped = eagle_args.SHIPPED / "README.md"
    assert not shipped.read_text().startswith(eagle_card.TITLE)  # so the shipped head's card is kept


def _ckpt(work, args, n=10, mlx=True):
    return work / f"head_ckpt-{eagle_training.run_tag(args, [None] * n)}{'-mlx' if mlx else ''}.safetensors"


def test_every_setting_that_names_a_run_is_a_flag_a_new_run_can_name():
    """Two runs apart by their tag are apart by a flag run_flags shows, so a new run can say which."""
    base = _args()
    for change in (dict(unroll=4), dict(layers=[2, 14, 26]), dict(lr=3e-3), dict(head_layers=2), dict(context="target"),
                   dict(precision="bfloat16"), dict(train_minutes=2.5), dict(draft_vocab=8192), dict(intermediate=3072),
                   dict(epochs=8), dict(batch=16), dict(noise=0.2), dict(unroll_weight=0.5), dict(ce_weight=1.0),
                   dict(loss_on="all"), dict(seed=1)):
        assert eagle_training.run_flags(_args(**change)) != eagle_training.run_flags(base), change


def test_a_new_run_names_the_unfinished_run_it_does_not_resume_and_the_flags_between(tmp_path, capsys):
    old, new = _args(epochs=8), _args(epochs=8, lr=5e-4, train_minutes=10)
    eagle_training.note_checkpoint(_ckpt(tmp_path, old), old, 400, 2000)
    eagle_training.say_other_runs(_ckpt(tmp_path, new), new)
    out = capsys.readouterr().out
    assert "not resuming the run in" in out and "stopped at step 400 of 2000" in out, out
    assert "(--lr 0.001 there, 0.0005 here; --train-minutes not given there, 10 here)" in out, out
    assert "the same command with that run's flags resumes it" in out


def test_finished_runs_other_answers_and_the_other_trainer_s_runs_are_not_named(tmp_path, capsys):
    old, new = _args(), _args(lr=5e-4)
    eagle_training.note_checkpoint(_ckpt(tmp_path, _args(seed=3)), _args(seed=3), 2000, 2000)  # finished
    eagle_training.note_checkpoint(_ckpt(tmp_path, old, n=11), old, 40, 2000)  # other answers
    eagle_training.note_checkpoint(_ckpt(tmp_path, old, mlx=False).with_suffix(".pt"), old, 40, 2000)  # PyTorch's
    (tmp_path / "head_ckpt-n10-0000beef-mlx.run.json").write_text("{not json")  # half-written: says nothing
    eagle_training.say_other_runs(_ckpt(tmp_path, new), new)
    eagle_training.note_checkpoint(_ckpt(tmp_path, new), new, 20, 2000)
    eagle_training.say_other_runs(_ckpt(tmp_path, new), new)  # its own note is not another run
    assert capsys.readouterr().out == ""


def test_a_head_trained_from_scratch_on_few_answers_is_called_a_trial(capsys):
    few = [(list(range(30)), None, 10, None)] * 3  # 20 answer tokens each
    eagle_training.say_data(few, few[:1], 4_200_000, _args())
    out = capsys.readouterr().out
    assert "head: 4.20M parameters; 3 sequences, 87 entries (60 answer tokens); held out 1" in out
    assert "only 60 answer tokens to learn from" in out and "take this run as a trial" in out
    eagle_training.say_data(few, few[:1], 4_200_000, _args(init_head={"folder": "h"}))  # adapting a head: no word
    many = [(list(range(1010)), None, 10, None)] * 100  # 100,000 answer tokens
    eagle_training.say_data(many, few[:1], 4_200_000, _args())
    assert "trial" not in capsys.readouterr().out

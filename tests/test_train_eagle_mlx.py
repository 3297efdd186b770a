"""scripts/train_eagle.py --target: every stage in MLX, for targets of several families (llama,
quantized llama, qwen2 with attention biases, gemma3, gpt-oss with its experts and sinks, and
gemma2, granite and cohere, whose logits are capped or scaled): it answers, keeps the target's features,
trains (the held-out loss falls), exports a head that loads and drafts losslessly, resumes from
its cached stages, and refuses bad input with a message that says what is allowed."""
import json
import re
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

import mlxspec
from mlxspec.loading.adapters import adapter_digest
import tiny

from mlxspec.training import eagle_args, eagle_mlx_data
from mlxspec.training import eagle_training
from mlxspec.training import train_common
from mlxspec.training import train_eagle
from mlxspec.training import train_eagle_mlx

PROMPTS = ["count to ten", "name three colours", "what is rain?", "say hello twice", "spell cat",
           "list two fruits", "why is the sky blue?", "add 2 and 3", "a word that rhymes with moon",
           "describe a cat", "what day follows monday?", "give me a number"]


def _save(folder: Path, model, quantize: bool = False) -> Path:
    from mlx_lm.utils import save_config, save_model

    config = {k: v for k, v in vars(model.args).items() if v is not None}
    if quantize:
        nn.quantize(model, group_size=32, bits=4)
        config["quantization"] = {"group_size": 32, "bits": 4}
    save_model(folder, model)
    save_config(config, folder / "config.json")
    tiny.make_tokenizer().save_pretrained(str(folder))
    return folder


def _prompt_file(path: Path) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


def _train(target, tmp_path, *extra, out="head"):
    argv = ["--target", str(target), "--work", str(tmp_path / "work"), "--out", str(tmp_path / out),
            "--prompts", "8", "--held-out", "4", "--prompt-file", str(_prompt_file(tmp_path / "p.jsonl")),
            "--max-new", "16", "--gen-batch", "6", "--epochs", "4", "--batch", "4", "--ckpt-every", "8",
            "--draft-vocab", "96", *extra]
    train_eagle.main(argv)
    return tmp_path / out


FAMILIES = {
    "llama": lambda: tiny.make_llama(4, tie_embeddings=False),
    "llama 4-bit": lambda: tiny.make_llama(5, tie_embeddings=False, hidden=64),
    "qwen2": lambda: tiny.make_qwen2(6),
    "gemma3": lambda: tiny.make_gemma3(7, sliding_window=6),
    # logits soft-capped, scaled: the head's laws are mapped as the target's (`backbone.logit_map`)
    "gemma2": lambda: tiny.make_gemma2(8, sliding_window=6),
    "granite": lambda: tiny.make_granite(9),
    "cohere": lambda: tiny.make_cohere(10),
    "gpt-oss": lambda: tiny.make_gpt_oss(11),  # experts, attention sinks, windowed layers
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_trains_a_head_that_loads_learns_and_drafts_losslessly(family, tmp_path, monkeypatch):
    from mlxspec.backbone import logit_map

    model = FAMILIES[family]()
    want_map = logit_map(model)  # the laws trained on are the target's: capped or scaled as it is
    target = _save(tmp_path / "target", model, quantize="4-bit" in family)
    maps = []
    loss = train_eagle_mlx.obj.loss
    monkeypatch.setattr(train_eagle_mlx.obj, "loss", lambda *a, **kw: maps.append(kw.get("post")) or loss(*a, **kw))
    head = _train(target, tmp_path)
    assert maps and set(maps) == {want_map} and (want_map is not None) == (family in ("gemma2", "granite", "cohere"))
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["model_type"] == "eagle_head" and cfg["draft_vocab_size"] <= 96
    assert cfg["training"]["script"] == "scripts/train_eagle.py --target"
    assert cfg["window"] == eagle_args.WINDOW  # the head attends to its latest entries (`--window`)
    (final,) = (tmp_path / "work").glob("head_final-*-mlx.json")
    history = json.loads(final.read_text())["history"]
    assert history[0]["step"] == 0 and history[-1]["held_loss"] < 0.9 * history[0]["held_loss"]
    training = cfg["training"]  # how it was made, in the folder itself
    assert training["data"] == {"templated_prompts": 8, "held_out_prompts": 4, "prompt_files": {"p.jsonl": len(PROMPTS)},
                                "max_new_tokens": 16, "temperature": 0.7}
    assert (training["epochs"], training["batch"], training["lr"]) == (4, 4, 1e-3) and "steps_planned" not in training
    card = (head / "README.md").read_text()  # the model card: data, time, figures
    assert card.startswith(f"# An EAGLE head for {target}") and f"8 templated prompts; `p.jsonl`: {len(PROMPTS)} prompts" in card
    assert f"{training['steps']:,} steps in {training['train_minutes']:g} minutes" in card
    for h in history:
        assert f"| {h['step']:,} | {h['held_loss']:.4f} |" in card
    spec = mlxspec.load(str(target), "none", drafter="eagle", head=str(head), num_draft=3)
    plain = mlxspec.load(str(target), "none")
    for prompt in ("tell me a story", "what is two plus two?"):
        want = plain.generate(prompt, max_tokens=24, temperature=0.0, speculative=False)
        got = spec.generate(prompt, max_tokens=24, temperature=0.0)
        assert got.tokens == want.tokens
        assert got.stats.drafted > got.stats.lookup_drafted  # the head itself drafted


def test_a_continued_head_widens_its_draft_vocabulary_and_stays_lossless(tmp_path):
    """--init HEAD --draft-vocab N (above the head's own): the head keeps every token it could
    propose, gains the data's most frequent others, and still drafts losslessly."""
    target = _save(tmp_path / "target", tiny.make_llama(15, tie_embeddings=False))
    narrow = _train(target, tmp_path, "--draft-vocab", "40", out="narrow")
    wide = _train(target, tmp_path, "--init", str(narrow), "--draft-vocab", "80", "--epochs", "1", out="wide")
    ids = {name: set(mx.load(str(h / "model.safetensors"))["draft_ids"].tolist()) for name, h in
           (("narrow", narrow), ("wide", wide))}
    assert len(ids["narrow"]) == 40 and len(ids["wide"]) == 80 and ids["narrow"] < ids["wide"]
    assert json.loads((wide / "config.json").read_text())["draft_vocab_size"] == 80
    spec = mlxspec.load(str(target), "none", drafter="eagle", head=str(wide), num_draft=3)
    plain = mlxspec.load(str(target), "none")
    want = plain.generate("tell me a story", max_tokens=24, temperature=0.0, speculative=False)
    got = spec.generate("tell me a story", max_tokens=24, temperature=0.0)
    assert got.tokens == want.tokens and got.stats.drafted > got.stats.lookup_drafted
    with pytest.raises(SystemExit, match="not narrowed"):
        _train(target, tmp_path, "--init", str(narrow), "--draft-vocab", "20", out="narrower")


@pytest.mark.parametrize("family", ["llama 4-bit", "qwen2", "gemma3", "gemma2", "granite"])
def test_a_head_that_reads_the_targets_context_trains_and_drafts_losslessly(family, tmp_path):
    """--context target: the data stage taps the last layer's input, training attends to the
    target's own keys (biases, key norms and sliding windows included), the exported head
    says so and drafts losslessly through the engine."""
    target = _save(tmp_path / "target", FAMILIES[family](), quantize="4-bit" in family)
    head = _train(target, tmp_path, "--context", "target")
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["context"] == "target" and cfg["num_layers"] == 1 and cfg["feature_layers"] == []
    assert "window" not in cfg  # it keeps no cache of its own to window
    (final,) = (tmp_path / "work").glob("head_final-*-mlx.json")
    history = json.loads(final.read_text())["history"]
    assert history[-1]["held_loss"] < 0.9 * history[0]["held_loss"]
    spec = mlxspec.load(str(target), "none", drafter="eagle", head=str(head), num_draft=3)
    assert spec.drafters["eagle"].reads_target
    plain = mlxspec.load(str(target), "none")
    for prompt in ("tell me a story", "what is two plus two?"):
        want = plain.generate(prompt, max_tokens=24, temperature=0.0, speculative=False)
        got = spec.generate(prompt, max_tokens=24, temperature=0.0)
        assert got.tokens == want.tokens
        assert got.stats.drafted > got.stats.lookup_drafted


def test_a_llama_head_starts_from_the_targets_last_layer_and_other_families_do_not(tmp_path):
    from mlx_lm.models.llama import ModelArgs

    from mlxspec.drafters.eagle import EagleHead

    def head_for(model):
        a = eagle_mlx_data.target_config(model)
        args = ModelArgs(model_type="llama", num_hidden_layers=1, vocab_size=a["vocab_size"],
                         **{k: a[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                              "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta")})
        head = EagleHead(args)
        train_eagle_mlx.init_from_target(head, model)
        return dict(tree_flatten(head.layers[0].parameters())), head

    for quantize in (False, True):
        model = tiny.make_llama(8, tie_embeddings=False)
        if quantize:
            nn.quantize(model, group_size=32, bits=4)
        mine, head = head_for(model)
        theirs = train_eagle_mlx.float_block(model.model.layers[-1])
        assert set(mine) == set(theirs)
        for k, v in mine.items():
            assert mx.array_equal(v, theirs[k]).item(), k
        assert mx.array_equal(head.norm.weight, model.model.norm.weight).item()
    q = tiny.make_qwen2(9)
    mine, _ = head_for(q)
    last = dict(tree_flatten(q.model.layers[-1].parameters()))
    assert mx.array_equal(mine["self_attn.q_proj.weight"], last["self_attn.q_proj.weight"]).item()
    assert "self_attn.q_proj.bias" in last and "self_attn.q_proj.bias" not in mine  # biases left out
    g = tiny.make_gemma3(10)
    mine, head = head_for(g)
    assert not mx.array_equal(mine["mlp.down_proj.weight"], g.model.layers[-1].mlp.down_proj.weight).item()


def test_a_rerun_reuses_the_answers_and_adds_feature_layers_to_them(tmp_path):
    target = _save(tmp_path / "target", tiny.make_llama(11, tie_embeddings=False, layers=3))
    _train(target, tmp_path, "--stop-after", "generate")
    (gen,) = (tmp_path / "work").glob("eagle-gen-mlx-*")
    shards = sorted(gen.glob("*.npz"))
    stamps = {p: p.stat().st_mtime_ns for p in shards}
    assert len(shards) == 1 + 2 + 2  # held out, 8 templated in 2 shards of 6, 12 from the file in 2
    z = np.load(shards[0])
    assert z["feats"].shape == (z["lens"].sum(), 64) and z["feats"].dtype == np.float16
    head = _train(target, tmp_path, "--feature-layers", "0,2")
    assert {p: p.stat().st_mtime_ns for p in shards} == stamps  # answers kept, not regenerated
    assert len(list(gen.glob("*-L0-2.npy"))) == len(shards)  # each got the layers' outputs
    assert json.loads((head / "config.json").read_text())["feature_layers"] == [0, 2]
    spec = mlxspec.load(str(target), "none", drafter="eagle", head=str(head))
    plain = mlxspec.load(str(target), "none")
    want = plain.generate("name a river", max_tokens=20, temperature=0.0, speculative=False)
    assert spec.generate("name a river", max_tokens=20, temperature=0.0).tokens == want.tokens


def test_features_are_the_engines_hidden_states(tmp_path):
    """The teacher-forced pass over a padded group gives each sequence the hidden states the
    backbone gives it alone (padding after a sequence does not reach it)."""
    from mlxspec.backbone import split_model

    model = tiny.make_llama(12, tie_embeddings=False)
    seqs = [[5, 9, 14, 3], [7, 7, 8, 20, 31, 2, 40], [11]]
    rows = eagle_mlx_data.features(model, seqs)
    backbone, _ = split_model(model)
    tol = 2 * np.finfo(np.float16).eps * 8  # stored as float16: relative rounding of values of a few units
    for s, (f, t) in zip(seqs, rows):
        alone = np.array(backbone(mx.array([s])).astype(mx.float32))[0]
        assert t is None and f.shape == (len(s), 64)
        assert np.abs(f.astype(np.float32) - alone).max() <= tol * max(1.0, np.abs(alone).max())


def test_answering_a_batch_reports_progress_while_it_runs(monkeypatch):
    """A batch of answers can take minutes on a CPU: it says how far it got every HEARTBEAT
    seconds (here after every step, so its last call counts every answer and every token)."""
    monkeypatch.setattr(train_common, "HEARTBEAT", 0.0)
    model, tok = tiny.make_llama(12, tie_embeddings=False), tiny.make_tokenizer()
    prompts = [eagle_mlx_data.prompt_ids(tok, p) for p in PROMPTS[:3]]
    calls = []
    answers = eagle_mlx_data.answer(model, tok, prompts, max_new=6, temperature=0.0, seed=0, batch=3,
                                    progress=lambda finished, tokens: calls.append((finished, tokens)))
    assert len(calls) >= 2 and calls[-1] == (3, sum(map(len, answers)))
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(calls, calls[1:]))  # counts only grow


def test_bad_input_says_what_is_allowed(tmp_path, capsys):
    with pytest.raises(SystemExit):
        train_eagle.parse_args(["--target", "x", "--work", str(tmp_path)])
    assert "--out is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_eagle.parse_args(["--work", str(tmp_path)])
    assert "one of the arguments --gguf --target is required" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"--target .*nowhere"):
        _train(tmp_path / "nowhere", tmp_path)
    target = _save(tmp_path / "target", tiny.make_llama(13, tie_embeddings=False))
    with pytest.raises(SystemExit, match=r"distinct layer indices in 0\.\.1"):
        _train(target, tmp_path, "--feature-layers", "5")


def test_a_stopped_training_resumes_to_the_same_head(tmp_path, monkeypatch):
    """Stopped after a checkpoint, a rerun continues from it (weights, optimizer state, epoch
    order, noise) and ends with the head an uninterrupted run makes."""
    target = _save(tmp_path / "target", tiny.make_llama(14, tie_embeddings=False))
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    whole = _train(target, tmp_path / "a", out="whole")
    resumed = _stopped_then_resumed(monkeypatch, target, tmp_path / "b", "held-out after step 16")
    _assert_same_weights(whole, resumed)


def _stopped_then_resumed(monkeypatch, target, folder, stop_at, *extra):
    """Train in `folder`, stopped (Ctrl-C) at the log line starting `stop_at`, then run again."""
    real_log = train_eagle_mlx.log

    def stop(msg):
        real_log(msg)
        if msg.startswith(stop_at):
            raise KeyboardInterrupt

    monkeypatch.setattr(train_eagle_mlx, "log", stop)
    with pytest.raises(KeyboardInterrupt):
        _train(target, folder, *extra, out="resumed")
    monkeypatch.setattr(train_eagle_mlx, "log", real_log)
    assert not list((folder / "work").glob("head_final-*"))
    return _train(target, folder, *extra, out="resumed")


def _assert_same_weights(x: Path, y: Path):
    a, b = mx.load(str(x / "model.safetensors")), mx.load(str(y / "model.safetensors"))
    assert set(a) == set(b)
    for k in a:
        assert mx.array_equal(a[k], b[k]).item(), k


class _TickingBudget(eagle_training.TimeBudget):
    """--train-minutes on a clock that moves one second each time it is read (once a step)."""

    PROBE = (2, 4)

    def __init__(self, minutes, step, clock=None):
        seconds = iter(range(10 ** 6))
        super().__init__(minutes, step, clock=lambda: float(next(seconds)))


def test_a_run_cut_by_its_time_budget_exports_and_resumes_to_the_same_cut(tmp_path, monkeypatch, capsys):
    """40 steps at a second each in a 15-second budget: timed over steps 3-6, the run is cut to
    the 14 that fit (6 + 95 % of the 9 s left), exports a head that says so, and a run stopped
    after its step-8 checkpoint (at the next one's log line) resumes to the same 14 steps and the
    same head."""
    monkeypatch.setattr(train_eagle_mlx, "TimeBudget", _TickingBudget)
    target = _save(tmp_path / "target", tiny.make_llama(15, tie_embeddings=False))
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    budget = ("--epochs", "8", "--train-minutes", "0.25", "--ckpt-every", "4")
    whole = _train(target, tmp_path / "a", *budget, out="whole")
    assert "14 of the run's 40 steps fit" in capsys.readouterr().out
    training = json.loads((whole / "config.json").read_text())["training"]
    assert training["steps"] == 14 and training["held_out"]["step"] == 14 and training["steps_planned"] == 40
    assert "14 steps (cut by --train-minutes from 40)" in (whole / "README.md").read_text()
    resumed = _stopped_then_resumed(monkeypatch, target, tmp_path / "b", "held-out after step 12", *budget)
    assert "resumed at step 8/14" in capsys.readouterr().out
    _assert_same_weights(whole, resumed)


def test_a_head_with_a_wider_mlp_starts_as_the_targets_last_layer():
    """--intermediate above the target's: the target's units first, the extra units silent (zero
    down-projection columns) but live (random gate and up rows, so gradients reach them)."""
    from mlx_lm.models.llama import ModelArgs

    from mlxspec.drafters.eagle import EagleHead

    model = tiny.make_llama(8, tie_embeddings=False)
    a = eagle_mlx_data.target_config(model)
    wide = 3 * a["intermediate_size"]
    args = ModelArgs(model_type="llama", num_hidden_layers=1, vocab_size=a["vocab_size"], intermediate_size=wide,
                     **{k: a[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                          "rms_norm_eps", "rope_theta")})
    head = EagleHead(args)
    head.set_dtype(mx.float32)
    train_eagle_mlx.init_from_target(head, model)
    mine = dict(tree_flatten(head.layers[0].parameters()))
    n = a["intermediate_size"]
    assert mine["mlp.gate_proj.weight"].shape[0] == wide
    assert mx.abs(mine["mlp.down_proj.weight"][:, n:]).max().item() == 0.0
    assert mx.abs(mine["mlp.gate_proj.weight"][n:]).max().item() > 0.0
    mx.random.seed(3)
    x = mx.random.normal((1, 5, a["hidden_size"]))
    theirs = model.model.layers[-1]
    # float32 on every backend; the two differ only by the zero terms' summation order
    diff = mx.abs(head.layers[0](x, mask="causal", cache=None) - theirs(x, mask="causal", cache=None)).max().item()
    assert diff < 1e-5, diff


def test_wider_mlp_accepts_only_a_widened_mlp():
    t = {"self_attn.q_proj.weight": np.zeros((8, 8)), "mlp.gate_proj.weight": np.zeros((12, 8)),
         "mlp.up_proj.weight": np.zeros((12, 8)), "mlp.down_proj.weight": np.zeros((8, 12))}
    wide = {**t, "mlp.gate_proj.weight": np.zeros((20, 8)), "mlp.up_proj.weight": np.zeros((20, 8)),
            "mlp.down_proj.weight": np.zeros((8, 20))}
    assert eagle_training.wider_mlp(t, wide) and eagle_training.wider_mlp(t, t)
    assert not eagle_training.wider_mlp(wide, t)  # narrower
    assert not eagle_training.wider_mlp(t, {**wide, "self_attn.q_proj.weight": np.zeros((16, 8))})
    assert not eagle_training.wider_mlp(t, {**wide, "mlp.bias": np.zeros(8)})
    w = eagle_training.widened(t | {"mlp.down_proj.weight": np.ones((8, 12))}, wide | {"mlp.down_proj.weight": np.ones((8, 20))})
    assert w["mlp.down_proj.weight"][:, :12].sum() == 96 and w["mlp.down_proj.weight"][:, 12:].sum() == 0


def test_a_damaged_work_file_is_named_with_what_to_do(tmp_path):
    """A run stopped while a work file was written (or a full disk) leaves it damaged: a rerun says
    which file and what to do, not a reader's traceback."""
    target = _save(tmp_path / "target", tiny.make_llama(15, tie_embeddings=False))
    _train(target, tmp_path)
    for pattern in ("vocab-*.npy", "*/train*.npz", "head_final-*.safetensors"):
        path = next((tmp_path / "work").glob(pattern))
        path.write_bytes(path.read_bytes()[:40])
        with pytest.raises(SystemExit, match=rf"cannot read .*{path.name} .*delete it and run the same command again"):
            _train(target, tmp_path)
        path.unlink()  # as the message says: the rerun makes it anew
        assert (_train(target, tmp_path) / "model.safetensors").exists()


def test_ctrl_c_is_one_line_and_exit_status_130(capsys):
    from mlxspec.training import train_common

    def stopped():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as e:
        train_common.run_main(stopped)
    assert e.value.code == 130 and "interrupted: the same command resumes" in capsys.readouterr().err


def test_mlxspec_s_own_errors_are_one_line_and_exit_status_1(tmp_path, capsys):
    """--init with a head for another target, or one that is not there: mlxspec's error, no traceback."""
    from mlxspec.training import train_common
    from mlxspec.training import train_eagle

    target = _save(tmp_path / "target", tiny.make_llama(14))
    argv = ["--target", str(target), "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"),
            "--init", str(tmp_path / "nowhere")]
    with pytest.raises(SystemExit) as e:
        train_common.run_main(lambda: train_eagle.main(argv))
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.startswith("error: ") and "nowhere" in err and "Traceback" not in err, err


def test_a_head_for_a_fine_tuned_target_learns_the_adapted_answers_and_drafts_losslessly(tmp_path, capsys):
    from test_adapters import write_adapter

    from mlxspec.loading.model import load_model

    target = _save(tmp_path / "target", tiny.make_llama(14, tie_embeddings=False))
    adapter = write_adapter(lambda: load_model(str(target))[0], tmp_path / "pirate", num_layers=2)
    head = _train(target, tmp_path, "--adapter-path", str(adapter))
    training = json.loads((head / "config.json").read_text())["training"]
    assert training["adapter"] == {"name": "pirate", "digest": adapter_digest(adapter)}
    base = load_model(str(target))[0]
    (shards,) = (tmp_path / "work").glob("eagle-gen-mlx-*")  # the adapted target's answers, apart from the base's
    digest = adapter_digest(adapter)
    assert shards == eagle_mlx_data.gen_dir(tmp_path / "work", base, digest) != eagle_mlx_data.gen_dir(
        tmp_path / "work", base)
    spec = mlxspec.load(str(target), "none", drafter="eagle", head=str(head), num_draft=3, adapter_path=str(adapter))
    plain = mlxspec.load(str(target), "none", adapter_path=str(adapter))
    unadapted = mlxspec.load(str(target), "none")
    assert spec.head_note is None  # the exported config names the adapter it was trained under
    assert mlxspec.load(str(target), "none", drafter="eagle", head=str(head)).head_note == \
        "trained under adapter pirate, which this target lacks"
    differs = 0
    for prompt in ("tell me a story", "what is two plus two?"):
        want = plain.generate(prompt, max_tokens=24, speculative=False)
        got = spec.generate(prompt, max_tokens=24)
        assert got.tokens == want.tokens and got.stats.drafted > got.stats.lookup_drafted
        differs += want.tokens != unadapted.generate(prompt, max_tokens=24, speculative=False).tokens
    assert differs  # the adapter changed what the target says
    # the same work folder, without the adapter: the same name, another model (named as given, and by fingerprint)
    with pytest.raises(SystemExit, match=rf"holds answers made otherwise \(target '{re.escape(str(target))}' there, "
                                         rf"'{re.escape(str(target))}' now \(another model: eagle-gen-mlx-\w+ vs "
                                         rf"eagle-gen-mlx-\w+\)"):
        _train(target, tmp_path, out="base-head")
    (tmp_path / "other").mkdir()
    with pytest.raises(SystemExit, match=r"--adapter-path .*nowhere: the adapter folder .* does not exist"):
        _train(target, tmp_path / "other", "--adapter-path", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit):
        train_eagle.parse_args(["--gguf", "x.gguf", "--work", str(tmp_path), "--adapter-path", str(adapter)])
    assert "--adapter-path needs --target" in capsys.readouterr().err

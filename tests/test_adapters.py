"""A fine-tuned adapter (mlx_lm.lora's folder) on the target: the output is the adapted target's,
exactly as mlx-lm runs it, whoever drafts; and adapters that are not one, or not for this target, are
refused by name before anything is generated."""

from __future__ import annotations

import json
import sys
import types
from unittest.mock import ANY

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.tuner.utils import linear_to_lora_layers, load_adapters

import tiny
from test_engine_trees import flat_curve
from mlxspec import Engine
from mlxspec.cli import main
from mlxspec.errors import IncompatibleModelsError, InvalidArgumentError, MlxSpecError, ModelNotFoundError
from mlxspec.loading.adapters import apply_adapter

EOS = 2  # the tiny tokenizer's <|im_end|>
PROMPTS = [[5, 9, 14, 200, 31], [7] * 3 + [60, 61, 62, 63, 7, 7, 7, 60], list(range(40, 90, 3))]


def base():
    return tiny.make_llama(0, tie_embeddings=False)  # its text depends on what it reads


def write_adapter(make, folder, *, kind="lora", num_layers=2, rank=4, seed=1):
    """An adapter folder as mlx_lm.lora writes one, for the model `make()` builds, its tensors
    random (a trained adapter's lora_b is not the zeros it starts from)."""
    model = make()
    model.freeze()
    config = {"fine_tune_type": kind, "num_layers": num_layers, "model": "tiny"}
    if kind == "full":
        for layer in model.layers[-num_layers:]:
            layer.unfreeze()
    else:
        config["lora_parameters"] = {"rank": rank, "scale": 2.0, "dropout": 0.0}
        linear_to_lora_layers(model, num_layers, config["lora_parameters"], use_dora=kind == "dora")
    keys = mx.random.split(mx.random.key(seed), len(tree_flatten(model.trainable_parameters())))
    weights = {}
    for i, (name, w) in enumerate(tree_flatten(model.trainable_parameters())):
        noise = mx.random.normal(w.shape, key=keys[i])
        weights[name] = w + 0.3 * noise * (1.0 if name.endswith("lora_b") else mx.abs(w).mean())
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "adapters.safetensors"), weights)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def mlx_lm_greedy(model, ids, n):
    out = [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=n)]
    return out[: out.index(EOS) + 1] if EOS in out else out


@pytest.mark.parametrize("kind", ["lora", "dora", "full"])
def test_the_adapted_target_decodes_as_mlx_lm_runs_it_whoever_drafts(tmp_path, kind):
    folder = write_adapter(base, tmp_path / kind, kind=kind)
    target = base()
    said = apply_adapter(target, folder)
    reference = load_adapters(base(), str(folder))  # mlx-lm's own path, on another copy
    said_as = {"lora": "LoRA rank 4 on 2 layers", "dora": "DoRA rank 4 on 2 layers", "full": "full fine-tune"}
    assert said == said_as[kind]
    head = tiny.make_eagle_head(base(), tmp_path / "head", copy=True, noise=0.05)  # trained for the base
    engine = Engine(target, tiny.make_tokenizer(), draft_model=base(), eagle_head=head)
    trees = flat_curve(Engine(target, tiny.make_tokenizer(), draft_model=base(), eagle_head=head))  # trees pay
    plain = base()
    differs = drafted = tree_rounds = 0
    for ids in PROMPTS:
        want = mlx_lm_greedy(reference, ids, 24)
        differs += want != mlx_lm_greedy(plain, ids, 24)
        for drafter in ("model", "eagle", "ngram", "none"):
            chains = engine.generate(ids, max_tokens=24, drafter=drafter, num_draft=4)
            assert chains.tokens == want, f"{kind}, drafter {drafter}, chains, prompt {ids}"
            drafted += chains.stats.drafted
            if drafter != "none":
                tree = trees.generate(ids, max_tokens=24, drafter=drafter)
                assert tree.tokens == want, f"{kind}, drafter {drafter}, trees, prompt {ids}"
                tree_rounds += tree.stats.tree_rounds
    assert differs and drafted and tree_rounds  # the adapter changed the text; chains and trees were checked against it


def test_a_sampled_answer_of_the_adapted_target_is_the_one_plain_decoding_samples(tmp_path):
    folder = write_adapter(base, tmp_path / "lora")
    target = base()
    apply_adapter(target, folder)
    engine = Engine(target, tiny.make_tokenizer(), draft_model=base())
    alone = Engine(target, tiny.make_tokenizer(), drafter="none")
    for seed in range(4):
        got = engine.generate(PROMPTS[1], max_tokens=32, temperature=0.8, seed=seed, num_draft=3)
        want = alone.generate(PROMPTS[1], max_tokens=32, temperature=0.8, seed=seed)
        assert got.tokens == want.tokens and got.stats.drafted > 0


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    from tiny_gguf import write_tiny_gguf

    path = tmp_path_factory.mktemp("adapter") / "tiny.gguf"
    write_tiny_gguf(path, tied=False)
    return path


def test_load_applies_it_to_the_target_and_says_so(tiny_gguf, tmp_path):
    from mlxspec import load
    from mlxspec.loading.model import load_model

    folder = write_adapter(lambda: load_model(str(tiny_gguf))[0], tmp_path / "a", num_layers=1, rank=2)
    engine = load(str(tiny_gguf), drafter="ngram", adapter_path=str(folder))
    assert engine.target_info.adapter == str(folder)
    assert engine.target_info.adapter_kind == "LoRA rank 2 on 1 layers"
    reference = load_adapters(load_model(str(tiny_gguf))[0], str(folder))
    plain = load_model(str(tiny_gguf))[0]
    ids = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
    want = mlx_lm_greedy(reference, ids, 20)
    assert engine.generate(ids, max_tokens=20).tokens == want != mlx_lm_greedy(plain, ids, 20)
    from mlxspec.bench.report import pair_info

    assert pair_info(engine, ["ngram"])["adapter"] == {"path": str(folder), "kind": "LoRA rank 2 on 1 layers"}
    plain_engine = load(str(tiny_gguf), drafter="ngram")
    assert pair_info(plain_engine, ["ngram"])["adapter"] is None  # the bench's JSON says which
    from mlxspec.serve.fingerprint import system_fingerprint
    from tui.info import describe

    # A seeded answer's text depends on the adapter: so does the server's system_fingerprint.
    assert system_fingerprint(engine) != system_fingerprint(plain_engine)
    assert describe(engine).target == f"{tiny_gguf} + adapter a"  # the chat's header, and what /save records
    assert describe(plain_engine).target == str(tiny_gguf)


def test_an_adapter_on_a_target_kept_quantized_wraps_its_quantized_layers(tiny_gguf, tmp_path):
    import mlx.nn as nn
    from mlx_lm.tuner.lora import LoRALinear

    from mlxspec import load
    from mlxspec.bench.neartie import check_greedy
    from mlxspec.loading.model import load_model

    quantized = lambda: load_model(str(tiny_gguf), dtype="quantized")[0]  # noqa: E731
    folder = write_adapter(quantized, tmp_path / "q", num_layers=2)
    engine = load(str(tiny_gguf), drafter="ngram", dtype="quantized", adapter_path=str(folder))
    wrapped = [m for _, m in engine.target_model.named_modules() if isinstance(m, LoRALinear)]
    quantized_rows = sum(isinstance(m.linear, nn.QuantizedLinear) for m in wrapped)
    assert len(wrapped) == 14 and quantized_rows == 10  # (the file's F16 matrices stay float)
    reference, plain = load_adapters(quantized(), str(folder)), quantized()
    ids = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
    want, got = mlx_lm_greedy(reference, ids, 24), engine.generate(ids, max_tokens=24, num_draft=3)
    assert want != mlx_lm_greedy(plain, ids, 24) and got.stats.drafted > 0
    if got.tokens != want:  # float16 activations: only rounding at a near-tie may part them
        assert check_greedy(reference, ids, want, got.tokens).ok, (want, got.tokens)


@pytest.mark.parametrize("layout,error,words", [
    ("missing", ModelNotFoundError, "does not exist"),
    ("a file", ModelNotFoundError, "is a file"),
    ("no weights", ModelNotFoundError, "has no adapters.safetensors: an mlx_lm.lora adapter folder holds"),
    ("empty", ModelNotFoundError, "has no adapter_config.json and no adapters.safetensors"),
    ("not JSON", MlxSpecError, "adapter_config.json is not readable JSON"),
    ("a list", MlxSpecError, "must hold a JSON object"),
    ("another kind", MlxSpecError, "fine_tune_type must be one of lora, dora, full, got 'qlora'"),
    ("no layers", MlxSpecError, "needs num_layers (an integer, -1 for all) and lora_parameters"),
    ("another model", IncompatibleModelsError, "was not trained for this target: "),
    ("fewer layers", IncompatibleModelsError, "lacks 14 of the 28 tensors its adapter_config.json puts on this target"),
])
def test_what_is_not_an_adapter_for_this_target_is_refused_by_name(tmp_path, layout, error, words):
    folder = tmp_path / "adapter"
    if layout == "a file":
        folder.write_text("x")
    elif layout != "missing":
        write_adapter(base, folder)
    config = folder / "adapter_config.json"
    if layout == "no weights":
        (folder / "adapters.safetensors").unlink()
    elif layout == "empty":
        for f in folder.iterdir():
            f.unlink()
    elif layout == "not JSON":
        config.write_text("{num_layers: 2")
    elif layout == "a list":
        config.write_text("[]")
    elif layout == "another kind":
        config.write_text(json.dumps({**json.loads(config.read_text()), "fine_tune_type": "qlora"}))
    elif layout == "no layers":
        config.write_text(json.dumps({"fine_tune_type": "lora", "lora_parameters": {"rank": 4, "scale": 2.0}}))
    elif layout == "another model":
        write_adapter(lambda: tiny.make_llama(0, hidden=32, tie_embeddings=False), folder)
    elif layout == "fewer layers":  # trained on 1 layer, the config says 2: half the layers would stay base
        write_adapter(base, folder, num_layers=1)
        config.write_text(json.dumps({**json.loads(config.read_text()), "num_layers": 2}))
    with pytest.raises(error) as got:
        apply_adapter(base(), folder)
    assert words in str(got.value) and str(folder) in str(got.value)
    if layout == "another model":
        assert "model.layers.1.self_attn.q_proj.lora_a: adapter shape (32, 4) does not match" in str(got.value)


def test_a_blank_adapter_path_is_refused_as_an_argument():
    with pytest.raises(InvalidArgumentError, match="adapter_path must be a folder written by mlx_lm.lora, got ' '"):
        apply_adapter(base(), " ")


def test_load_checks_the_folder_before_loading_any_model(tiny_gguf, tmp_path, monkeypatch):
    from mlxspec import load

    def no_load(*a, **k):
        raise AssertionError("a model was loaded before the adapter folder was checked")

    monkeypatch.setattr("mlxspec.loading.api.load_model", no_load)
    with pytest.raises(ModelNotFoundError, match="the adapter folder .* does not exist"):
        load(str(tiny_gguf), drafter="ngram", adapter_path=str(tmp_path / "nowhere"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "adapters.safetensors").write_bytes(b"")
    (tmp_path / "bad" / "adapter_config.json").write_text('{"fine_tune_type": "qlora"}')
    with pytest.raises(MlxSpecError, match="fine_tune_type must be one of"):
        load(str(tiny_gguf), drafter="ngram", adapter_path=str(tmp_path / "bad"))


def test_a_target_sharded_over_ranks_refuses_an_unfused_adapter_and_says_to_fuse_it(tiny_gguf, tmp_path, monkeypatch,
                                                                                   capsys):
    from mlxspec import load

    folder = write_adapter(base, tmp_path / "a")
    monkeypatch.setattr("mlxspec.distributed.init_group", lambda: types.SimpleNamespace(size=lambda: 2))
    with pytest.raises(InvalidArgumentError, match=rf"^\[load\] adapter_path='{folder}' cannot be applied unfused to a "
                       r"target sharded over 2 ranks; fold it into the weights before they are sharded "
                       r"\(fuse_adapter=True\)"):
        load(str(tiny_gguf), drafter="ngram", adapter_path=str(folder), distributed=True)
    # at the command line, in its flag's words
    assert main(["generate", "--target", str(tiny_gguf), "--drafter", "ngram", "--adapter-path", str(folder),
                 "--distributed", "abc"]) == 1
    assert (f"error: --adapter-path {folder} cannot be applied unfused to a target sharded over 2 ranks; fold it "
            f"into the weights before they are sharded (--fuse-adapter)") in capsys.readouterr().err


def test_generate_takes_adapter_path_and_names_the_adapter(tiny_gguf, tmp_path, capsys):
    from mlxspec.loading.model import load_model

    folder = write_adapter(lambda: load_model(str(tiny_gguf))[0], tmp_path / "a", num_layers=1, rank=2)
    assert main(["generate", "--target", str(tiny_gguf), "--drafter", "ngram", "--adapter-path", str(folder),
                 "--max-tokens", "4", "--no-chat-template", "--json", "abc"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["target"]["adapter"] == str(folder) and result["target"]["adapter_kind"] == "LoRA rank 2 on 1 layers"
    assert main(["generate", "--target", str(tiny_gguf), "--drafter", "ngram", "--adapter-path", str(folder),
                 "--max-tokens", "4", "--no-chat-template", "abc"]) == 0
    assert f"+ adapter {folder} (LoRA rank 2 on 1 layers);" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "bench", "calibrate"])
def test_every_command_that_loads_a_target_takes_adapter_path(command, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["mlxspec"])
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert "--adapter-path PATH" in out and "--fuse-adapter" in out


def test_an_own_pair_may_name_an_adapter_beside_its_file(tiny_gguf, tmp_path, monkeypatch, capsys):
    from mlxspec import load
    from mlxspec.loading.model import load_model

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    folder = write_adapter(lambda: load_model(str(tiny_gguf))[0], tmp_path / "pirate", num_layers=1, rank=2)
    (tmp_path / "models.toml").write_text(f'[[pair]]\nname = "mine"\ntarget = "{tiny_gguf}"\nadapter = "./pirate"\n')
    engine = load("mine")
    assert engine.target_info.adapter == str(folder) and engine.target_info.adapter_kind == "LoRA rank 2 on 1 layers"
    assert load("mine", adapter_path=str(write_adapter(lambda: load_model(str(tiny_gguf))[0], tmp_path / "other",
                                                       num_layers=2))).target_info.adapter_kind == \
        "LoRA rank 4 on 2 layers"  # one given here replaces the pair's
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["models"]) == 0
    block = capsys.readouterr().out.split("\n\n")[-1].splitlines()
    assert block[1:3] == [f"  target   {tiny_gguf}", f"  adapter  {folder}"]
    assert main(["models", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["adapter"] == str(folder)
    monkeypatch.setenv("COLUMNS", "1000")
    assert main(["models"]) == 0
    assert f"{tiny_gguf} + adapter {folder}" in capsys.readouterr().out.splitlines()[-1]
    (tmp_path / "models.toml").write_text(f'[[pair]]\nname = "mine"\ntarget = "{tiny_gguf}"\nadapter = "./pirate"\n'
                                          f'fuse_adapter = true\n')
    assert load("mine").target_info.adapter_kind == "LoRA rank 2 on 1 layers, fused"
    assert main(["models"]) == 0
    assert f"+ adapter {folder} (fused at load)" in capsys.readouterr().out.splitlines()[-1]
    assert main(["models", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["fuse_adapter"] is True
    (tmp_path / "models.toml").write_text(f'[[pair]]\nname = "mine"\ntarget = "{tiny_gguf}"\nfuse_adapter = "yes"\n')
    with pytest.raises(MlxSpecError, match="field 'fuse_adapter' must be bool, got 'yes'"):
        load("mine")


def test_a_request_naming_an_adapter_is_told_the_server_applies_its_own():
    from mlxspec.serve.errors import APIError
    from mlxspec.serve.schema import parse_chat

    with pytest.raises(APIError) as got:  # mlx-lm's server takes one per request; here it is the server's
        parse_chat({"messages": [{"role": "user", "content": "hi"}], "adapters": "my-lora"})
    assert "applied when the server starts (mlxspec serve --adapter-path)" in got.value.message
    assert got.value.status == 400 and got.value.param == "adapters" and got.value.code == "unsupported_parameter"
    parse_chat({"messages": [{"role": "user", "content": "hi"}], "adapters": None})  # null: as if left out


def test_a_head_trained_under_another_adapter_than_the_targets_is_named(tiny_gguf, tmp_path):
    # The head still drafts losslessly, but less often right: the load line, the bench's note and
    # its JSON say so, so a slow head is not a mystery.
    from mlxspec import load
    from mlxspec.bench.report import pair_info
    from mlxspec.commands.generate import load_line
    from mlxspec.loading.adapters import adapter_digest
    from mlxspec.loading.model import load_model
    from tui.info import describe

    def make():
        return load_model(str(tiny_gguf))[0]

    pirate = write_adapter(make, tmp_path / "pirate", num_layers=1, rank=2)
    tutor = write_adapter(make, tmp_path / "tutor", num_layers=1, rank=2, seed=2)
    retrained = write_adapter(make, tmp_path / "v2" / "pirate", num_layers=1, rank=2, seed=3)  # same name
    base_head = tiny.make_eagle_head(make(), tmp_path / "base-head")
    pirate_head = tiny.make_eagle_head(make(), tmp_path / "pirate-head")
    cfg = json.loads((pirate_head / "config.json").read_text())
    cfg.setdefault("training", {})["adapter"] = {"name": "pirate", "digest": adapter_digest(pirate)}
    (pirate_head / "config.json").write_text(json.dumps(cfg))
    odd_head = tiny.make_eagle_head(make(), tmp_path / "odd-head")  # a hand-edited config: no adapter it can read
    cfg["training"] = "by hand"
    (odd_head / "config.json").write_text(json.dumps(cfg))
    odder_head = tiny.make_eagle_head(make(), tmp_path / "odder-head")
    cfg["training"] = {"adapter": "pirate"}  # not the {name, digest} the trainer writes
    (odder_head / "config.json").write_text(json.dumps(cfg))
    cases = [(odd_head, pirate, "trained for the target without adapter pirate"), (odd_head, None, None),
             (odder_head, pirate, "trained for the target without adapter pirate"), (odder_head, None, None),
             (base_head, None, None),
             (base_head, pirate, "trained for the target without adapter pirate"),
             (pirate_head, pirate, None),
             (pirate_head, None, "trained under adapter pirate, which this target lacks"),
             (pirate_head, tutor, "trained under adapter pirate, not this tutor"),
             (pirate_head, retrained, "trained under another adapter named pirate (its weights or config differ)")]
    for head, adapter, note in cases:
        engine = load(str(tiny_gguf), "none", drafter="eagle", head=str(head),
                      adapter_path=None if adapter is None else str(adapter))
        assert engine.head_note == note, (head.name, adapter)
        assert (f"head {head} ({note})" if note else f"head {head};") in load_line(engine)
        assert pair_info(engine, ["eagle"])["head"] == str(head)
        assert pair_info(engine, ["eagle"])["head_note"] == note
        assert describe(engine).draft == (f"EAGLE head ({note})" if note else "EAGLE head")  # the chat's header
    assert load(str(tiny_gguf), drafter="ngram", adapter_path=str(pirate)).head_note is None  # no head, no note


def test_the_bench_says_when_its_head_was_trained_under_another_adapter(tiny_gguf, tmp_path, capsys):
    from mlxspec.loading.model import load_model

    pirate = write_adapter(lambda: load_model(str(tiny_gguf))[0], tmp_path / "pirate", num_layers=1, rank=2)
    head = tiny.make_eagle_head(load_model(str(tiny_gguf))[0], tmp_path / "base-head")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hello there"}) + "\n")
    common = ["bench", "--target", str(tiny_gguf), "--head", str(head), "--prompts", str(prompts), "--max-tokens",
              "4", "--no-peer", "--num-draft", "2"]
    assert main([*common, "--drafter", "eagle", "--adapter-path", str(pirate)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert f"the head {head} was trained for the target without adapter pirate, so it may draft less" in err
    assert main([*common, "--drafter", "eagle"]) == 0  # the target it was trained for
    assert "may draft less" not in capsys.readouterr().err
    for adapter, note in ((pirate, "trained for the target without adapter pirate"), (None, None)):
        assert main(["generate", "--target", str(tiny_gguf), "--head", str(head), "--drafter", "eagle", "--max-tokens",
                     "2", "--json", "abc", *(["--adapter-path", str(adapter)] if adapter else [])]) == 0
        assert json.loads(capsys.readouterr().out)["head"] == {"ref": str(head), "weights_bytes": ANY, "note": note}


def test_a_fused_adapter_is_the_adapted_target_in_plain_layers_and_decodes_losslessly(tmp_path):
    from mlx_lm.tuner.dora import DoRALinear
    from mlx_lm.tuner.lora import LoRALinear

    from mlxspec.loading.adapters import fuse_adapter

    for kind in ("lora", "dora"):
        folder = write_adapter(base, tmp_path / kind, kind=kind)
        unfused, fused = base(), base()
        apply_adapter(unfused, folder)
        apply_adapter(fused, folder)
        assert fuse_adapter(fused) == "fused"
        assert not [m for _, m in fused.named_modules() if isinstance(m, (LoRALinear, DoRALinear))]
        assert sorted(n for n, _ in tree_flatten(fused.parameters())) == sorted(
            n for n, _ in tree_flatten(base().parameters()))  # the base's layers and names, nothing added
        ids = mx.array(PROMPTS[2])[None]
        a, b = unfused(ids), fused(ids)
        assert mx.allclose(a, b, atol=tiny.float32_tol() * 10 * mx.abs(a).max().item()).item(), kind
        head = tiny.make_eagle_head(base(), tmp_path / f"head-{kind}", copy=True, noise=0.05)
        engine = Engine(fused, tiny.make_tokenizer(), draft_model=base(), eagle_head=head)
        for ids in PROMPTS:
            want = mlx_lm_greedy(fused, ids, 24)
            for drafter in ("model", "eagle", "ngram"):
                assert engine.generate(ids, max_tokens=24, drafter=drafter, num_draft=4).tokens == want, (kind, drafter)
    full = write_adapter(base, tmp_path / "full", kind="full")
    target = base()
    apply_adapter(target, full)
    assert fuse_adapter(target) == ""  # a full fine-tune's weights are the target's: nothing to fold


def test_load_fuses_on_request_and_says_so_quantized_layers_quantized_again(tiny_gguf, tmp_path, capsys):
    import mlx.nn as nn

    from mlxspec import load
    from mlxspec.loading.model import load_model
    from mlxspec.serve.fingerprint import system_fingerprint

    quantized = lambda: load_model(str(tiny_gguf), dtype="quantized")[0]  # noqa: E731
    folder = write_adapter(quantized, tmp_path / "q", num_layers=2)
    engine = load(str(tiny_gguf), drafter="ngram", dtype="quantized", adapter_path=str(folder), fuse_adapter=True)
    assert engine.target_info.adapter_kind == "LoRA rank 4 on 2 layers, fused and re-quantized"
    layers = [m for _, m in engine.target_model.named_modules() if isinstance(m, (nn.Linear, nn.QuantizedLinear))]
    assert sum(isinstance(m, nn.QuantizedLinear) for m in layers) == len(
        [m for _, m in quantized().named_modules() if isinstance(m, nn.QuantizedLinear)])  # as many as before
    ids = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
    want = mlx_lm_greedy(engine.target_model, ids, 24)
    assert engine.generate(ids, max_tokens=24, num_draft=3).tokens == want  # lossless against the fused target
    unfused = load(str(tiny_gguf), drafter="ngram", dtype="quantized", adapter_path=str(folder))
    assert system_fingerprint(engine) != system_fingerprint(unfused)  # its text may round otherwise
    with pytest.raises(InvalidArgumentError, match=r"fuse_adapter=True, but there is no adapter to fuse"):
        load(str(tiny_gguf), drafter="ngram", fuse_adapter=True)
    assert main(["generate", "--target", str(tiny_gguf), "--drafter", "ngram", "--fuse-adapter", "abc"]) == 1
    assert "error: --fuse-adapter, but there is no adapter to fuse: give --adapter-path <folder>" in \
        capsys.readouterr().err
    assert main(["generate", "--target", str(tiny_gguf), "--drafter", "ngram", "--adapter-path", str(folder),
                 "--fuse-adapter", "--max-tokens", "4", "--no-chat-template", "abc"]) == 0
    assert f"+ adapter {folder} (LoRA rank 4 on 2 layers, fused);" in capsys.readouterr().err

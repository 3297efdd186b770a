"""Model resolution order, every error it raises, the pair registry, and precision."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import mlx.core as mx
import mlx.nn as nn

from mlxspec.errors import InvalidArgumentError, MlxSpecError, ModelNotFoundError
from mlxspec.loading import demo, load_model
from mlxspec.loading.precision import apply_dtype, resolve_dtype
from mlxspec.loading.registry import PACKAGED, load_pairs, pairs
from mlxspec.loading.resolve import resolve_model, resolve_pair

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "mlxspec-home"))
    return tmp_path


@pytest.fixture(scope="module")
def mlx_folder(tmp_path_factory):
    """A tiny llama saved in mlx-lm's layout (config.json + model.safetensors + tokenizer files)."""
    from mlx_lm.utils import save_config, save_model

    from tiny import make_llama, make_tokenizer

    folder = tmp_path_factory.mktemp("mlx") / "tiny-llama"
    model = make_llama(seed=1)
    save_model(folder, model)
    config = {k: v for k, v in vars(model.args).items() if v is not None}
    save_config(config, folder / "config.json")
    make_tokenizer().save_pretrained(str(folder))
    return folder, model


# --- registry ---------------------------------------------------------------------------

def test_root_models_toml_is_the_packaged_copy():
    assert (ROOT / "models.toml").read_text() == PACKAGED.read_text()


def test_registry_has_the_curated_pairs():
    p = pairs()
    assert p["demo"].target.startswith(demo.PREFIX) and p["demo"].draft == "builtin:smollm2-draft"
    # the demo's default drafter: whichever the bench measured faster, the head on a CPU and on CUDA
    # (Metal, unmeasured, follows CUDA)
    assert (p["demo"].drafter_on("cpu"), p["demo"].drafter_on("metal"), p["demo"].drafter_on("cuda")) == (
        "eagle", "eagle", "eagle")
    assert p["qwen2.5-7b"].drafter_on("cpu") == ""  # none named: the draft model
    for name in ("qwen2.5-7b", "qwen2.5-32b", "qwen2.5-coder-7b", "qwen2.5-coder-32b", "llama3.1-8b", "llama3.3-70b"):
        assert p[name].target.startswith("mlx-community/") and p[name].draft.startswith("mlx-community/")
        assert p[name].quantization and p[name].target_gb > p[name].draft_gb > 0
    assert any(n.startswith("gemma3") and p[n].draft == "mlx-community/gemma-3-1b-it-4bit" for n in p)


def test_registry_errors_name_the_entry(tmp_path):
    bad = tmp_path / "models.toml"
    bad.write_text('[[pair]]\nname = "x"\ntarget = "a/b"\n')
    with pytest.raises(MlxSpecError, match=r"'x'.*missing fields \['context', 'draft'"):
        load_pairs(bad)
    good = "\n[[pair]]\n" + PACKAGED.read_text().split("\n[[pair]]\n")[1]
    bad.write_text(good + good)
    with pytest.raises(MlxSpecError, match="appears twice"):
        load_pairs(bad)
    bad.write_text(good.replace("context = 8192", 'context = "long"'))
    with pytest.raises(MlxSpecError, match="'context' must be int"):
        load_pairs(bad)
    for table in ('{ tpu = "ngram" }', '{ cpu = 3 }'):
        bad.write_text(re.sub(r"\ndrafter = .*\n", f"\ndrafter = {table}\n", good))
        with pytest.raises(MlxSpecError, match=r"'drafter' must be a string or a table of strings keyed by "
                                               r"backend \(metal, cuda, cpu\)"):
            load_pairs(bad)
    bad.write_bytes(b'[[pair]]\nname = "caf\xe9"\n')  # Latin-1, as an editor may save it
    with pytest.raises(MlxSpecError, match=r"models.toml: it is not UTF-8 text \(byte 20"):
        load_pairs(bad)


def test_registry_refuses_what_would_fail_late(tmp_path):
    bad = tmp_path / "models.toml"
    good = "\n[[pair]]\n" + PACKAGED.read_text().split("\n[[pair]]\n")[1]  # the demo: drafter per backend, a head
    cases = [
        (re.sub(r"\ndrafter = .*\n", '\ndrafter = "eagel"\n', good), "names 'eagel'; allowed: model, eagle, ngram"),
        (re.sub(r"\ndrafter = .*\n", '\ndrafter = { cpu = "eagel" }\n', good), "names 'eagel'"),
        (re.sub(r"\nhead = .*\n", "\n", good), "drafter 'eagle' needs a head"),
        (re.sub(r"\ndrafter = .*\n", '\ndrafter = "model"\n', re.sub(r"\ndraft = .*\n", '\ndraft = "ngram"\n', good)),
         "drafter 'model' needs a draft model"),
        ('[pair]\nname = "x"\n', "must be written as \\[\\[pair\\]\\] tables"),
        ('pair = ["a"]\n', "must be written as \\[\\[pair\\]\\] tables"),
        (good.replace("[[pair]]", "[[pairs]]"), r"unknown top-level keys \['pairs'\]"),
    ]
    for text, says in cases:
        bad.write_text(text)
        with pytest.raises(MlxSpecError, match=says):
            load_pairs(bad)


def test_a_users_own_pairs_join_the_packaged_ones(empty_cache):
    from mlxspec.paths import user_pairs_path

    mine = user_pairs_path()
    mine.parent.mkdir(parents=True)
    demo_entry = "\n[[pair]]\n" + PACKAGED.read_text().split("\n[[pair]]\n")[1]
    mine.write_text(demo_entry.replace('name = "demo"', 'name = "my-pair"'))
    assert pairs()["my-pair"].target == pairs()["demo"].target and "qwen2.5-7b" in pairs()
    mine.write_text(demo_entry.replace('draft = "builtin:smollm2-draft"', 'draft = "ngram"')
                    .replace("drafter = {", 'drafter = "ngram"\n# {'))
    assert resolve_pair("demo").draft == "ngram"  # the user's pair replaces the packaged one of that name
    mine.write_text("[[pair]]\nname = 3\n")
    with pytest.raises(MlxSpecError, match=str(mine)):
        pairs()
    # A relative path in it means a file beside it, wherever the command runs.
    (mine.parent / "t.gguf").write_bytes(b"")
    mine.write_text(demo_entry.replace('name = "demo"', 'name = "local"').replace('target = "demo:smollm2-135m"',
                                                                               'target = "t.gguf"'))
    assert pairs()["local"].target == str((mine.parent / "t.gguf").resolve())
    mine.write_text(demo_entry.replace('name = "demo"', 'name = " "'))
    with pytest.raises(MlxSpecError, match="the name is blank"):
        pairs()
    # There only a name and a target are needed; a curated file (load_pairs' default) needs every field.
    mine.write_text('[[pair]]\nname = "bare"\ntarget = "demo:smollm2-135m"\n\n[[pair]]\nname = "headed"\n'
                    'target = "demo:smollm2-135m"\nhead = "builtin:smollm2-eagle"\ndrafter = "eagle"\n')
    bare, headed = pairs()["bare"], pairs()["headed"]
    assert (bare.draft, bare.context, bare.target_gb, bare.note, bare.default_drafter("cpu")) == ("ngram", 0, 0, "",
                                                                                                 "ngram")
    assert headed.draft == "ngram" and headed.default_drafter("metal") == "eagle"
    with pytest.raises(MlxSpecError, match=r"missing fields \['context', 'draft'"):
        load_pairs(mine)


def test_a_broken_own_models_toml_stops_only_what_could_be_a_pair(empty_cache, mlx_folder):
    from mlxspec.paths import user_pairs_path

    mine = user_pairs_path()
    mine.parent.mkdir(parents=True)
    mine.write_text("[[pair]\nname = ")  # not TOML
    with pytest.warns(UserWarning, match=rf"cannot read the pair registry {re.escape(str(mine))}.*without it"):
        folder = mlx_folder[0]
        assert resolve_model(str(folder)).path == folder  # a folder given is a folder, whatever the file says
    with pytest.warns(UserWarning, match="cannot read the pair registry"):
        assert resolve_pair("builtin:smollm2-eagle") is None
    for ref in ("demo", "owner/name", "nosuch"):  # could be one of its pairs: the broken file is the answer
        with pytest.raises(MlxSpecError, match="cannot read the pair registry"):
            resolve_model(ref)
    mine.write_text('[[pair]]\nname = "x"\n')
    with pytest.raises(MlxSpecError, match=r"missing fields \['target'\]; allowed"):  # no empty list of unknowns
        pairs()


def test_models_says_a_pair_whose_head_is_missing_is_not_cached(empty_cache, monkeypatch, capsys):
    import json as _json

    from mlxspec.cli import main
    from mlxspec.commands import models

    monkeypatch.setattr(models, "is_cached", lambda ref: not ref.startswith("builtin:nosuch"))
    from mlxspec.paths import user_pairs_path

    mine = user_pairs_path()
    mine.parent.mkdir(parents=True)
    demo_entry = "\n[[pair]]\n" + PACKAGED.read_text().split("\n[[pair]]\n")[1]
    mine.write_text(re.sub(r"\nhead = .*\n", '\nhead = "builtin:nosuch"\n', demo_entry.replace('"demo"', '"mine"')))
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in map(_json.loads, capsys.readouterr().out.splitlines())}
    assert rows["mine"]["cached"] is False and rows["demo"]["cached"] is True


def test_models_fills_an_own_pairs_size_and_context_from_its_files(empty_cache, mlx_folder, capsys):
    """An own pair may leave sizes and context out; `mlxspec models` reads them from its cached
    files (a GGUF split in parts counts every part) rather than printing "?"."""
    import json as _json

    from tiny_gguf import write_tiny_gguf

    from mlxspec.cli import main
    from mlxspec.paths import user_pairs_path

    whole, split = empty_cache / "tiny.gguf", empty_cache / "parts" / "tiny.gguf"
    write_tiny_gguf(whole)
    split.parent.mkdir()
    write_tiny_gguf(split, split=4)
    first = sorted(split.parent.glob("*.gguf"))
    assert len(first) > 1
    mine = user_pairs_path()
    mine.parent.mkdir(parents=True)
    folder = mlx_folder[0]
    mine.write_text(f'[[pair]]\nname = "gguf"\ntarget = "{whole}"\n\n[[pair]]\nname = "split"\ntarget = "{first[0]}"\n'
                    f'\n[[pair]]\nname = "folder"\ntarget = "{folder}"\ndraft = "{whole}"\n'
                    f'\n[[pair]]\nname = "said"\ntarget = "{whole}"\ntarget_gb = 5.0\ncontext = 100\n'
                    f'\n[[pair]]\nname = "gone"\ntarget = "{empty_cache / "gone.gguf"}"\n')
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in map(_json.loads, capsys.readouterr().out.splitlines())}
    gb = lambda *paths: float(f"{sum(p.stat().st_size for p in paths) / 1e9:.3g}")
    assert (rows["gguf"]["target_gb"], rows["gguf"]["draft_gb"], rows["gguf"]["context"]) == (gb(whole), 0.0, 256)
    assert 0 < gb(whole) < gb(whole, whole) < 1e-3
    assert (rows["split"]["target_gb"], rows["split"]["context"]) == (gb(*first), 256)
    assert (rows["folder"]["target_gb"], rows["folder"]["draft_gb"], rows["folder"]["context"]) == \
        (gb(*folder.glob("*.safetensors")), gb(whole), mlx_folder[1].args.max_position_embeddings)
    assert (rows["said"]["target_gb"], rows["said"]["context"]) == (5.0, 100)  # written in models.toml: kept
    assert (rows["gone"]["target_gb"], rows["gone"]["context"], rows["gone"]["cached"]) == (0.0, 0, False)


# --- resolution order -------------------------------------------------------------------

def test_pair_name_comes_first():
    assert resolve_pair("qwen2.5-7b").draft == "mlx-community/Qwen2.5-0.5B-Instruct-4bit"
    assert resolve_pair("mlx-community/Qwen2.5-7B-Instruct-4bit") is None


def test_pair_name_as_a_model_reference_gives_its_target(empty_cache):
    with pytest.raises(ModelNotFoundError, match="mlxspec pull demo"):
        resolve_model("demo", download=False)


def test_local_folder_loads_through_resolution(mlx_folder):
    folder, original = mlx_folder
    res = resolve_model(str(folder))
    assert (res.format, res.source, res.path) == ("mlx", "local", folder)
    model, tok, info = load_model(str(folder), dtype="float32")
    ids = mx.array([[5, 17, 42, 99]])
    np.testing.assert_allclose(np.array(model(ids)), np.array(original(ids)), rtol=1e-5, atol=1e-5)
    assert tok.decode(tok.encode("héllo 🤖", add_special_tokens=False)) == "héllo 🤖"
    assert info.vocab_size == original.args.vocab_size and info.weights_bytes > 0


def test_gguf_file_resolves(tmp_path):
    from tiny_gguf import write_tiny_gguf

    path = tmp_path / "m.gguf"
    write_tiny_gguf(path)
    assert resolve_model(str(path)).format == "gguf"
    upper = tmp_path / "M.GGUF"  # as some downloads are named
    path.rename(upper)
    assert load_model(str(upper))[2].format == "gguf"


@pytest.mark.parametrize("typo,close,draft", [("dem", "'demo'", False), ("Demo", "'demo'", False),
                                              ("qwen2.5-7", "'qwen2.5-7b'", False), ("ngramm", "'ngram'", True)])
def test_a_name_close_to_a_pair_s_is_suggested(typo, close, draft):
    with pytest.raises(ModelNotFoundError, match=f"did you mean {close}"):
        resolve_model(typo, draft=draft)


def test_a_repo_id_shaped_path_whose_folder_exists_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "models").mkdir()
    with pytest.raises(ModelNotFoundError, match="nor is there a folder models/tiny here, though models exists"):
        resolve_model("models/tiny")


# --- errors -------------------------------------------------------------------------------

def test_missing_folder_or_file(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelNotFoundError, match="not a pair name"):
        resolve_model(str(tmp_path / "no" / "such" / "dir"))
    with pytest.raises(ModelNotFoundError, match="mlxspec models"):
        resolve_model("no-such-pair")


def test_folder_without_config_or_weights(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelNotFoundError, match=r"no \*\.safetensors"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelNotFoundError, match="not valid JSON"):
        resolve_model(str(tmp_path))


def test_a_folder_missing_shards_of_its_index_is_not_a_model(mlx_folder, tmp_path):
    import shutil

    folder = tmp_path / "sharded"
    shutil.copytree(mlx_folder[0], folder)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelNotFoundError, match="lacks 1 of the 2 weight files .*model-00002-of-00002.*interrupted"):
        resolve_model(str(folder))
    (folder / "model.safetensors.index.json").write_text("[]")
    with pytest.raises(ModelNotFoundError, match="not a valid weights index"):
        resolve_model(str(folder))
    index["weight_map"]["b"] = "model-00001-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert resolve_model(str(folder)).path == folder


def test_a_file_that_is_not_a_model(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelNotFoundError, match="neither a model folder"):
        resolve_model(str(f))


def test_truncated_safetensors_names_the_folder(mlx_folder, tmp_path):
    import shutil

    folder = tmp_path / "cut"
    shutil.copytree(mlx_folder[0], folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(MlxSpecError, match=str(folder)):
        load_model(str(folder))


def test_offline_and_not_cached_says_what_to_run(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = "mlx-community/no-such-model-for-mlxspec-tests"
    with pytest.raises(ModelNotFoundError, match=rf"not in the Hugging Face cache and HF_HUB_OFFLINE.*mlxspec pull {repo}"):
        resolve_model(repo)


def test_a_pairs_model_not_cached_says_to_pull_the_pair(empty_cache, mlx_folder, monkeypatch):
    """`mlxspec pull PAIR` fetches all of a pair's models: the message for one of them missing says
    that, not a repo id its user never typed; a model given beside the pair keeps its own."""
    from mlxspec import load
    from mlxspec.loading.resolve import NotCachedError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = "mlx-community/no-such-model-for-mlxspec-tests"
    home = empty_cache / "mlxspec-home"
    home.mkdir()
    folder = mlx_folder[0]
    pull_mine = r"HF_HUB_OFFLINE is set\. With network access run `mlxspec pull mine`"
    for role, entry in (("target", f'target = "{repo}"'), ("draft", f'target = "{folder}"\ndraft = "{repo}"'),
                        ("head", f'target = "{folder}"\nhead = "{repo}"')):
        (home / "models.toml").write_text(f'[[pair]]\nname = "mine"\n{entry}\n')
        with pytest.raises(NotCachedError, match=rf"'{repo}', the {role} of the pair 'mine', .*{pull_mine}"):
            load("mine")
    (home / "models.toml").write_text(f'[[pair]]\nname = "mine"\ntarget = "{repo}"\n')
    with pytest.raises(NotCachedError, match=rf"the target of the pair 'mine', .*{pull_mine}"):
        resolve_model("mine")
    (home / "models.toml").write_text(f'[[pair]]\nname = "mine"\ntarget = "{folder}"\n')
    with pytest.raises(NotCachedError, match=rf"^model '{repo}' is not in .*`mlxspec pull {repo}`"):
        load("mine", draft=repo)
    with pytest.raises(NotCachedError, match=rf"^model '{repo}' is not in .*`mlxspec pull {repo}`"):
        load("mine", head=repo)  # not cached is not "no such head"


# --- precision ----------------------------------------------------------------------------

def test_dtype_choices():
    assert resolve_dtype(None) in ("quantized", "bfloat16", "float32") and resolve_dtype("auto") == resolve_dtype(None)
    with pytest.raises(InvalidArgumentError, match=r"dtype must be one of .*got 'int8'"):
        resolve_dtype("int8")


def test_dequantize_replaces_quantized_layers():
    from tiny import float32_tol, make_llama

    model = make_llama(seed=2)
    nn.quantize(model, group_size=32, bits=4)
    ids = mx.array([[3, 14, 15, 92]])
    before = np.array(model(ids))
    assert apply_dtype(model, "float32") == "float32"
    assert not any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in model.named_modules())
    tol = float32_tol(1e-3)
    np.testing.assert_allclose(np.array(model(ids)), before, rtol=tol, atol=tol)
    apply_dtype(model, "bfloat16")
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == mx.bfloat16


def test_a_mixtures_quantized_experts_are_dequantized_and_counted():
    # mlx-lm's experts (QuantizedSwitchLinear) are quantized layers too: dequantized with the rest,
    # and counted at their float size when the precision is chosen
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3_moe
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

    from mlxspec.loading import precision
    from tiny import float32_tol

    args = qwen3_moe.ModelArgs(
        model_type="qwen3_moe", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
        num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[], moe_intermediate_size=64,
        rms_norm_eps=1e-6, vocab_size=300, num_key_value_heads=2, head_dim=16, rope_theta=10000.0,
        tie_word_embeddings=True, max_position_embeddings=512, norm_topk_prob=True)
    mx.random.seed(3)
    model = qwen3_moe.Model(args)
    float_bytes = sum(v.size * 4 for _, v in tree_flatten(model.parameters()))
    nn.quantize(model, group_size=32, bits=4)
    assert any(isinstance(m, QuantizedSwitchLinear) for _, m in model.named_modules())
    assert precision.dequantized_bytes(model, 4) == float_bytes
    ids = mx.array([[3, 14, 15, 92]])
    before = np.array(model(ids))
    assert apply_dtype(model, "float32") == "float32"
    assert not any(isinstance(m, precision.quantized_layers()) for _, m in model.named_modules())
    assert isinstance(model.model.layers[0].mlp.switch_mlp.up_proj, SwitchLinear)
    tol = float32_tol(1e-3)
    np.testing.assert_allclose(np.array(model(ids)), before, rtol=tol, atol=tol)


def test_auto_precision_per_backend_and_memory(monkeypatch):
    from mlxspec.loading import precision
    from tiny import make_llama

    from mlx.utils import tree_flatten

    float_bytes = sum(v.size * 4 for _, v in tree_flatten(make_llama(seed=4).parameters()))
    model = make_llama(seed=4)
    nn.quantize(model, group_size=32, bits=4)
    assert precision.dequantized_bytes(model, 4) == float_bytes
    monkeypatch.setattr(precision, "backend", lambda: "metal")
    assert precision.auto_dtype(model) == "quantized"
    monkeypatch.setattr(precision, "backend", lambda: "cpu")
    monkeypatch.setattr(precision.blas, "fast", lambda: False)  # MLX's reference BLAS
    assert precision.auto_dtype(model) == "bfloat16"
    monkeypatch.setattr(precision.blas, "fast", lambda: True)  # an optimised BLAS was loaded
    assert precision.auto_dtype(model) == "float32"
    monkeypatch.setattr(precision, "physical_memory", lambda: 3 * float_bytes)  # float32 > 1/4, bfloat16 fits
    assert precision.auto_dtype(model) == "bfloat16"
    monkeypatch.setattr(precision, "physical_memory", lambda: 1000)  # too big to dequantize
    assert precision.auto_dtype(model) == "quantized"


def test_builtin_reference_errors_name_what_ships():
    from mlxspec.loading.resolve import resolve_model

    with pytest.raises(ModelNotFoundError, match="no model 'nope' ships with mlxspec"):
        resolve_model("builtin:nope")


def test_builtin_references_name_folders_of_the_package_only():
    from mlxspec.loading.resolve import BUILTIN_DIR, builtin_folder, resolve_model

    assert builtin_folder("builtin:smollm2-eagle") == BUILTIN_DIR / "smollm2-eagle"
    assert (BUILTIN_DIR / "smollm2-eagle" / "config.json").is_file()  # the package's own data folder
    assert resolve_model("builtin:smollm2-draft").path == builtin_folder("builtin:smollm2-draft")
    assert builtin_folder("smollm2-eagle") is None and builtin_folder("demo") is None
    for escape in ("builtin:../data/smollm2-draft", "builtin:", "builtin:smollm2-draft/"):
        with pytest.raises(ModelNotFoundError, match="ships with mlxspec; shipped: .*smollm2-draft"):
            resolve_model(escape)

"""Gemma 1 and CodeGemma (`mlxspec.models.gemma`): the tanh GELU of Gemma's reference, its GGUF
files against the NumPy reference, and mlx-lm-format folders built as it."""

from __future__ import annotations

import math

import numpy as np
import pytest

import mlx.core as mx

from tiny import float32_tol
from mlxspec.loading import load_model
from mlxspec.models import gemma

from gguf_reference import check_logits
from tiny_gguf import write_tiny_gguf


def _args(**kw):
    return gemma.ModelArgs(model_type="gemma", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                           num_attention_heads=2, head_dim=16, rms_norm_eps=1e-6, vocab_size=300,
                           num_key_value_heads=1, **kw)


@pytest.mark.parametrize("activation, exact", [(None, False), ("gelu_pytorch_tanh", False), ("gelu", True)])
def test_the_mlp_gates_with_the_configs_gelu(activation, exact):
    # HF reads a config that names no hidden_activation (the released ones) as tanh GELU, as
    # Gemma's reference and llama.cpp run it; mlx-lm's own gemma uses the exact one
    erf = np.vectorize(math.erf)

    mlp = gemma.Model(_args(hidden_activation=activation)).model.layers[0].mlp
    x = mx.random.normal((3, 32), key=mx.random.key(0)) * 3
    g, u = np.array(mlp.gate_proj(x), np.float64), np.array(mlp.up_proj(x), np.float64)
    tanh = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))
    want = (0.5 * g * (1 + erf(g / np.sqrt(2))) if exact else tanh) * u @ np.array(mlp.down_proj.weight, np.float64).T
    got = np.array(mlp(x))
    tol = 64 * np.finfo(np.float32).eps * np.abs(want).max()  # one float32 layer's roundings, with room
    assert np.abs(got - want).max() <= tol
    apart = (0.5 * g * (1 + erf(g / np.sqrt(2))) - tanh) * u @ np.array(mlp.down_proj.weight, np.float64).T
    assert np.abs(apart).max() > 10 * tol  # the two GELUs are told apart


@pytest.mark.parametrize("dtype, tol", [("float32", None), ("quantized", 2e-3)])
def test_gemma_gguf_logits_match_numpy_reference(tmp_path, dtype, tol):
    # llama's names with the norms stored as 1 + w, GELU, a scaled input, a tied output, a head
    # dim other than hidden / heads (against llama.cpp on a float32 file like this: 2.4e-5 of the
    # largest logit, the reference alike)
    tol = tol or float32_tol()
    path = tmp_path / "gemma.gguf"
    sp = write_tiny_gguf(path, arch="gemma", pre="spm-no-prefix", head_dim=24, seed=12)
    model, tok, info = load_model(path, dtype=dtype)
    assert type(model).__module__ == "mlxspec.models.gemma" and info.context_length == 256
    text = "def hello(name): 12345 and more words"
    ids = tok.encode(text)
    assert ids == [sp.bos_id()] + sp.encode(text)
    check_logits(model, path, ids, tol)


def test_an_mlx_folder_of_gemma_is_built_as_ours(tmp_path):
    from mlx_lm.utils import save_config, save_model

    import tiny

    args = _args(max_position_embeddings=512)
    save_model(tmp_path, gemma.Model(args))
    save_config({k: v for k, v in vars(args).items() if v is not None}, tmp_path / "config.json")
    tiny.make_tokenizer().save_pretrained(str(tmp_path))
    loaded, _, info = load_model(tmp_path)
    assert type(loaded).__module__ == "mlxspec.models.gemma" and info.context_length == 512
    assert loaded.model.layers[0].mlp._gelu is gemma.nn.gelu_approx

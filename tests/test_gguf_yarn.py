"""YaRN files (Qwen2.5's and Qwen3's 128k GGUFs, gpt-oss): the file's factor and original context
reach mlx-lm's YaRN RoPE, against the NumPy reference of llama.cpp's `rope_yarn`; the models
whose mlx-lm code would run YaRN unscaled, and YaRN knobs mlx-lm lacks, are refused."""

from __future__ import annotations

import numpy as np
import pytest

import mlx.core as mx

from tiny import float32_tol
from mlxspec.errors import IncompatibleModelsError
from mlxspec.loading import gguf_arch, load_model

from gguf_reference import check_logits, reference_logits
from tiny_gguf import YARN_FACTOR, YARN_ORIGINAL, write_tiny_gguf

TEXT = "def hello(name): 12345 and more words, the quick brown fox"
F32 = {k: "F32" for k in ("token_embd", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                          "ffn_down")}


@pytest.mark.parametrize("arch, head_dim", [("llama", None), ("qwen2", None), ("qwen3", 24), ("olmo2", None),
                                            ("granite", None)])
def test_a_yarn_file_runs_as_llama_cpp_runs_it(tmp_path, arch, head_dim):
    # llama's rows are permuted for interleaved RoPE, the others' rotate halves: both with YaRN
    path = tmp_path / f"{arch}.gguf"
    tied = arch in ("llama", "qwen3", "granite")  # llama.cpp wants qwen2's and olmo2's output layer
    tok = write_tiny_gguf(path, arch=arch, types=F32, yarn=True, head_dim=head_dim, seed=7, tied=tied)
    model, _, _ = load_model(path, dtype="float32")
    args = model.args
    assert args.rope_scaling == {"type": "yarn", "factor": YARN_FACTOR, "original_max_position_embeddings":
                                 YARN_ORIGINAL, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                                 "mscale_all_dim": 0.0}  # mlx-lm's own YaRN magnitude
    ids = tok.encode(TEXT).ids
    check_logits(model, path, ids, float32_tol())
    # the same weights unscaled are another model: the scaling is not a no-op here
    plain = tmp_path / "plain.gguf"
    write_tiny_gguf(plain, arch=arch, types=F32, head_dim=head_dim, seed=7, tied=tied)
    unscaled = reference_logits(plain, ids)
    got = np.array(model(mx.array([ids])))[0]
    assert np.abs(got - unscaled).max() > 100 * float32_tol() * np.abs(unscaled).max()


def test_the_attention_factor_counts_and_the_yarn_keys_do_not_as_in_llama_cpp(tmp_path):
    """llama.cpp multiplies cos and sin by rope.scaling.attn_factor, and reads no rope.scaling.yarn_*
    key for these architectures (betas, attention factor, extrapolation mix: checked on such a qwen3
    file, it runs it as without them)."""
    path = tmp_path / "knobs.gguf"
    knobs = {"attn_factor": 0.8, "yarn_attn_factor": 0.8782, "yarn_beta_fast": 16.0, "yarn_beta_slow": 2.0,
             "yarn_ext_factor": 0.5}
    tok = write_tiny_gguf(path, arch="qwen3", types=F32, yarn=knobs, head_dim=24, seed=7)
    model, _, _ = load_model(path, dtype="float32")
    assert model.model.layers[0].self_attn.rope.mscale == pytest.approx(0.8 * (1 + 0.1 * np.log(YARN_FACTOR)))
    check_logits(model, path, tok.encode(TEXT).ids, float32_tol())
    plain = tmp_path / "attn-only.gguf"  # the yarn_* keys change nothing
    write_tiny_gguf(plain, arch="qwen3", types=F32, yarn={"attn_factor": 0.8}, head_dim=24, seed=7)
    ids = tok.encode(TEXT).ids
    without, _, _ = load_model(plain, dtype="float32")
    assert np.array_equal(np.array(model(mx.array([ids]))), np.array(without(mx.array([ids]))))


@pytest.mark.parametrize("arch", ["llama", "qwen2moe", "qwen3moe"])
def test_a_mixture_s_yarn_file_runs_scaled(tmp_path, arch):
    """mlx-lm's Mixtral and Qwen mixtures build a plain RoPE whatever the config says; ours
    (`mlxspec.models.scaled_rope`) build the scaled one, as llama.cpp runs the file."""
    path = tmp_path / f"{arch}.gguf"
    tok = write_tiny_gguf(path, arch=arch, types=F32, experts=4, used=2, yarn=True, seed=5,
                          tied=arch != "qwen2moe")
    model, _, _ = load_model(path, dtype="float32")
    assert type(model.model.layers[0].self_attn.rope).__name__ == "YarnRoPE"
    check_logits(model, path, tok.encode(TEXT).ids, float32_tol())


@pytest.mark.parametrize("scaling", ["yarn", "linear"])
def test_scaling_is_refused_where_the_model_would_run_it_unscaled(tmp_path, scaling):
    # mlx-lm's Gemma 1 and 2 build a plain RoPE whatever rope_scaling says
    path = tmp_path / "gemma2.gguf"
    write_tiny_gguf(path, arch="gemma2", yarn=True)
    _, metadata = mx.load(str(path), return_metadata=True)
    metadata["gemma2.rope.scaling.type"] = scaling
    with pytest.raises(IncompatibleModelsError, match=f"'{scaling}' is not supported for gemma2"):
        gguf_arch.model_args_from_metadata(metadata, [])


@pytest.mark.parametrize("scaling", [{"type": "linear", "factor": 4.0},
                                     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}])
def test_an_mlx_mixture_s_config_scaling_reaches_its_rope(scaling):
    """An MLX folder's config (Qwen3-30B-A3B with YaRN, as Qwen's card enables it): the model
    `models.module` builds scales its RoPE; mlx-lm's own ignores the setting."""
    from mlx_lm.models import qwen3_moe

    from mlxspec import models

    args = dict(model_type="qwen3_moe", hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                num_attention_heads=4, num_experts=2, num_experts_per_tok=1, decoder_sparse_step=1,
                mlp_only_layers=[], moe_intermediate_size=32, rms_norm_eps=1e-6, vocab_size=16,
                num_key_value_heads=2, head_dim=8, rope_theta=10000.0, tie_word_embeddings=True,
                max_position_embeddings=128, norm_topk_prob=True, rope_scaling=scaling)
    module = models.module("qwen3_moe")
    ours = module.Model(module.ModelArgs.from_dict(args)).model.layers[0].self_attn.rope
    theirs = qwen3_moe.Model(qwen3_moe.ModelArgs.from_dict(args)).model.layers[0].self_attn.rope
    x = mx.random.normal((1, 4, 6, 8), key=mx.random.key(0))
    plain = theirs(x, offset=40)
    assert not mx.allclose(ours(x, offset=40), plain).item()
    if "type" in scaling:  # linear: positions divided by the factor
        assert mx.allclose(ours(x, offset=40), mx.fast.rope(x, 8, traditional=False, base=10000.0, scale=0.25,
                                                            offset=40), atol=1e-6).item()


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral", "qwen2_moe"])
def test_a_transformers_5_config_s_nested_rope_is_read(model_type):
    """transformers 5 saves rope_theta and the scaling under rope_parameters: mlx-lm's Qwen3-MoE
    then fails to load (no rope_theta), and its mixtures run unscaled; these read them."""
    from mlxspec import models

    base = dict(model_type=model_type, hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=16, rms_norm_eps=1e-6,
                tie_word_embeddings=False, max_position_embeddings=128,
                # each mixture's own names for its experts
                num_experts=2, num_local_experts=2, num_experts_per_tok=1, decoder_sparse_step=1,
                mlp_only_layers=[], moe_intermediate_size=32, shared_expert_intermediate_size=32,
                head_dim=8, norm_topk_prob=True,
                rope_parameters={"rope_type": "yarn", "rope_theta": 5000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 32})
    module = models.module(model_type)
    args = module.ModelArgs.from_dict(base)
    assert args.rope_theta == 5000.0 and args.rope_scaling["factor"] == 4.0
    rope = module.Model(args).model.layers[0].self_attn.rope
    assert type(rope).__name__ == "YarnRoPE" and rope.mscale == pytest.approx(1 + 0.1 * np.log(4.0))
    plain = dict(base, rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
    args = module.ModelArgs.from_dict(plain)
    assert args.rope_theta == 5000.0 and args.rope_scaling is None

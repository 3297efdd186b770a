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
                                 YARN_ORIGINAL, "beta_fast": 32.0, "beta_slow": 1.0}
    ids = tok.encode(TEXT).ids
    check_logits(model, path, ids, float32_tol())
    # the same weights unscaled are another model: the scaling is not a no-op here
    plain = tmp_path / "plain.gguf"
    write_tiny_gguf(plain, arch=arch, types=F32, head_dim=head_dim, seed=7, tied=tied)
    unscaled = reference_logits(plain, ids)
    got = np.array(model(mx.array([ids])))[0]
    assert np.abs(got - unscaled).max() > 100 * float32_tol() * np.abs(unscaled).max()


@pytest.mark.parametrize("scaling", ["yarn", "linear"])
def test_scaling_is_refused_where_mlx_lm_would_run_it_unscaled(tmp_path, scaling):
    # mlx-lm's Mixtral, Qwen mixtures and Gemma 1 and 2 build a plain RoPE, whatever rope_scaling says
    path = tmp_path / "mixtral.gguf"
    write_tiny_gguf(path, arch="llama", experts=4, used=2, yarn=True)
    _, metadata = mx.load(str(path), return_metadata=True)
    metadata["llama.rope.scaling.type"] = scaling
    with pytest.raises(IncompatibleModelsError, match=f"'{scaling}' is not supported for llama with experts"):
        gguf_arch.model_args_from_metadata(metadata, [])
    metadata.update({"general.architecture": "qwen3moe"})
    metadata = {k.replace("llama.", "qwen3moe."): v for k, v in metadata.items()}
    with pytest.raises(IncompatibleModelsError, match=f"'{scaling}' is not supported for qwen3moe"):
        gguf_arch.model_args_from_metadata(metadata, [])
    dense = {k.replace("qwen3moe.", "qwen3."): v for k, v in metadata.items() if "expert" not in k}
    dense["general.architecture"] = "qwen3"
    assert gguf_arch.model_args_from_metadata(dense, []).rope_scaling["type"] == scaling  # dense Qwen3 reads it

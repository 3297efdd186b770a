"""Mixture-of-experts GGUF files (Mixtral: llama with experts; qwen2moe; qwen3moe) against the
NumPy reference, kept quantized and dequantized, and lossless speculation on them."""

from __future__ import annotations

import numpy as np
import pytest

import mlx.core as mx
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

from tiny import float32_tol
from mlxspec.errors import IncompatibleModelsError
from mlxspec.loading import load_model
from mlxspec.loading.gguf_blocks import AFFINE
from mlxspec.loading.precision import dequantized_weight

from gguf_reference import check_logits, reference_weights
from tiny_gguf import write_tiny_gguf

TEXT = "def hello(name): 12345 and more words"
# arch -> (mlx-lm module, the experts' parent in the model); Qwen2's files always have an output
# layer (llama.cpp requires one), so that one is untied
KINDS = {"llama": ("mixtral", "block_sparse_moe"), "qwen3moe": ("qwen3_moe", "mlp"),
         "qwen2moe": ("qwen2_moe", "mlp")}


@pytest.fixture(scope="module", params=list(KINDS))
def moe_file(tmp_path_factory, request):
    arch = request.param
    path = tmp_path_factory.mktemp("moe") / f"{arch}.gguf"
    tok = write_tiny_gguf(path, arch=arch, experts=4, used=2, seed=5, tied=arch != "qwen2moe")
    return arch, path, tok


@pytest.mark.parametrize("dtype, tol", [("float32", None), ("quantized", 3e-3)])
def test_mixture_logits_match_numpy_reference(moe_file, dtype, tol):
    # a router's softmax, the top 2 of 4 experts (their weights summed to 1 for Mixtral and
    # Qwen3, as they come for Qwen2), Qwen2's shared expert behind its sigmoid gate; the
    # reference agrees with llama.cpp's forward to 2.5e-4-4.5e-4 on float32 files like these
    arch, path, tok = moe_file
    module, parent = KINDS[arch]
    model, _, info = load_model(path, dtype=dtype)
    assert type(model).__module__ == f"mlxspec.models.{module}" and info.context_length == 256  # scaled_rope
    experts = dict(model.named_modules())[f"model.layers.1.{parent}.switch_mlp.up_proj"]
    assert isinstance(experts, QuantizedSwitchLinear if dtype == "quantized" else SwitchLinear)
    assert experts.weight.shape[0] == 4
    ids = tok.encode(TEXT).ids
    check_logits(model, path, ids, tol or float32_tol())


@pytest.mark.parametrize("max_kv", [None, 12])
def test_speculation_on_a_mixture_stays_lossless(moe_file, max_kv):
    from test_engine_trees import check_chains_and_trees_decode_plainly

    _, path, _ = moe_file
    model, tokenizer, _ = load_model(path, dtype="float32")
    check_chains_and_trees_decode_plainly(model, tokenizer, max_kv_size=max_kv, max_tokens=30)


def test_k_quant_experts_stay_quantized_with_their_own_codes(tmp_path):
    # Q4_K and Q5_K experts keep the file's codes (scales and biases rounded to float16); Q6_K's
    # groups of 16 are held at 8 bits, within one 8-bit step of each group's range
    path = tmp_path / "kmoe.gguf"
    types = {"ffn_gate": "Q4_K", "ffn_up": "Q6_K", "ffn_down": "Q5_K"}
    write_tiny_gguf(path, arch="qwen3moe", experts=4, hidden=256, ffn=256, expert_ffn=256, types=types, seed=6)
    model, _, info = load_model(path, dtype="quantized")
    assert info.quantization.endswith("; Q6_K held as 8-bit")
    ref = reference_weights(path)
    modules = dict(model.named_modules())
    for role, kind in types.items():
        m = modules[f"model.layers.0.mlp.switch_mlp.{role.removeprefix('ffn_')}_proj"]
        assert isinstance(m, QuantizedSwitchLinear) and m.bits == (8 if kind == "Q6_K" else AFFINE[kind][0])
        want = ref[f"blk.0.{role}_exps.weight"]
        groups = want.reshape(*want.shape[:-1], -1, 32)
        scales, biases = (np.array(a.astype(mx.float32)) for a in (m.scales, m.biases))
        if kind == "Q6_K":
            bound = (groups.max(-1) - groups.min(-1)) / 255 + 2.0**-11 * (np.abs(scales) * 255 + np.abs(biases))
        else:  # half a float16 ulp of the scale and bias terms
            bound = 2.0**-11 * (np.abs(scales) * (2 ** m.bits - 1) + np.abs(biases))
        err = np.abs(np.array(dequantized_weight(m)) - want).reshape(groups.shape).max(-1)
        assert err.shape == (4, *want.shape[1:-1], want.shape[-1] // 32)
        assert (err <= bound * 1.001 + 1e-9).all(), (role, float((err / (bound + 1e-30)).max()))


def test_mixtures_it_cannot_build_are_refused(tmp_path):
    path = tmp_path / "bad.gguf"
    write_tiny_gguf(path, arch="qwen2", experts=4)
    with pytest.raises(IncompatibleModelsError, match="qwen2 GGUF with 4 experts is not supported.*qwen3moe"):
        load_model(path)
    write_tiny_gguf(path, arch="qwen3moe")
    with pytest.raises(IncompatibleModelsError, match="qwen3moe.expert_count is missing"):
        load_model(path)
    raw = np.zeros(64 * 128, np.float32).view(np.uint8)  # an expert of the layout before 2024
    write_tiny_gguf(path, arch="llama", experts=4, extra={"blk.0.ffn_gate.0.weight": (raw, "F32")})
    with pytest.raises(IncompatibleModelsError, match="each expert in its own tensor"):
        load_model(path)

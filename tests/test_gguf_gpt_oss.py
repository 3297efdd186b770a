"""gpt-oss GGUF files: their layout (biases, sinks, windows, YaRN, experts in MXFP4) against the
NumPy reference of llama.cpp's forward, MXFP4 kept bit for bit as MLX's "mxfp4", harmony's end
tokens, and lossless speculation on them."""

from __future__ import annotations

import numpy as np
import pytest

import mlx.core as mx
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

from tiny import float32_tol
from mlxspec.errors import IncompatibleModelsError
from mlxspec.loading import gguf_arch, load_model
from mlxspec.loading.gguf import requantized
from mlxspec.loading.gguf_tokenizer import end_ids

from gguf_reference import check_logits, reference_weights
from tiny_gguf import write_tiny_gguf

TEXT = "def hello(name): 12345 and more words, the quick brown fox"  # 32 tokens: past the window of 4
# the tensor types of gpt-oss's own files: MXFP4 experts, the rest 8-bit or float
TYPES = {"ffn_gate": "MXFP4", "ffn_up": "MXFP4", "ffn_down": "MXFP4", "token_embd": "Q8_0",
         "attn_q": "Q8_0", "attn_k": "F16", "attn_v": "Q8_0", "attn_output": "F32"}


@pytest.fixture(scope="module")
def oss_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("oss") / "gpt-oss.gguf"
    # a head dim (32) that is not hidden / heads (16), as gpt-oss's (64 of 2880 / 64)
    tok = write_tiny_gguf(path, arch="gpt-oss", experts=4, used=2, tied=False, head_dim=32, window=4,
                          types=TYPES, seed=3)
    return path, tok


@pytest.mark.parametrize("dtype, tol", [("float32", None), ("quantized", 3e-3)])
def test_gpt_oss_logits_match_the_numpy_reference(oss_file, dtype, tol):
    # kept quantized the rest runs in float16, hence the looser tolerance
    path, tok = oss_file
    model, _, info = load_model(path, dtype=dtype)
    assert type(model).__module__ == "mlx_lm.models.gpt_oss" and info.context_length == 256
    experts = model.model.layers[1].mlp.experts.down_proj
    assert isinstance(experts, QuantizedSwitchLinear if dtype == "quantized" else SwitchLinear)
    assert model.model.layers[0].self_attn.rope.mscale == pytest.approx(1 + 0.1 * np.log(32))  # YaRN read
    ids = tok.encode(TEXT).ids
    assert len(ids) > 8  # several windows of 4
    check_logits(model, path, ids, tol or float32_tol())


def test_mxfp4_experts_are_kept_bit_for_bit(oss_file):
    path, _ = oss_file
    model, _, info = load_model(path, dtype="quantized")
    exact = reference_weights(path)
    for part in ("gate", "up", "down"):
        layer = getattr(model.model.layers[0].mlp.experts, f"{part}_proj")
        assert (layer.mode, layer.bits, layer.group_size, layer.scales.dtype) == ("mxfp4", 4, 32, mx.uint8)
        assert "biases" not in layer  # MXFP4 has a scale per group and no offset
        values = mx.dequantize(layer.weight, layer.scales, None, group_size=32, bits=4, mode="mxfp4")
        assert np.array_equal(np.array(values.astype(mx.float32)), exact[f"blk.0.ffn_{part}_exps.weight"])
    assert requantized({"blk.0.ffn_up_exps.weight": "MXFP4"}) == [] and "held as" not in info.quantization


@pytest.mark.parametrize("max_kv", [None, 12])
def test_speculation_on_gpt_oss_stays_lossless(oss_file, max_kv):
    from test_engine_trees import check_chains_and_trees_decode_plainly

    path, _ = oss_file
    model, tokenizer, _ = load_model(path, dtype="float32")
    check_chains_and_trees_decode_plainly(model, tokenizer, max_kv_size=max_kv, max_tokens=30)


def test_harmony_ends_an_answer_on_return_and_call_not_on_end():
    """llama.cpp's rule: with <|return|> and <|call|> in the vocabulary, <|end|> (which closes the
    analysis message before the final one) ends nothing, even where the file names it."""
    tokens = ["a", "<|end|>", "<|return|>", "<|call|>", "<|endoftext|>"]
    vocab = {t: i for i, t in enumerate(tokens)}
    assert end_ids({"tokenizer.ggml.eos_token_id": 2}, tokens, vocab) == [2, 3, 4]
    assert end_ids({"tokenizer.ggml.eos_token_id": 1}, tokens, vocab) == [2, 3, 4]
    phi = tokens[:2] + tokens[4:]  # Phi-3's <|end|> does end its answers
    assert end_ids({}, phi, {t: i for i, t in enumerate(phi)}) == [1, 2]


def test_its_metadata_becomes_gpt_oss_args(oss_file):
    path, _ = oss_file
    _, metadata = mx.load(str(path), return_metadata=True)
    args = gguf_arch.model_args_from_metadata(metadata, ["blk.0.attn_q.weight"])
    assert args.rope_scaling == {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                                 "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0}
    assert (args.sliding_window, args.head_dim, args.intermediate_size, args.num_local_experts,
            args.num_experts_per_tok) == (4, 32, 64, 4, 2)
    del metadata["gpt-oss.attention.sliding_window"]
    with pytest.raises(IncompatibleModelsError, match="gpt-oss.attention.sliding_window is missing"):
        gguf_arch.model_args_from_metadata(metadata, ["blk.0.attn_q.weight"])


def test_a_harmony_gguf_ends_on_return_and_call_and_its_template_is_read(tmp_path):
    """A gpt-oss file with harmony's tokens and template: its tokenizer ends on <|return|> and
    <|call|> (not <|end|>), keeps each marker one token, renders chats with the file's template,
    and is read as harmony (the server and the chat split its channels)."""
    from test_harmony import TEMPLATE, TOKENS

    from mlxspec import harmony
    from mlxspec.prompts import encode_prompt
    from mlxspec.reasoning import thinking_markers

    path = tmp_path / "harmony.gguf"
    write_tiny_gguf(path, arch="gpt-oss", experts=4, used=2, tied=False, window=4, types=TYPES,
                    specials=TOKENS, chat_template=TEMPLATE)
    _, tokenizer, _ = load_model(path, dtype="float32")
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in TOKENS}
    assert ids["<|return|>"] in tokenizer.eos_token_ids and ids["<|call|>"] in tokenizer.eos_token_ids
    assert ids["<|end|>"] not in tokenizer.eos_token_ids
    prompt = encode_prompt([{"role": "user", "content": "Hi"}], tokenizer, len(tokenizer.vocab))
    assert prompt[0] == ids["<|start|>"] and prompt[-1] != ids["<|end|>"]  # the answer's header left open
    assert ids["<|message|>"] in prompt and ids["<|end|>"] in prompt
    assert thinking_markers(tokenizer) == harmony.MARKERS

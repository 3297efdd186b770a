"""A minimal MLX loader for the demo target: SmolLM2-135M-Instruct GGUF -> mlx-lm llama (bf16).

Used by the draft scripts and tests when mlxspec's own loader is not importable. Tensors are
dequantized with the `gguf` package; llama.cpp stores q/k rows permuted for its rope layout,
which `_unpermute` undoes (the inverse of convert_hf_to_gguf's `permute`).
"""

from __future__ import annotations


import numpy as np

NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader, key):
    f = reader.fields[key]
    return f.parts[f.data[0]][0]


def load_target(gguf_path, dtype=None):
    """GGUF path -> mlx_lm.models.llama.Model with the GGUF's weights (default dtype bf16)."""
    import mlx.core as mx
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from mlx_lm.models import llama

    r = GGUFReader(str(gguf_path))
    n_head = int(_field(r, "llama.attention.head_count"))
    n_kv = int(_field(r, "llama.attention.head_count_kv"))
    hidden = int(_field(r, "llama.embedding_length"))
    args = llama.ModelArgs(
        model_type="llama", hidden_size=hidden, num_hidden_layers=int(_field(r, "llama.block_count")),
        intermediate_size=int(_field(r, "llama.feed_forward_length")), num_attention_heads=n_head,
        num_key_value_heads=n_kv, rms_norm_eps=float(_field(r, "llama.attention.layer_norm_rms_epsilon")),
        vocab_size=int(_field(r, "llama.vocab_size")), rope_theta=float(_field(r, "llama.rope.freq_base")),
        max_position_embeddings=int(_field(r, "llama.context_length")), tie_word_embeddings=True,
        head_dim=hidden // n_head,
    )
    weights = []
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        elif t.name == "output.weight":
            continue  # tied to the embedding
        else:
            _, layer, kind, _ = t.name.split(".")
            name = f"model.layers.{layer}.{NAMES[kind]}.weight"
            if kind == "attn_q":
                w = _unpermute(w, n_head)
            elif kind == "attn_k":
                w = _unpermute(w, n_kv)
        weights.append((name, mx.array(w)))
    model = llama.Model(args)
    model.load_weights(weights, strict=True)
    model.set_dtype(dtype or mx.bfloat16)
    mx.eval(model.parameters())
    return model


if __name__ == "__main__":  # imported, never run: say so rather than exit 0 having done nothing
    raise SystemExit("scripts/smollm2_mlx.py is imported by eval_draft.py, and is no command of its own: run that (--help)")

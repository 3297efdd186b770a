"""Random-weight models of named shapes, 4-bit like mlx-community's: measure without downloading.

A synthetic model has a real architecture's exact tensor shapes (layers, widths, heads,
vocabulary) and 4-bit affine-quantized weights (group size 64), so every pass costs what
the real model's would, in time and memory. Its weights are random: its text is noise and
any acceptance rate measured on it means nothing. Compare loop speed on it, not drafts.

Weights are drawn directly in their packed form (random 32-bit words, scales sized so
activations keep their scale through the layers), so a 7B shape builds in seconds and
never materialises float weights.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import mlx.core as mx
import mlx.nn as nn

from ..errors import InvalidArgumentError

GROUP_SIZE, BITS = 64, 4
_GPT_OSS_YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                 "original_max_position_embeddings": 4096}

# Configurations of the published models (their config.json), by the names users know.
SHAPES: Dict[str, dict] = {
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, num_hidden_layers=28, intermediate_size=18944,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, rope_theta=1e6,
                       rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=32768),
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, num_hidden_layers=28, intermediate_size=8960,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, rope_theta=1e6,
                         rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=32768),
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, num_hidden_layers=24, intermediate_size=4864,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, rope_theta=1e6,
                         rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=32768),
    "llama3-8b": dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0,
                      rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=8192),
    "llama3.2-1b": dict(model_type="llama", hidden_size=2048, num_hidden_layers=16, intermediate_size=8192,
                        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0,
                        rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=131072),
    "smollm2-135m": dict(model_type="llama", hidden_size=576, num_hidden_layers=30, intermediate_size=1536,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, rope_theta=100000.0,
                         rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=8192),
    # A mixture: 128 experts, 8 per token, so a pass over k + 1 tokens reads up to 8 (k + 1)
    # experts' weights where one token reads 8; its verify curve climbs faster than a dense model's.
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, intermediate_size=6144,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936,
                          rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False,
                          max_position_embeddings=40960, num_experts=128, num_experts_per_tok=8,
                          moe_intermediate_size=768, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True),
    # gpt-oss: its experts in MXFP4 as OpenAI released them (the rest 4-bit here), 4 of 32 (20b) or
    # of 128 (120b) per token; windows of 128 on every other layer
    "gpt-oss-20b": dict(model_type="gpt_oss", num_hidden_layers=24, num_local_experts=32, num_experts_per_tok=4,
                        vocab_size=201088, hidden_size=2880, intermediate_size=2880, head_dim=64,
                        num_attention_heads=64, num_key_value_heads=8, sliding_window=128, rope_theta=150000,
                        rope_scaling=_GPT_OSS_YARN, rms_norm_eps=1e-5),
    "gpt-oss-120b": dict(model_type="gpt_oss", num_hidden_layers=36, num_local_experts=128, num_experts_per_tok=4,
                         vocab_size=201088, hidden_size=2880, intermediate_size=2880, head_dim=64,
                         num_attention_heads=64, num_key_value_heads=8, sliding_window=128, rope_theta=150000,
                         rope_scaling=_GPT_OSS_YARN, rms_norm_eps=1e-5),
    "qwen3-0.6b": dict(model_type="qwen3", hidden_size=1024, num_hidden_layers=28, intermediate_size=3072,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                       rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=40960),
}
DRAFT_FOR = {"qwen2.5-7b": "qwen2.5-0.5b", "qwen2.5-1.5b": "qwen2.5-0.5b", "llama3-8b": "llama3.2-1b",
             "qwen3-30b-a3b": "qwen3-0.6b", "gpt-oss-120b": "gpt-oss-20b"}


def check_shape(name: str) -> str:
    if name not in SHAPES:
        raise InvalidArgumentError(f"[bench] unknown synthetic shape {name!r}; known: {', '.join(SHAPES)}")
    return name


def build(name: str, *, vocab_size: Optional[int] = None, seed: int = 0, dtype=None):
    """A random 4-bit model of shape `name` (see SHAPES); `vocab_size` overrides the logit width
    (a draft must match its target's). Parameters are evaluated before returning. `dtype` (scales,
    norms, activations): default bfloat16 on a GPU, float32 on a CPU, where MLX's 4-bit products
    with bfloat16 scales ran 8x slower (smollm2-135m: 0.79 s a token against 0.094 s)."""
    from ..device import is_gpu

    if dtype is None:
        dtype = mx.bfloat16 if is_gpu() else mx.float32
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear

    from .. import models

    cfg = dict(SHAPES[check_shape(name)])
    if vocab_size is not None:
        cfg["vocab_size"] = vocab_size
    module = models.module(cfg["model_type"])
    model = module.Model(module.ModelArgs(**cfg))  # lazy: nothing is drawn yet
    mxfp4 = cfg["model_type"] == "gpt_oss"  # its experts: FP4 codes, a power-of-two scale per 32

    def kind(path, m):
        if not hasattr(m, "to_quantized"):
            return False
        return {"group_size": 32, "bits": 4, "mode": "mxfp4"} if mxfp4 and ".experts." in f".{path}" else True

    nn.quantize(model, group_size=GROUP_SIZE, bits=BITS, class_predicate=kind)
    key = mx.random.key(seed)
    for _, m in model.named_modules():
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding, QuantizedSwitchLinear)):
            key, k1 = mx.random.split(key)
            fan_in = m.scales.shape[-1] * m.group_size
            # Words of 8 random 4-bit values q in [0, 15]; w = s * q - 7.5 s is centred (a common
            # offset would push every layer's output along one direction) with variance 21.25 s^2,
            # so s = 1 / sqrt(21.25 fan_in) keeps a layer's output at its input's scale.
            # Drawn as bytes: randint over 32-bit words leaves their low bits zero (float uniforms).
            *rows, words = m.weight.shape  # a mixture's experts: (experts, rows, words)
            m.weight = mx.random.randint(0, 256, (*rows, 4 * words), dtype=mx.uint8, key=k1).view(mx.uint32)
            if getattr(m, "mode", "affine") == "mxfp4":
                # random FP4 codes: 0, +-0.5 ... +-6, mean square 8.5625; the scale byte is 2^(e - 127)
                e = 127 + round(math.log2((8.5625 * fan_in) ** -0.5))
                m.scales = mx.full(m.scales.shape, e, mx.uint8)
                if "bias" in m:
                    m.bias = mx.zeros(m.bias.shape, dtype)
                continue
            s = 1.0 / 8 if isinstance(m, nn.QuantizedEmbedding) else (21.25 * fan_in) ** -0.5
            m.scales = mx.full(m.scales.shape, s, dtype)
            m.biases = mx.full(m.biases.shape, -7.5 * s, dtype)
            if "bias" in m:
                m.bias = mx.zeros(m.bias.shape, dtype)
    for _, m in model.named_modules():
        if isinstance(m, nn.RMSNorm):
            m.weight = mx.ones(m.weight.shape, dtype)
        if "sinks" in m:  # gpt-oss's attention sinks, in the model's dtype (mlx-lm starts them at zero)
            m.sinks = mx.zeros(m.sinks.shape, dtype)
    mx.eval(model.parameters())
    return model


def describe(name: str) -> str:
    c = SHAPES[check_shape(name)]
    return (f"{name} ({c['model_type']}, {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, "
            f"vocab {c['vocab_size']}, {BITS}-bit, random weights)")

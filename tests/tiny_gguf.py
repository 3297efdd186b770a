"""Tiny GGUF files of every architecture the loader reads, written in the tests (their
independent NumPy reference is `gguf_reference`).

The writer follows llama.cpp's `convert_hf_to_gguf.py`: HF-layout weights, Q and K rows
permuted per head (llama's family), quantized with `gguf.quants.quantize`, and a byte-level
BPE or sentencepiece vocabulary (trained here) in the `tokenizer.ggml.*` keys.
"""

from __future__ import annotations

import numpy as np

HIDDEN, HEADS, KV_HEADS, LAYERS, FFN = 64, 4, 2, 2, 128
HEAD_DIM = HIDDEN // HEADS
LLAMA_ROWS = ("llama", "smollm3", "granite")  # architectures whose Q/K rows llama.cpp's converter permutes
GRANITE_SCALES = {"embedding": 2.0, "residual": 0.5, "attention": 0.2, "logit": 4.0}  # none at its default
EPS, THETA = 1e-5, 10000.0
YARN_FACTOR, YARN_ORIGINAL = 32.0, 4096  # gpt-oss's own: its ramp spans dims 5-12 of a head of 32 here
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = (
    "def hello(name):\n    return f'hello {name}'\n\nThe quick brown fox jumps over the lazy dog. "
    "Numbers 12345 and 2024-01-01. Ünïcödé, 日本語, emoji 🤖🎉. " * 4
)

# Storage type per tensor role (the mixes a real GGUF has: Q8_0 embedding, Q4_x body, F32 norms).
DEFAULT_TYPES = {
    "token_embd": "Q8_0", "attn_q": "Q4_0", "attn_k": "Q4_1", "attn_v": "F16",
    "attn_output": "Q8_0", "ffn_gate": "Q4_1", "ffn_up": "Q4_0", "ffn_down": "F32",
}


def train_bpe(pre: str = "default", vocab_size: int = 330, added=()):
    """A byte-level BPE `tokenizers.Tokenizer` trained on CORPUS; `pre` is a GGUF pre-tokenizer name,
    `added` special tokens beyond SPECIALS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS + list(added),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS], trainer)
    return tok


def train_spm(vocab_size: int = 420, space_prefix: bool = True):
    """A sentencepiece BPE model trained on CORPUS as Llama 2's was set up (identity normalization,
    spaces kept, digits split, byte fallback): `(SentencePieceProcessor, ModelProto)`."""
    import io

    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.split("\n")), model_writer=buf, model_type="bpe", vocab_size=vocab_size,
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
        character_coverage=0.98, unk_id=0, bos_id=1, eos_id=2, user_defined_symbols=SPECIALS[1:],
        allow_whitespace_only_pieces=True, minloglevel=2, num_threads=1, add_dummy_prefix=space_prefix,
    )
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(buf.getvalue())
    return spm.SentencePieceProcessor(model_proto=buf.getvalue()), proto


def write_tiny_gguf(path, *, types=None, pre="default", seed=0, tied=True, extra=None, arch="llama",
                    rope_freqs=False, hidden=HIDDEN, ffn=FFN, head_dim=None, layers=LAYERS, window=None,
                    split=0, softcaps=(2.0, 20.0), experts=0, used=2, expert_ffn=64, shared_ffn=96, rope_dims=None,
                    longrope=False, specials=(), chat_template=CHAT_TEMPLATE, yarn=False):
    """Write a random 2-layer llama GGUF at `path`; returns the trained tokenizer it describes (for
    `pre` "spm" or "spm-no-prefix" a `SentencePieceProcessor`, the vocabulary written as llama.cpp
    writes Llama 2's, or Gemma's without the leading space).

    `types` overrides DEFAULT_TYPES per role; `extra` adds `{name: (uint8 bytes array, ggml type name)}`;
    `rope_freqs` adds llama 3's per-pair RoPE period factors (`rope_freqs.weight`); K-quants need
    `hidden` and `ffn` to be multiples of 256 (their blocks' width). `arch` "qwen2" adds Q/K/V
    biases, "qwen3" per-head Q/K norms (and `head_dim` may differ from hidden / heads); both keep
    HF's rows, as llama.cpp's converter does for them (their RoPE rotates halves, "NEOX").
    "olmo2" norms after attention and the MLP only, and Q and K whole (not per head).
    "gemma" is Gemma 1's layout (llama's names, norms stored as 1 + w, GELU, a scaled input).
    "gemma3" adds Gemma 3's norms each side of attention and of the MLP, with the converter's
    1 + w, and a sliding `window` (one layer in 6 sees everything: give `layers` >= 6); "gemma2"
    the same norms without Q/K norms, the `window` on every other layer, and `softcaps` (attention
    and final logits; Gemma 2's own are 50 and 30: random scores would never reach 50, and a cap
    other than the default shows that the file's is read). "phi3"
    fuses Q, K, V in one matrix and the MLP's gate and up in another. `experts` > 0 makes each MLP a
    mixture (a router, `experts` stacked experts of `expert_ffn`, `used` per token): with "llama"
    Mixtral's, with "qwen3moe" Qwen3's (Q/K norms), with "qwen2moe" Qwen2's (Q/K/V biases and a
    gated shared expert of `shared_ffn`). "granite" adds GRANITE_SCALES. `rope_dims` < the head dim
    rotates only that many of each head's dims (Phi-4-mini); `longrope` adds Phi-3's LongRoPE factors for an original context of 32
    (of 256) and the attention factor llama.cpp's converter writes (a number: that factor instead).
    "gpt-oss" is gpt-oss's layout (give `experts`): biases on Q, K, V, O, the router and the
    experts, a sink per head, the norm before the MLP named post_attention_norm, a `window` on
    every other layer, and YaRN RoPE (gpt-oss's: factor 32 over an original context of 4,096); `types`
    "ffn_gate"/"ffn_up"/"ffn_down" "MXFP4" store the experts as its files do.
    `yarn` gives any architecture gpt-oss's YaRN keys (as Qwen2.5's and Qwen3's 128k files have them);
    a dict adds `rope.scaling.<key>` floats beside them (e.g. {"attn_factor": 0.8}).
    `specials` adds special tokens to the BPE vocabulary, `chat_template` replaces CHAT_TEMPLATE.
    `split` > 0 writes parts of that many tensors, named as llama.cpp's gguf-split names them
    (`path`'s stem + "-00001-of-0000N.gguf"), with the same weights as unsplit.
    """
    head_dim = head_dim or hidden // HEADS
    permute = _permute if arch in LLAMA_ROWS else (lambda weights, n_head: weights)
    qk_norms, qkv_biases = arch in ("qwen3", "qwen3moe", "gemma3"), arch in ("qwen2", "qwen2moe", "gpt-oss")
    oss = arch == "gpt-oss"
    import json

    import gguf
    from gguf import GGMLQuantizationType as T

    if pre in ("spm", "spm-no-prefix"):  # sentencepiece, written as llama.cpp's converter writes Llama 2's
        tok, proto = train_spm(space_prefix=pre == "spm")  # Gemma's has no space prefix
        tokens = [p.piece for p in proto.pieces]
        vocab = {t: i for i, t in enumerate(tokens)}
    else:
        tok = train_bpe(pre, added=specials)
        spec = json.loads(tok.to_str())["model"]
        vocab = spec["vocab"]
        tokens = [None] * len(vocab)
        for t, i in vocab.items():
            tokens[i] = t
        merges = [m if isinstance(m, str) else " ".join(m) for m in spec["merges"]]
    types = {**DEFAULT_TYPES, **(types or {})}
    rng = np.random.default_rng(seed)

    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    if arch in ("gemma2", "gemma3", "gpt-oss"):
        w.add_sliding_window(window or 4)
    if oss or yarn:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(YARN_FACTOR)
        w.add_rope_scaling_orig_ctx_len(YARN_ORIGINAL)
        for key, value in (yarn if isinstance(yarn, dict) else {}).items():
            w.add_float32(f"{arch}.rope.scaling.{key}", value)
    if arch == "granite":
        w.add_embedding_scale(GRANITE_SCALES["embedding"])
        w.add_residual_scale(GRANITE_SCALES["residual"])
        w.add_attention_scale(GRANITE_SCALES["attention"])
        w.add_logit_scale(GRANITE_SCALES["logit"])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(softcaps[0])
        w.add_final_logit_softcapping(softcaps[1])
    w.add_feed_forward_length(ffn)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(used)
        if arch != "llama":  # Mixtral's experts are feed_forward_length wide
            w.add_expert_feed_forward_length(expert_ffn)
        if arch == "qwen2moe":
            w.add_expert_shared_feed_forward_length(shared_ffn)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(THETA)
    w.add_layer_norm_rms_eps(EPS)
    w.add_rope_dimension_count(rope_dims or head_dim)
    if longrope:
        w.add_rope_scaling_orig_ctx_len(32)
        converted = float(np.sqrt(1 + np.log(256 / 32) / np.log(32)))
        w.add_rope_scaling_attn_factors(converted if longrope is True else float(longrope))
    if head_dim != hidden // HEADS:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_vocab_size(len(tokens))
    if pre in ("spm", "spm-no-prefix"):
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores([p.score for p in proto.pieces])
        w.add_token_types([p.type for p in proto.pieces])  # sentencepiece's numbering is llama.cpp's
        w.add_add_space_prefix(proto.normalizer_spec.add_dummy_prefix)
        w.add_unk_token_id(proto.trainer_spec.unk_id)
        w.add_bos_token_id(proto.trainer_spec.bos_id)
        w.add_eos_token_id(proto.trainer_spec.eos_id)
        w.add_add_bos_token(True)
    else:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types([3 if t in SPECIALS or t in specials else 1 for t in tokens])
        w.add_token_merges(merges)
        w.add_bos_token_id(vocab["<|im_start|>"])
        w.add_eos_token_id(vocab["<|im_end|>"])
        w.add_add_bos_token(False)
    w.add_chat_template(chat_template)

    def add(name, role, array):
        qtype = T[types[role]] if role else T.F32
        if qtype == T.F32:
            w.add_tensor(name, array.astype(np.float32))
        elif qtype == T.F16:
            w.add_tensor(name, array.astype(np.float16))
        elif qtype.name in _FP16_FIELDS:
            w.add_tensor(name, random_blocks(qtype.name, array.shape, float(array.std()), rng), raw_dtype=qtype)
        else:
            w.add_tensor(name, gguf.quants.quantize(array.astype(np.float32), qtype), raw_dtype=qtype)

    def rand(*shape, scale=None):
        return rng.normal(0.0, scale or shape[-1] ** -0.5, size=shape)

    add("token_embd.weight", "token_embd", rand(len(tokens), hidden, scale=1.0))
    for i in range(layers):
        if arch != "olmo2":  # OLMo 2 norms after attention and the MLP only
            add(f"blk.{i}.attn_norm.weight", None, 1.0 + 0.1 * rand(hidden, scale=1.0))
        if arch == "phi3":  # one matrix for Q, K, V (its rows in that order), typed as attn_q
            add(f"blk.{i}.attn_qkv.weight", "attn_q", rand((HEADS + 2 * KV_HEADS) * head_dim, hidden))
        else:
            add(f"blk.{i}.attn_q.weight", "attn_q", permute(rand(HEADS * head_dim, hidden), HEADS))
            add(f"blk.{i}.attn_k.weight", "attn_k", permute(rand(KV_HEADS * head_dim, hidden), KV_HEADS))
            add(f"blk.{i}.attn_v.weight", "attn_v", rand(KV_HEADS * head_dim, hidden))
        if qkv_biases:
            for part, n in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
                add(f"blk.{i}.attn_{part}.bias", None, rand(n * head_dim, scale=0.5))
        if arch == "olmo2":  # Q and K normed as a whole, before the heads are split
            add(f"blk.{i}.attn_q_norm.weight", None, 1.0 + 0.1 * rand(HEADS * head_dim, scale=1.0))
            add(f"blk.{i}.attn_k_norm.weight", None, 1.0 + 0.1 * rand(KV_HEADS * head_dim, scale=1.0))
        if qk_norms:
            add(f"blk.{i}.attn_q_norm.weight", None, 1.0 + 0.1 * rand(head_dim, scale=1.0))
            add(f"blk.{i}.attn_k_norm.weight", None, 1.0 + 0.1 * rand(head_dim, scale=1.0))
        add(f"blk.{i}.attn_output.weight", "attn_output", rand(hidden, HEADS * head_dim))
        if oss:
            add(f"blk.{i}.attn_output.bias", None, rand(hidden, scale=0.5))
            add(f"blk.{i}.attn_sinks.weight", None, rand(HEADS, scale=1.0))
            add(f"blk.{i}.post_attention_norm.weight", None, 1.0 + 0.1 * rand(hidden, scale=1.0))
        elif arch != "olmo2":
            add(f"blk.{i}.ffn_norm.weight", None, 1.0 + 0.1 * rand(hidden, scale=1.0))
        if arch == "phi3":  # gate's rows, then up's, in one matrix
            add(f"blk.{i}.ffn_up.weight", "ffn_up", rand(2 * ffn, hidden))
        elif experts:  # a router, then each projection's experts stacked (experts, rows, cols)
            width = ffn if arch == "llama" else expert_ffn
            add(f"blk.{i}.ffn_gate_inp.weight", None, rand(experts, hidden, scale=1.0))
            add(f"blk.{i}.ffn_gate_exps.weight", "ffn_gate", rand(experts, width, hidden))
            add(f"blk.{i}.ffn_up_exps.weight", "ffn_up", rand(experts, width, hidden))
            add(f"blk.{i}.ffn_down_exps.weight", "ffn_down", rand(experts, hidden, width))
            if oss:
                add(f"blk.{i}.ffn_gate_inp.bias", None, rand(experts, scale=1.0))
                for part, rows in (("gate", width), ("up", width), ("down", hidden)):
                    add(f"blk.{i}.ffn_{part}_exps.bias", None, rand(experts, rows, scale=0.5))
            if arch == "qwen2moe":
                add(f"blk.{i}.ffn_gate_inp_shexp.weight", None, rand(hidden))
                add(f"blk.{i}.ffn_gate_shexp.weight", "ffn_gate", rand(shared_ffn, hidden))
                add(f"blk.{i}.ffn_up_shexp.weight", "ffn_up", rand(shared_ffn, hidden))
                add(f"blk.{i}.ffn_down_shexp.weight", "ffn_down", rand(hidden, shared_ffn))
        else:
            add(f"blk.{i}.ffn_gate.weight", "ffn_gate", rand(ffn, hidden))
            add(f"blk.{i}.ffn_up.weight", "ffn_up", rand(ffn, hidden))
        if not experts:
            add(f"blk.{i}.ffn_down.weight", "ffn_down", rand(hidden, ffn))
        if arch in ("gemma2", "gemma3", "olmo2"):
            add(f"blk.{i}.post_attention_norm.weight", None, 1.0 + 0.1 * rand(hidden, scale=1.0))
            add(f"blk.{i}.post_ffw_norm.weight", None, 1.0 + 0.1 * rand(hidden, scale=1.0))
    add("output_norm.weight", None, 1.0 + 0.1 * rand(hidden, scale=1.0))
    if not tied:
        add("output.weight", "token_embd", rand(len(tokens), hidden))
    if rope_freqs:
        add("rope_freqs.weight", None, np.linspace(1.0, 8.0, head_dim // 2))
    if longrope:
        add("rope_factors_long.weight", None, np.linspace(1.0, 12.0, (rope_dims or head_dim) // 2))
        add("rope_factors_short.weight", None, np.linspace(1.0, 1.5, (rope_dims or head_dim) // 2))
    for name, (raw, type_name) in (extra or {}).items():
        w.add_tensor(name, raw, raw_dtype=T[type_name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tok


# Byte offsets of the float16 scales (d, dmin) in a block of the types gguf cannot quantize.
_FP16_FIELDS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q3_K": (108,), "Q2_K": (80, 82)}


def random_blocks(type_name, shape, std, rng):
    """Random `type_name` blocks for a (..., rows, cols) tensor whose weights have about `std`.

    gguf writes K-quants but cannot make them, so every code and sub-scale is drawn at
    random (which exercises every bit of the layout) and the block scales are set so the
    dequantized weights have the wanted spread. The reference reads them back like any file.
    """
    import gguf

    kind = gguf.GGMLQuantizationType[type_name]
    block, size = gguf.GGML_QUANT_SIZES[kind]
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)

    def set_scales(value):
        for at in _FP16_FIELDS[type_name]:
            raw[..., at:at + 2] = np.full(raw.shape[:-1], value, np.float16).view(np.uint8).reshape(*raw.shape[:-1], 2)

    set_scales(1.0)  # the weights are linear in the block scales: set them once at 1, then rescale
    spread = gguf.quants.dequantize(raw.reshape(rows, -1), kind).std()
    set_scales(std / spread)
    return raw.reshape(*shape[:-1], -1)


def _permute(weights, n_head):
    # convert_hf_to_gguf.py LlamaModel.permute: HF "rotate half" rows -> interleaved pairs.
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )

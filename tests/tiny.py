"""Tiny random mlx-lm models and a real byte-level tokenizer, built in code (no downloads)."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models import gemma3_text, llama

# Byte-level tokenizer: ids 0..2 are special, 3..258 are the 256 bytes.
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = len(SPECIALS) + 256
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_llama(seed: int = 0, *, vocab_size: int = VOCAB, hidden: int = 64, layers: int = 2,
               heads: int = 4, kv_heads: int = 2, sliding_window=None, layer_types=None,
               dtype=mx.float32) -> llama.Model:
    """A random llama with weights scaled so its next-token distributions are peaked (like a trained model)."""
    args = llama.ModelArgs(
        model_type="llama", hidden_size=hidden, num_hidden_layers=layers,
        intermediate_size=hidden * 2, num_attention_heads=heads, num_key_value_heads=kv_heads,
        rms_norm_eps=1e-5, vocab_size=vocab_size, tie_word_embeddings=True,
        sliding_window=sliding_window, layer_types=layer_types, max_position_embeddings=4096,
    )
    mx.random.seed(seed)
    model = llama.Model(args)
    _scale(model, dtype)
    return model


def make_gemma3(seed: int = 0, *, vocab_size: int = VOCAB, hidden: int = 64, layers: int = 4,
                sliding_window: int = 8, pattern: int = 2) -> gemma3_text.Model:
    """A random gemma3_text model whose sliding layers have a small window."""
    args = gemma3_text.ModelArgs(
        model_type="gemma3_text", hidden_size=hidden, num_hidden_layers=layers,
        intermediate_size=hidden * 2, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
        rms_norm_eps=1e-6, vocab_size=vocab_size, sliding_window=sliding_window,
        sliding_window_pattern=pattern, max_position_embeddings=4096,
    )
    mx.random.seed(seed)
    model = gemma3_text.Model(args)
    _scale(model, mx.float32)
    return model


def _scale(model, dtype):
    # mlx-lm initialises embeddings with N(0,1); a tied head then gives very peaked logits,
    # which is fine, but keep values finite and deterministic across platforms.
    model.set_dtype(dtype)
    mx.eval(model.parameters())


def make_tokenizer():
    """A real Hugging Face byte-level BPE tokenizer (no merges) wrapped like mlx-lm wraps tokenizers."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = list(pre_tokenizers.ByteLevel.alphabet())
    byte_chars.sort(key=lambda c: _BYTE_OF[c])
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for i, ch in enumerate(byte_chars):
        vocab[ch] = len(SPECIALS) + i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token=None, pad_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return TokenizerWrapper(fast)


def _bytes_to_unicode():
    # GPT-2's byte -> printable char table (same as tokenizers' ByteLevel alphabet).
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_OF = _bytes_to_unicode()


def make_eagle_head(target, path, *, seed: int = 0, draft_ids=None, copy: bool = False, name: str = "tiny"):
    """Write an EAGLE head folder for `target` (a llama from make_llama) and return its path.

    copy=True builds the head from a one-layer target's own layer and norm with fc = [I | 0]:
    it then recomputes the target's next feature from the next token (all it lacks is the key
    of position 0), so it drafts what the target would say.
    """
    from mlx_lm.models.llama import ModelArgs

    from mlxspec.drafters.eagle import EagleHead, save_head

    a = target.args
    args = ModelArgs(model_type="llama", hidden_size=a.hidden_size, num_hidden_layers=1,
                     intermediate_size=a.intermediate_size, num_attention_heads=a.num_attention_heads,
                     num_key_value_heads=a.num_key_value_heads, rms_norm_eps=a.rms_norm_eps,
                     vocab_size=a.vocab_size, head_dim=a.hidden_size // a.num_attention_heads,
                     rope_theta=a.rope_theta, max_position_embeddings=a.max_position_embeddings)
    mx.random.seed(seed)
    head = EagleHead(args)
    if copy:
        assert len(target.model.layers) == 1, "copy=True needs a one-layer target"
        H = a.hidden_size
        head.layers[0].update(target.model.layers[0].parameters())
        head.norm.update(target.model.norm.parameters())
        head.fc.weight = mx.concatenate([mx.eye(H), mx.zeros((H, H))], axis=1)
        head.fc.bias = mx.zeros((H,))
    head.set_dtype(mx.float32)
    save_head(path, head, None if draft_ids is None else mx.array(draft_ids), target, name=name,
              dtype=mx.float32)
    return path

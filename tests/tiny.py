"""Tiny random mlx-lm models and a real byte-level tokenizer, built in code (no downloads)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import gemma3_text, llama, qwen2
from mlx_lm.models.cache import KVCache

# Byte-level tokenizer: ids 0..2 are special, 3..258 are the 256 bytes.
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = len(SPECIALS) + 256
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The same turns, with tools shown in a system turn and calls written Qwen's way (so mlx-lm's
# inference reads its format as "json_tools": <tool_call>{"name", "arguments"}</tool_call>).
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n"
    "Call one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m.tool_calls %}{% for tc in m.tool_calls %}"
    "{% set tool_call = tc.function %}<tool_call>{\"name\": \"{{ tool_call.name }}\", \"arguments\": "
    "{{ tool_call.arguments | tojson }}}</tool_call>{% endfor %}{% else %}{{ m['content'] }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def float32_tol(floor: float = 1e-4) -> float:
    """Relative tolerance between float32 results computed in another order or chunking:
    `floor` where float32 matmuls are exact to 2**-24; 8 units of TF32 roundoff (about 4e-3)
    on CUDA, where MLX multiplies float32 in TF32 and a last-bit difference in an input moves
    a product by that much."""
    from mlxspec.device import float32_matmul_roundoff

    return max(floor, 8 * float32_matmul_roundoff())


def make_llama(seed: int = 0, *, vocab_size: int = VOCAB, hidden: int = 64, layers: int = 2,
               heads: int = 4, kv_heads: int = 2, sliding_window=None, layer_types=None,
               dtype=mx.float32, tie_embeddings: bool = True, rope_scaling=None) -> llama.Model:
    """A random llama with weights scaled so its next-token distributions are peaked (like a trained model).

    With tied embeddings each token mostly predicts itself (greedy text repeats one byte);
    `tie_embeddings=False` gives a separate random head, so different prompts give different text.
    """
    args = llama.ModelArgs(
        model_type="llama", hidden_size=hidden, num_hidden_layers=layers,
        intermediate_size=hidden * 2, num_attention_heads=heads, num_key_value_heads=kv_heads,
        rms_norm_eps=1e-5, vocab_size=vocab_size, tie_word_embeddings=tie_embeddings,
        sliding_window=sliding_window, layer_types=layer_types, max_position_embeddings=4096,
        rope_scaling=rope_scaling,
    )
    return _built(llama, args, seed, dtype)


def make_qwen2(seed: int = 0, *, vocab_size: int = VOCAB, hidden: int = 64, layers: int = 2) -> qwen2.Model:
    """A random qwen2 (attention biases, its own output head)."""
    args = qwen2.ModelArgs(
        model_type="qwen2", hidden_size=hidden, num_hidden_layers=layers, intermediate_size=hidden * 2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=vocab_size,
        tie_word_embeddings=False, max_position_embeddings=4096,
    )
    return _built(qwen2, args, seed)


def make_gemma3(seed: int = 0, *, vocab_size: int = VOCAB, hidden: int = 64, layers: int = 4,
                sliding_window: int = 8, pattern: int = 2, head_dim: int = 16) -> gemma3_text.Model:
    """A random gemma3_text model whose sliding layers have a small window."""
    args = gemma3_text.ModelArgs(
        model_type="gemma3_text", hidden_size=hidden, num_hidden_layers=layers,
        intermediate_size=hidden * 2, num_attention_heads=4, num_key_value_heads=1, head_dim=head_dim,
        rms_norm_eps=1e-6, vocab_size=vocab_size, sliding_window=sliding_window,
        sliding_window_pattern=pattern, max_position_embeddings=4096,
    )
    return _built(gemma3_text, args, seed)


def make_gemma2(seed: int = 0, *, vocab_size: int = VOCAB, hidden: int = 64, layers: int = 2,
                sliding_window: int = 4096, cap: float = 3.0):
    """A random Gemma 2 (mlxspec's, with its window) whose final logits are soft-capped at `cap`:
    small enough that the cap bends them (random embeddings give logits of tens)."""
    from mlxspec.models import gemma2

    args = gemma2.ModelArgs(
        model_type="gemma2", hidden_size=hidden, num_hidden_layers=layers, intermediate_size=hidden * 2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, vocab_size=vocab_size,
        rope_theta=10000.0, rope_traditional=False, attn_logit_softcapping=50.0,
        final_logit_softcapping=cap, query_pre_attn_scalar=16, sliding_window=sliding_window,
    )
    return _built(gemma2, args, seed)


def make_granite(seed: int = 0, *, vocab_size: int = VOCAB, hidden: int = 64, layers: int = 2,
                 logits_scaling: float = 0.25):
    """A random Granite: IBM's four scales, its logits divided by `logits_scaling`."""
    from mlx_lm.models import granite

    args = granite.ModelArgs(
        model_type="granite", hidden_size=hidden, num_hidden_layers=layers, intermediate_size=hidden * 2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=vocab_size,
        logits_scaling=logits_scaling, attention_multiplier=0.25, embedding_multiplier=2.0,
        residual_multiplier=0.5, max_position_embeddings=4096, attention_bias=False, mlp_bias=False,
        rope_theta=10000.0,
    )
    return _built(granite, args, seed)


def make_cohere(seed: int = 0, *, vocab_size: int = VOCAB, hidden: int = 64, layers: int = 2,
                logit_scale: float = 0.5):
    """A random Cohere (Command-R): parallel blocks, LayerNorm, its logits times `logit_scale`."""
    from mlx_lm.models import cohere

    args = cohere.ModelArgs(
        model_type="cohere", hidden_size=hidden, num_hidden_layers=layers, intermediate_size=hidden * 2,
        num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, vocab_size=vocab_size,
        logit_scale=logit_scale,
    )
    return _built(cohere, args, seed)


def make_gpt_oss(seed: int = 0, *, vocab_size: int = VOCAB, hidden: int = 64, layers: int = 4,
                 sliding_window: int = 6):
    """A random gpt-oss: 4 experts (2 per token), attention sinks, windowed and full layers."""
    from mlx_lm.models import gpt_oss

    args = gpt_oss.ModelArgs(num_hidden_layers=layers, num_local_experts=4, num_experts_per_tok=2,
                             vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden, head_dim=16,
                             num_attention_heads=4, num_key_value_heads=2, sliding_window=sliding_window)
    model = _built(gpt_oss, args, seed)
    for layer in model.model.layers:  # mlx-lm starts the sinks at zero: give them weight
        layer.self_attn.sinks = mx.random.normal(layer.self_attn.sinks.shape)
    mx.eval(model.parameters())
    return model


def _built(module, args, seed: int, dtype=mx.float32):
    """`module.Model(args)` with random weights drawn from `seed`, in `dtype`."""
    mx.random.seed(seed)
    model = module.Model(args)
    # mlx-lm initialises embeddings with N(0,1); a tied head then gives very peaked logits,
    # which is fine, but keep values finite and deterministic across platforms.
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def fed_positions(cache, B: int, S: int, dtype=mx.float32) -> mx.array:
    """The positions of S fed rows, for models whose KV cache only tracks positions: moves the
    cache along and returns (S,) positions (a tree pass's cache gives one per row:
    mlxspec.tree_forward)."""
    offset = cache[0].offset if cache else 0
    if cache:
        blank = mx.zeros((B, 1, S, 1), dtype)
        cache[0].update_and_fetch(blank, blank)
    return offset if isinstance(offset, mx.array) and offset.ndim == 1 else offset + mx.arange(S)


class RoundingModel(nn.Module):
    """A model whose two best logits at one known position are within one bfloat16 ulp.

    Position p (of the token fed) predicts token `3 + p % 7` by a wide margin, except at
    `tie_at`: there tokens A (= 6) and B (= 5) score 20 + 3/64 + 3/64 = 20.09375 and 20 in exact
    arithmetic (float32). A one-row step adds the three terms in float32 and rounds once to the
    parameter dtype (bfloat16: 20.125 > 20, A wins); a multi-row pass (prefill, verify) adds
    them in the parameter dtype one at a time, as a reordered reduction would (20 + 0.046875
    rounds back to 20 twice: a tie, and argmax takes B, the lower id). In float32 both orders
    give 20.09375 and A wins everywhere. The KV cache only tracks positions.
    """

    A, B = 6, 5

    def __init__(self, tie_at: int, *, vocab: int = 16, length: int = 256, dtype=mx.bfloat16):
        super().__init__()
        self.args = SimpleNamespace(vocab_size=vocab, max_position_embeddings=length)
        base = mx.zeros((length, vocab)).at[mx.arange(length), 3 + mx.arange(length) % 7].add(10.0)
        base[tie_at] = mx.zeros((vocab,)).at[mx.array([self.A, self.B])].add(20.0)
        small = mx.zeros((length, vocab))
        small[tie_at, self.A] = 3 / 64
        self.terms = mx.stack([base, small, small], axis=1).astype(dtype)  # (length, 3, vocab)
        self.layers = [None]

    def make_cache(self):
        return [KVCache()]

    def __call__(self, inputs, cache=None):
        B, S = inputs.shape
        t = self.terms[fed_positions(cache, B, S, self.terms.dtype)]  # (S, 3, V)
        if S == 1:
            z = (t[:, 0].astype(mx.float32) + t[:, 1] + t[:, 2]).astype(t.dtype)
        else:
            z = (t[:, 0] + t[:, 1]) + t[:, 2]
        return mx.broadcast_to(z[None], (B, S, z.shape[-1]))


class ScriptedModel(nn.Module):
    """A model that writes a given text: after `say(ids, after)`, the token fed at position
    `after - 1 + i` predicts ids[i] (by a wide margin), and every other position predicts
    <|im_end|>. Its logits depend on positions only (a tree pass's too), so every drafter and
    cache path gives the same tokens; the KV cache only tracks positions."""

    def __init__(self, *, vocab: int = VOCAB, length: int = 2048):
        super().__init__()
        self.args = SimpleNamespace(vocab_size=vocab, max_position_embeddings=length)
        self.vocab, self.length = vocab, length
        self.layers = [None]
        self.say([], 1)

    def say(self, ids, after: int) -> None:
        """Generate `ids` after a prompt of `after` tokens (and nothing said before)."""
        rows = [SPECIALS.index("<|im_end|>")] * self.length
        rows[after - 1: after - 1 + len(ids)] = list(ids)
        self.rows = mx.array(rows, dtype=mx.int32)
        mx.eval(self.rows)  # here: MLX runs a lazy array on the thread that made it (a server's worker is another)

    def make_cache(self):
        return [KVCache()]

    def __call__(self, inputs, cache=None):
        B, S = inputs.shape
        targets = self.rows[mx.minimum(fed_positions(cache, B, S), self.length - 1)]
        z = 10.0 * (mx.arange(self.vocab)[None] == targets[:, None])  # (S, V)
        return mx.broadcast_to(z[None], (B, S, self.vocab))


def accept_every_draft(p):
    """A deliberately wrong greedy verifier (for `mlxspec.loop.read`): every draft stands.

    Reads the pass as `mlxspec.rounds.read` does, then keeps all k drafts and takes the
    target's token of row k as the next one, whatever rows 0..k-1 chose.
    """
    from mlxspec.rounds import read

    tokens, n, finite, drafts = read(p)
    if p.k == 0 or n == p.k:
        return tokens, n, finite, drafts
    rows = p.out[0].tolist()  # the target's argmax for every fed row (already on the host)
    return drafts + [rows[p.k]], p.k, finite, drafts


def streamed(engine, prompt, **kw):
    """(the tokens `engine.stream(prompt, **kw)` gave, the InvalidArgumentError's message that
    ended the stream or None)."""
    from mlxspec.errors import InvalidArgumentError

    got = []
    try:
        for event in engine.stream(prompt, **kw):
            got.append(event.token)
    except InvalidArgumentError as e:
        return got, str(e)
    return got, None


def make_tokenizer(chat_template: str = CHAT_TEMPLATE, added=()):
    """A real Hugging Face byte-level BPE tokenizer (no merges) wrapped like mlx-lm wraps tokenizers.
    `added`: tokens after the bytes (ids VOCAB, VOCAB + 1...), e.g. a thinking model's markers."""
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
    if added:
        tok.add_tokens(list(added))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token=None, pad_token="<|endoftext|>",
    )
    fast.chat_template = chat_template
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


def make_eagle_head(target, path, *, seed: int = 0, draft_ids=None, copy: bool = False, name: str = "tiny",
                    noise: float = 0.0, feature_layers=(), num_layers: int = 1, context: str = "head"):
    """Write an EAGLE head folder for `target` (a llama from make_llama) and return its path.

    copy=True builds the head from the target's own layers and norm with fc = [I | 0] (the head
    then has as many layers as the target): it recomputes the target's next feature from the
    next token (all it lacks is the key of position 0), so it drafts what the target would say. `noise` adds Gaussian noise of that
    scale to fc: a head that is often right and, where it is not, has the right token close.
    `feature_layers`: an EAGLE-3-style head reading those layers' outputs (random weights).
    `num_layers`: decoder layers in the head (random weights unless copy).
    `context="target"`: the head attends to the target's last-layer keys (`drafters.context`); a
    copy of a one-layer target then recomputes its next feature exactly (position 0 included).
    """
    from mlx_lm.models.llama import ModelArgs

    from mlxspec.drafters.eagle import EagleHead, save_head

    a = target.args
    if copy:
        num_layers = len(target.model.layers)
    args = ModelArgs(model_type="llama", hidden_size=a.hidden_size, num_hidden_layers=num_layers,
                     intermediate_size=a.intermediate_size, num_attention_heads=a.num_attention_heads,
                     num_key_value_heads=a.num_key_value_heads, rms_norm_eps=getattr(a, "rms_norm_eps", 1e-6),
                     vocab_size=a.vocab_size, head_dim=a.hidden_size // a.num_attention_heads,
                     rope_theta=a.rope_theta, max_position_embeddings=getattr(a, "max_position_embeddings", 4096))
    mx.random.seed(seed)
    head = EagleHead(args, taps=len(feature_layers), context=context)
    if copy:
        H = a.hidden_size
        for mine, theirs in zip(head.layers, target.model.layers):
            mine.update(theirs.parameters())
        head.norm.update(target.model.norm.parameters())
        head.fc.weight = mx.concatenate([mx.eye(H), mx.zeros((H, H))], axis=1)
        head.fc.bias = mx.zeros((H,))
        if noise:
            head.fc.weight = head.fc.weight + noise * mx.random.normal(head.fc.weight.shape)
    head.set_dtype(mx.float32)
    save_head(path, head, None if draft_ids is None else mx.array(draft_ids), target, name=name,
              dtype=mx.float32, feature_layers=feature_layers)
    return path


class GatedPrefill:
    """The target model, held at its first prefill chunk once armed (the test presses Esc there)."""

    def __init__(self, model, chunk: int):
        self.model, self.chunk = model, chunk
        self.armed, self.entered, self.release = False, threading.Event(), threading.Event()

    def __call__(self, ids, cache=None):
        if self.armed and ids.shape[1] == self.chunk and not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(10)
        return self.model(ids, cache=cache)

    def __getattr__(self, name):
        return getattr(self.model, name)


class FailingOnce:
    """The model, failing once after its caches advanced (out of memory, Ctrl-C mid-pass): at the
    countdown-th pass from now (0: never) of `width` tokens (None: of any width)."""

    def __init__(self, model, width=None):
        self.model, self.width, self.countdown = model, width, 0

    def __call__(self, ids, cache=None):
        out = self.model(ids, cache=cache)
        if self.countdown and self.width in (None, ids.shape[1]):
            self.countdown -= 1
            if not self.countdown:
                mx.eval(out, [c.state for c in cache])
                raise MemoryError("out of memory")
        return out

    def __getattr__(self, name):
        return getattr(self.model, name)

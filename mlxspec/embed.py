"""Text embeddings from the target's own hidden states: pooled, then normalized.

A causal LM's final hidden states (after its last norm: what its head reads) pooled over an
input are what llama.cpp and Ollama answer for an embedding from a generative model. "mean"
averages every position (llama.cpp's default for such models); "last" takes the last one, which
is how decoder-based embedding models (Qwen3-Embedding, E5-Mistral) are read, since only the
last position has seen the whole input.

Inputs run in batches padded on the right: attention is causal, so a real position never sees
the padding after it, and the padded positions are left out of the pooling. Rows are sorted
by length so a batch pads little, and each batch is fed in chunks through the model's own
cache, so a long input costs what its prefill costs, not a square of its length at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence as Seq

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from .choices import POOLINGS
from .errors import ContextLengthError, InvalidArgumentError, shown
from .prompts import as_integer, as_token_ids, check_in_vocab, check_text, encode_text

MAX_INPUTS = 2048  # inputs per call, as OpenAI's embeddings endpoint allows
# Padded tokens per batch. On a 2-core x86 CPU (demo target, 64 inputs of 10-150 words) batches
# of 512-1,024 ran at the pace of one input at a time and 2,048-4,096 slower (0.8-0.9x); a GPU,
# which one short input leaves idle, gains from them (not measured: no GPU here).
BATCH_TOKENS = 1024
INT16_RANGE = 32760.0  # llama.cpp's normalize 0 scales the largest magnitude to this


@dataclass
class Embeddings:
    """One vector per input (rows of `vectors`, float32, in the inputs' order) and each input's
    token count (after truncation)."""

    vectors: mx.array
    tokens: List[int]


def encode_inputs(inputs, tokenizer, vocab_size: int, context: Optional[int] = None,
                  truncate: bool = False) -> List[List[int]]:
    """`inputs` as token-id lists: a string, a list of token ids (one input), or a list whose
    items are strings or token-id lists (OpenAI's four shapes of `input`).

    Args:
        context: the most tokens an input may have (None: no limit).
        truncate: an input past `context` keeps its first `context` tokens (Ollama's default)
            instead of being refused.

    Raises:
        InvalidArgumentError: no input, more than MAX_INPUTS, an empty one, a token outside the
            vocabulary, text without a tokenizer to encode it.
        ContextLengthError: an input past `context` without `truncate`.
    """
    if isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs
                                   and all(as_integer(t) is not None for t in inputs)):
        inputs = [inputs]
    if not isinstance(inputs, (list, tuple)) or not inputs:
        raise InvalidArgumentError(f"input must be a non-empty string, list of token ids, or list of strings or "
                                   f"token-id lists, got {shown(inputs)}")
    if len(inputs) > MAX_INPUTS:
        raise InvalidArgumentError(f"input has {len(inputs)} items; at most {MAX_INPUTS} per request: send the "
                                   f"rest in another")
    out = []
    for i, item in enumerate(inputs):
        where = f"input {i}" if len(inputs) > 1 else "input"
        if isinstance(item, str):
            check_text(item, where)
            if tokenizer is None:
                raise InvalidArgumentError(f"{where} is text, and this engine has no tokenizer: send token ids")
            ids = encode_text(item, tokenizer) if item else []
        elif isinstance(item, (list, tuple)):
            ids = as_token_ids(item, where)
        else:
            raise InvalidArgumentError(f"{where} must be a string or a list of token ids, got {shown(item)}")
        ids = [int(t) for t in ids]
        if not ids:
            raise InvalidArgumentError(f"{where} is empty: there is nothing to embed")
        check_in_vocab(ids, vocab_size, where)
        if context is not None and len(ids) > context:
            if not truncate:
                raise ContextLengthError(f"{where} has {len(ids)} tokens, more than the model's context of {context}: "
                                         f"shorten it, or ask for truncation to keep its first {context}")
            ids = ids[:context]
        out.append(ids)
    return out


def check_pooling(pooling) -> str:
    if pooling not in POOLINGS:
        raise InvalidArgumentError(f"pooling must be one of {', '.join(POOLINGS)}, got {shown(pooling)}")
    return pooling


def check_normalize(p) -> int:
    """llama.cpp's `embd_normalize`: -1 none, 0 max-abs (int16 range), 1 taxicab, 2 euclidean, > 2 p-norm."""
    if isinstance(p, bool) or not isinstance(p, int) or p < -1:
        raise InvalidArgumentError(f"normalize must be an integer >= -1 (llama.cpp's embd_normalize: -1 none, 0 "
                                   f"max absolute scaled to the int16 range, 1 taxicab, 2 euclidean, p > 2 "
                                   f"p-norm), got {shown(p)}")
    return p


def normalized(vectors: mx.array, p: int) -> mx.array:
    """`vectors` (N, H) with each row scaled as llama.cpp's `common_embd_normalize(…, p)` does
    (a zero row stays zero)."""
    if p == -1:
        return vectors
    mags = mx.abs(vectors)
    if p == 0:
        norm = mags.max(axis=-1, keepdims=True) / INT16_RANGE
    elif p == 2:
        norm = mx.sqrt((vectors * vectors).sum(axis=-1, keepdims=True))
    else:
        norm = (mags ** p).sum(axis=-1, keepdims=True) ** (1.0 / p)
    return mx.where(norm > 0, vectors / mx.where(norm > 0, norm, 1), 0)


def pooled(backbone, model, inputs: Seq[Seq[int]], pooling: str, *, batch_tokens: int = BATCH_TOKENS,
           step: int = 512, cancel=None) -> Optional[mx.array]:
    """Each input's final hidden states pooled: (N, H) float32, in the inputs' order; None when
    `cancel` was set (checked between chunks).

    Args:
        backbone: `tokens (B, S), cache -> hidden (B, S, H)` (`backbone.split_model`).
        model: the model whose `make_cache` (or layer count) gives the backbone's caches.
        inputs: non-empty token-id lists.
        pooling: "mean" or "last".
        batch_tokens: padded tokens per batch (a longer input runs alone).
        step: columns fed per pass.
    """
    order = sorted(range(len(inputs)), key=lambda i: -len(inputs[i]))
    out: List[Optional[mx.array]] = [None] * len(inputs)
    start = 0
    while start < len(order):
        width = len(inputs[order[start]])  # the longest row of this batch: it is sorted
        rows = order[start:start + max(1, batch_tokens // width)]
        start += len(rows)
        vectors = _batch(backbone, model, [inputs[i] for i in rows], width, pooling, step, cancel)
        if vectors is None:
            return None
        for j, i in enumerate(rows):
            out[i] = vectors[j]
    return mx.stack(out)


def _batch(backbone, model, rows, width: int, pooling: str, step: int, cancel) -> Optional[mx.array]:
    lengths = mx.array([len(r) for r in rows])
    tokens = mx.array([list(r) + [0] * (width - len(r)) for r in rows], dtype=mx.uint32)
    cache = make_prompt_cache(model)
    total = None
    for s in range(0, width, step):
        if cancel is not None and cancel.is_set():
            return None
        e = min(width, s + step)
        h = backbone(tokens[:, s:e], cache).astype(mx.float32)
        pos = mx.arange(s, e)[None, :, None]
        if pooling == "mean":
            part = mx.where(pos < lengths[:, None, None], h, 0).sum(axis=1)
        else:  # the row's last position, where it falls in this chunk
            part = mx.where(pos == lengths[:, None, None] - 1, h, 0).sum(axis=1)
        total = part if total is None else total + part
        mx.eval(total, [c.state for c in cache])  # one chunk's graph at a time
    return total / lengths[:, None].astype(mx.float32) if pooling == "mean" else total

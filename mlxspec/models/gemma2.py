"""Gemma 2 with its sliding window: mlx-lm's `gemma2` model, every other layer windowed.

Gemma 2's even layers (0, 2, ...) attend to the last `sliding_window` positions only (4,096
in the released models), its odd layers to everything, as in Google's reference code, HF
transformers and llama.cpp. mlx-lm's `gemma2` gives every layer full attention, which is
the same model up to `sliding_window` tokens of context and another one past it (Gemma 2's
trained context is 8,192). This is mlx-lm's model with the window put back the way mlx-lm's
`gemma3_text` does it: the windowed layers get a `RotatingKVCache(max_size=window)` from
`make_cache` and ask their cache for a windowed mask, so mlxspec's rollback caches and tree
passes give every query exactly its window.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models import gemma2
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache, RotatingKVCache


@dataclass
class ModelArgs(gemma2.ModelArgs):
    sliding_window: int = 4096  # keys a windowed layer's query sees, its own included
    max_position_embeddings: int = 8192  # trained context


def windowed(i: int) -> bool:
    """Whether layer `i` attends within the window (Gemma 2: the even layers)."""
    return i % 2 == 0


def grouped(mask, args):
    """`mask` for mlx-lm's Gemma 2 attention, which groups its queries as (B, KV heads, repeats,
    L, D) where heads share keys: a per-row mask (B, 1, L, T), as batched caches make, gets an
    axis for the repeats. Without it the rows' axis lines up with the KV heads': an error, or,
    with as many rows as KV heads, each row masked with another's padding."""
    if mask is None or mask.ndim != 4 or args.num_attention_heads == args.num_key_value_heads:
        return mask
    return mx.expand_dims(mask, 2)


class GemmaModel(gemma2.GemmaModel):
    def __call__(self, inputs: mx.array, cache=None):
        h = self.embed_tokens(inputs)
        h = h * (self.args.hidden_size**0.5)
        if cache is None:
            cache = [None] * len(self.layers)
        full = create_attention_mask(h, cache[1] if len(cache) > 1 else None, return_array=True)
        window = create_attention_mask(h, cache[0], window_size=self.args.sliding_window, return_array=True)
        full, window = grouped(full, self.args), grouped(window, self.args)
        for i, (layer, c) in enumerate(zip(self.layers, cache)):
            h = layer(h, window if windowed(i) else full, c)
        return self.norm(h)


class Model(gemma2.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.model = GemmaModel(args)  # mlx-lm's layers and names; only the masks differ

    def make_cache(self):
        return [RotatingKVCache(max_size=self.args.sliding_window) if windowed(i) else KVCache()
                for i in range(self.args.num_hidden_layers)]

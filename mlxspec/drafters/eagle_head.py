"""The EAGLE head: fc(concat(embed(x[j+1]), f[j])) -> llama decoder layer(s) -> RMSNorm, the
predicted next feature f[j+1] (EAGLE's reference `Model` is one decoder layer plus an `fc`)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.llama import ModelArgs, TransformerBlock


class EagleHead(nn.Module):
    """fc(concat(embedding, feature)) -> llama decoder layer(s) -> RMSNorm: the next feature.

    Args:
        args: the decoder layers' llama `ModelArgs` (hidden size = the target's;
            `num_hidden_layers` of them, EAGLE's one by default).
        taps: how many target layers' outputs a real entry's feature is made of (0: the
            target's final hidden state itself).
        context: what its attention reads for the positions the target has run: "head" (keys
            and values of its own, EAGLE) or "target" (the target's last layer's, `context`).
    """

    def __init__(self, args: ModelArgs, taps: int = 0, context: str = "head"):
        super().__init__()
        self.args = args
        self.taps = taps
        self.context = context
        H = args.hidden_size
        self.fc = nn.Linear(2 * H, H)
        if taps:
            self.fc_layers = nn.Linear(taps * H, H)
        # a list, so `cache.make_cache` builds one cache per layer
        self.layers = [TransformerBlock(args) for _ in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(H, eps=args.rms_norm_eps)

    def __call__(self, embeds: mx.array, features: mx.array, cache=None, mask=None) -> mx.array:
        """(B, S, H) embeddings of x[j+1] and (B, S, H) features f[j] -> (B, S, H) predicted f[j+1].

        `mask` defaults to the cache's causal mask; a tree drafter passes its own.
        """
        x = self.fc(mx.concatenate([embeds, features], axis=-1))  # (B, S, H)
        cache = cache or [None] * len(self.layers)
        if mask is None:
            mask = create_attention_mask(x, cache[0])
        for layer, c in zip(self.layers, cache):
            x = layer(x, mask, cache=c)
        return self.norm(x)

    def lift(self, kept: mx.array) -> mx.array:
        """What the target kept for a position (its final hidden state, or its tapped layers'
        outputs) -> the feature a real entry reads."""
        return self.fc_layers(kept) if self.taps else kept

"""A small MLX model as drafter, with its own rollback cache in the same process."""

from __future__ import annotations

from typing import List, Optional

import mlx.core as mx

from .. import kernels
from ..sampling import SamplingParams
from ..sequence import Sequence
from .base import Draft


class ModelDrafter:
    """Samples k tokens autoregressively from a draft model.

    Its cache is synced to the committed history at each `propose` (rolling back the
    rejected drafts; after a fully accepted round the last draft token, never fed, is fed
    then). Drafting stops early after a token whose draft probability is below
    `min_confidence` (the engine asks for that when it picks k itself): a token the draft
    is unsure of is likely rejected, and every drafted token costs a verify slot.
    """

    name = "model"
    uses_model = True

    def __init__(self, model, *, target_vocab: int, max_kv_size: Optional[int], headroom: int):
        self.model = model
        self.target_vocab = target_vocab
        self.seq = Sequence(model, max_kv_size=max_kv_size, headroom=headroom)

    def reset(self) -> None:
        self.seq.reset()

    def prefill(self, history: List[int]) -> None:
        """Bring the cache up to history[:-1] (prompt processing)."""
        todo = self.seq.sync(history)
        self.seq.prefill(todo[:-1])

    def _fit(self, logits: mx.array) -> mx.array:
        # Draft and target may pad their embeddings differently: compare over the target's width.
        V = logits.shape[-1]
        if V > self.target_vocab:
            return logits[..., : self.target_vocab]
        if V < self.target_vocab:
            pad = mx.full((*logits.shape[:-1], self.target_vocab - V), -mx.inf, logits.dtype)
            return mx.concatenate([logits, pad], axis=-1)
        return logits

    def propose(self, history, k, params: SamplingParams, key, *, min_confidence: float = 0.0) -> Draft:
        if k <= 0:
            return Draft([])
        feed = self.seq.sync(history)
        tokens, rows = [], []
        subkeys = None if key is None or params.greedy else mx.random.split(key, k)
        for i in range(k):
            logits = self._fit(self.seq.forward(feed)[-1].astype(mx.float32))
            if params.greedy:
                tok = mx.argmax(logits)
                top = mx.max(mx.softmax(logits, precise=True)) if min_confidence > 0 else mx.array(1.0)
            else:
                q = kernels.probabilities(logits, params)
                tok = mx.random.categorical(mx.log(q), key=None if subkeys is None else subkeys[i])
                top = mx.max(q)
                rows.append(q)
            mx.eval(tok, top)
            t = int(tok.item())
            tokens.append(t)
            if i < k - 1 and float(top.item()) < min_confidence:
                break
            feed = [t]
        probs = mx.stack(rows) if rows else None
        return Draft(tokens, probs)

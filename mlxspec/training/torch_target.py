"""The target in PyTorch for the --gguf trainers: loaded from its GGUF by transformers, and what
batched generation with it needs (left padding, a KV cache that grows without copying).
"""

from __future__ import annotations

from pathlib import Path


def load_target(gguf: Path):
    """(tokenizer, fp32 torch model) dequantized from the GGUF by transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    return tok, model.eval()


def cache_kw(model, cache) -> dict:
    """The KV-cache keyword of this transformers' forward: `cache` in newer releases (which
    deprecate `past_key_values`, to be removed), `past_key_values` in older ones."""
    import inspect

    return {"cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values": cache}


def kv_cache(capacity: int = 0):
    """A transformers KV cache for batched generation that writes each step's keys and values
    into buffers grown by doubling, instead of concatenating the whole cache at every step
    (DynamicCache's way, a copy that grows with the prompts).
    The attention reads views of the buffers. Falls back to DynamicCache where transformers'
    cache layers differ (releases before cache_utils.DynamicLayer)."""
    from transformers import DynamicCache

    try:
        from transformers.cache_utils import Cache, DynamicLayer
    except ImportError:
        return DynamicCache()

    class BufferedLayer(DynamicLayer):
        def lazy_initialization(self, key_states, value_states):
            super().lazy_initialization(key_states, value_states)
            self.n, self.kbuf, self.vbuf = 0, None, None

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n, m = self.n, key_states.shape[-2]
            if self.kbuf is None or n + m > self.kbuf.shape[-2]:
                size = max(capacity, 2 * (n + m))
                kbuf = key_states.new_empty(key_states.shape[:-2] + (size, key_states.shape[-1]))
                vbuf = value_states.new_empty(value_states.shape[:-2] + (size, value_states.shape[-1]))
                if n:
                    kbuf[..., :n, :], vbuf[..., :n, :] = self.keys, self.values
                self.kbuf, self.vbuf = kbuf, vbuf
            self.kbuf[..., n:n + m, :] = key_states
            self.vbuf[..., n:n + m, :] = value_states
            self.n = n + m
            self.keys, self.values = self.kbuf[..., :self.n, :], self.vbuf[..., :self.n, :]
            return self.keys, self.values

        def batch_select_indices(self, indices):
            if self.is_initialized and self.kbuf is not None:
                self.kbuf, self.vbuf = self.kbuf[indices], self.vbuf[indices]
                self.keys, self.values = self.kbuf[..., :self.n, :], self.vbuf[..., :self.n, :]

    return Cache(layer_class_to_replicate=BufferedLayer)


def left_padded(prompts_ids, pad: int):
    """A batch of prompts, left-padded: (ids (B, L), attention mask (B, L), position ids (B, L))."""
    import torch

    B = len(prompts_ids)
    L = max(len(p) for p in prompts_ids)
    ids = torch.full((B, L), pad, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    for i, p in enumerate(prompts_ids):
        ids[i, L - len(p):] = torch.tensor(p)
        mask[i, L - len(p):] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


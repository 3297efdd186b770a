"""Qwen3's mixtures (Qwen3-30B-A3B, 235B-A22B): mlx-lm's, with the RoPE its `rope_scaling` asks
for (`scaled_rope`; Qwen's card enables YaRN for 128k this way)."""

from __future__ import annotations

from mlx_lm.models import qwen3_moe

from .scaled_rope import rebuild

ModelArgs = qwen3_moe.ModelArgs


class Model(qwen3_moe.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        rebuild(self, args)

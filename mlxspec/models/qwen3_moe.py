"""Qwen3's mixtures (Qwen3-30B-A3B, 235B-A22B): mlx-lm's, with the RoPE its `rope_scaling` asks
for (`scaled_rope`; Qwen's card enables YaRN for 128k this way), also from transformers 5's
`rope_parameters` (mlx-lm's would not load such a config: it wants `rope_theta` at the top)."""

from __future__ import annotations

from dataclasses import dataclass

from mlx_lm.models import qwen3_moe

from .scaled_rope import nested_rope, rebuild


@dataclass
class ModelArgs(qwen3_moe.ModelArgs):
    @classmethod
    def from_dict(cls, params):
        return super().from_dict(nested_rope(params))


class Model(qwen3_moe.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        rebuild(self, args)

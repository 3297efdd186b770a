"""Qwen2's mixtures (Qwen1.5-MoE, Qwen2-57B-A14B): mlx-lm's, with the RoPE its `rope_scaling`
asks for (`scaled_rope`), also from transformers 5's `rope_parameters`. mlx-lm's args refuse
every scaling but linear, then ignore it; these take YaRN too."""

from __future__ import annotations

from dataclasses import dataclass

from mlx_lm.models import qwen2_moe

from .scaled_rope import nested_rope, rebuild


@dataclass
class ModelArgs(qwen2_moe.ModelArgs):
    @classmethod
    def from_dict(cls, params):
        return super().from_dict(nested_rope(params))

    def __post_init__(self):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads


class Model(qwen2_moe.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        rebuild(self, args)

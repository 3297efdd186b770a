"""Mixtral: mlx-lm's, with the RoPE its `rope_scaling` (or transformers 5's `rope_parameters`)
asks for (`scaled_rope`)."""

from __future__ import annotations

from dataclasses import dataclass

from mlx_lm.models import mixtral

from .scaled_rope import nested_rope, rebuild


@dataclass
class ModelArgs(mixtral.ModelArgs):
    @classmethod
    def from_dict(cls, params):
        return super().from_dict(nested_rope(params))


class Model(mixtral.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        rebuild(self, args)

"""Mixtral: mlx-lm's, with the RoPE its `rope_scaling` asks for (`scaled_rope`)."""

from __future__ import annotations

from mlx_lm.models import mixtral

from .scaled_rope import rebuild

ModelArgs = mixtral.ModelArgs


class Model(mixtral.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        rebuild(self, args)

"""Gemma (1, and CodeGemma) with the GELU its reference runs: mlx-lm's `gemma` with tanh GELU.

mlx-lm's `gemma` gates its MLP with the exact (erf) GELU. Gemma's reference code, HF
transformers (its `hidden_activation`, "gelu_pytorch_tanh" when a config names none, as the
released ones do not) and llama.cpp use the tanh approximation, which differs by up to about
1e-3 per activation. This is mlx-lm's model with the MLP's activation the config's, tanh by
default; parameters and names are mlx-lm's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import gemma


@dataclass
class ModelArgs(gemma.ModelArgs):
    hidden_activation: Optional[str] = None  # HF's key; None: "gelu_pytorch_tanh", as transformers reads it
    max_position_embeddings: int = 8192  # trained context


class MLP(gemma.MLP):
    def __init__(self, dim: int, hidden_dim: int, exact: bool):
        super().__init__(dim, hidden_dim)
        self._gelu = nn.gelu if exact else nn.gelu_approx  # underscore: not a parameter

    def __call__(self, x) -> mx.array:
        return self.down_proj(self._gelu(self.gate_proj(x)) * self.up_proj(x))


class Model(gemma.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        exact = args.hidden_activation == "gelu"
        for layer in self.model.layers:
            layer.mlp = MLP(args.hidden_size, args.intermediate_size, exact)

"""Model variants where mlx-lm's own module is not the reference model (each module says how).

`module(model_type)` is the module that builds a model of that mlx-lm `model_type`: ours where
there is one, else mlx-lm's.
"""

from __future__ import annotations

import importlib

OURS = {"gemma": "mlxspec.models.gemma", "gemma2": "mlxspec.models.gemma2", "mixtral": "mlxspec.models.mixtral",
        "qwen2_moe": "mlxspec.models.qwen2_moe", "qwen3_moe": "mlxspec.models.qwen3_moe"}


def module(model_type: str):
    """The module with `Model` and `ModelArgs` for `model_type` (e.g. "llama", "gemma2")."""
    return importlib.import_module(OURS.get(model_type, f"mlx_lm.models.{model_type}"))

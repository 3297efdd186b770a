"""Loading: models.toml pairs, model resolution, GGUF, precision, and `load()`.

    engine = mlxspec.load("demo")                       # a pair name
    engine = mlxspec.load("mlx-community/Qwen2.5-7B-Instruct-4bit",
                          "mlx-community/Qwen2.5-0.5B-Instruct-4bit")
    model, tokenizer, info = load_model("path/to/model.gguf", dtype="float32")
"""

from .api import load
from .model import ModelInfo, load_model
from .registry import Pair, pairs

__all__ = ["load", "load_model", "ModelInfo", "Pair", "pairs"]

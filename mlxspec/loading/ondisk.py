"""What a model found on disk holds, read without loading it: its weights' bytes and its trained
context (`mlxspec models` fills a user's own pair with them where models.toml leaves them out)."""

from __future__ import annotations

import json

from .resolve import Resolved


def weights_bytes_on_disk(res: Resolved) -> int:
    """Bytes of the weights as stored: every part of a GGUF, or a folder's safetensors."""
    if res.format == "gguf":
        from .gguf import gguf_parts

        return sum(p.stat().st_size for p in gguf_parts(res.path))
    return sum(p.stat().st_size for p in res.path.glob("*.safetensors"))


def trained_context(res: Resolved) -> int | None:
    """The context the model was trained for, from its GGUF header or config.json; None where
    neither says."""
    if res.format == "gguf":
        from .gguf_header import read_header

        metadata, _ = read_header(res.path)  # a split file's first part holds the metadata
        value = metadata.get(f"{metadata.get('general.architecture')}.context_length")
        return int(value.item() if hasattr(value, "item") else value) if value is not None else None
    return config_context(json.loads((res.path / "config.json").read_text(encoding="utf-8")))


def config_context(config: dict) -> int | None:
    """`max_position_embeddings` of an mlx-lm config, or of its `text_config` (vision-language models)."""
    return config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")

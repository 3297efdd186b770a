"""Cheap fingerprints that distributed ranks compare at load: same weights, same tokenizer, same settings.

A sharded target is only right when every rank loaded the same checkpoint; a rank with
other weights or another tokenizer would silently feed the collectives different numbers.
Hashing a 40 GB checkpoint on every start would take a minute, so a weights file is
fingerprinted by its name, size and 16 blocks of 64 KiB spread over it (the header, which
names every tensor and its offset, and samples of the data), enough to tell checkpoints
apart; and an in-memory model by its parameter names, shapes and leading values.

Every fingerprint is a non-negative int below 2**62 (it travels in an int64 all-sum).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

BLOCKS = 16  # blocks read per file
BLOCK_BYTES = 1 << 16
_FILES = ("*.safetensors", "*.gguf", "config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def _int(h) -> int:
    return int.from_bytes(h.digest()[:8], "little") >> 2


def files_fingerprint(path) -> int:
    """A file (e.g. a .gguf), or a model folder's weights, config and tokenizer files."""
    path = Path(path)
    files = [path] if path.is_file() else sorted({f for pattern in _FILES for f in path.glob(pattern)})
    h = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            for i in range(BLOCKS):
                fh.seek(size * i // BLOCKS)
                h.update(fh.read(BLOCK_BYTES))
    return _int(h)


def value_fingerprint(value) -> int:
    """A JSON-able setting (a dtype, a window, a quantization...)."""
    return _int(hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()))


def tokenizer_fingerprint(tokenizer) -> int:
    """The vocabulary (id -> text), special ids and chat template."""
    h = hashlib.sha256()
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    h.update(json.dumps(sorted(vocab.items(), key=lambda kv: kv[1])).encode())
    for name in ("bos_token_id", "eos_token_id", "eos_token_ids", "chat_template"):
        value = getattr(tokenizer, name, None)
        h.update(f"{name}={sorted(value) if isinstance(value, (set, list)) else value}".encode())
    return _int(h)


def model_fingerprint(model, values: int = 256) -> int:
    """Parameter names, shapes, dtypes and the first `values` numbers of each (evaluates those only)."""
    import numpy as np

    h = hashlib.sha256()
    for name, v in tree_flatten(model.parameters()):
        h.update(f"{name}:{v.shape}:{v.dtype}".encode())
        head = v.reshape(-1)[:values]
        h.update(np.array(head.astype(mx.float32) if head.dtype == mx.bfloat16 else head).tobytes())
    return _int(h)

"""OpenAI's `system_fingerprint`: which backend configuration answered, for use with `seed`.

With a seed every sampled token is a race the seed and the position fix, which every drafter
runs too (`mlxspec.sampling.race`), so the text depends on the weights, how the target
computes (MLX's version, the backend, the precision, the KV cache) and nothing else: not on
the drafter, the draft lengths or trees. The fingerprint hashes exactly those, so two answers
with the same seed and fingerprint are the same text, up to the rounding that can also part
a greedy near-tie (README: "Greedy output per precision").
"""

from __future__ import annotations

import hashlib
import json

import mlx.core as mx

from .. import __version__, blas
from ..device import backend, device_name
from ..reference import dtype_name, working_dtype


def system_fingerprint(engine) -> str:
    """"fp_" and 10 hex digits of a hash of what decides a seeded answer's text on this server."""
    info = getattr(engine, "target_info", None)
    quant = getattr(engine, "kv_quant", None)
    model = getattr(engine, "target_model", None)
    parts = {"mlxspec": __version__, "mlx": mx.__version__, "backend": backend(), "device": device_name(),
             "blas": blas.info()["name"],
             "target": getattr(info, "ref", None), "dtype": dtype_name(working_dtype(model)) if model else None,
             "max_kv_size": getattr(engine, "max_kv_size", None),
             "kv": None if quant is None else [quant.bits, quant.group_size, quant.start]}
    if adapter := getattr(info, "adapter", None):  # only then: servers without one keep their fingerprints
        parts["adapter"] = adapter
        if "fused" in (info.adapter_kind or ""):  # folded into the weights, it rounds otherwise
            parts["adapter_kind"] = info.adapter_kind
    return "fp_" + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]

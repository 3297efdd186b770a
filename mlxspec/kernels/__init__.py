"""Fused Metal kernels for the hot path of a round, with the pure-MLX references as fallback.

    probabilities(logits, params)        -> processed probabilities   (kernels/softmax.py)
    verify_with_uniforms(p, q, x, u)     -> int32 [n_accepted, next]  (kernels/verify.py)
    verify_greedy(target, draft_tokens)  -> int32 [n_accepted, next]  (kernels/verify.py)
    backend_name()                       -> "metal" | "reference"

The kernels run when Metal is available and the default device is the GPU; otherwise the
references in `mlxspec.sampling` / `mlxspec.verify` run. `MLXSPEC_KERNELS=auto|metal|reference`
overrides that (`metal` without Metal raises KernelUnavailableError). The kernels are
tested on any machine through `kernels.emulator` (see README.md).
"""

from __future__ import annotations

import os

import mlx.core as mx

from ..errors import InvalidArgumentError, MlxSpecError
from ..sampling import SamplingParams
from . import softmax as _softmax
from . import verify as _verify

ENV = "MLXSPEC_KERNELS"
MODES = ("auto", "metal", "reference")
METAL_AVAILABLE = _softmax._kernel is not None and _verify._sample_kernel is not None


class KernelUnavailableError(MlxSpecError, RuntimeError):
    """The Metal kernels were requested where there is no Metal device."""


def backend_name() -> str:
    """"metal" when the fused kernels will run, "reference" when the pure-MLX path will."""
    mode = os.environ.get(ENV, "auto")
    if mode == "auto":
        return "metal" if METAL_AVAILABLE and mx.default_device().type == mx.gpu else "reference"
    if mode == "reference":
        return "reference"
    if mode == "metal":
        if not METAL_AVAILABLE:
            raise KernelUnavailableError(f"{ENV}=metal but Metal is not available on this machine; "
                                         f"use {ENV}=auto or {ENV}=reference")
        return "metal"
    raise InvalidArgumentError(f"{ENV} must be one of {', '.join(MODES)}, got {mode!r}")


def probabilities(logits: mx.array, params: SamplingParams, fires=None, ids=None) -> mx.array:
    """Rows of logits (..., V) -> float32 processed probabilities, as `mlxspec.sampling.probabilities`
    (the kernel fuses temperature, top-k, top-p and min-p; typical-p, top-n-sigma, XTC and mirostat run the
    reference)."""
    if backend_name() == "metal" and params.fused:
        return _softmax.probabilities_metal(logits, params)
    return _softmax.probabilities_reference(logits, params, fires, ids)


def verify_with_uniforms(target_probs: mx.array, draft_probs: mx.array, draft_tokens: mx.array,
                         uniforms: mx.array) -> mx.array:
    """(k+1, V), (k, V), (k,), (k+1,) -> int32 [n_accepted, next_token], as `mlxspec.verify.verify_with_uniforms`."""
    if backend_name() == "metal":
        return _verify.verify_with_uniforms_metal(target_probs, draft_probs, draft_tokens, uniforms)
    return _verify.verify_with_uniforms_reference(target_probs, draft_probs, draft_tokens, uniforms)


def verify_greedy(target: mx.array, draft_tokens: mx.array) -> mx.array:
    """Greedy round -> int32 [n_accepted, next_token].

    Args:
        target: the target's argmax tokens (k+1,), as `mlxspec.verify.verify_greedy`, or its
            rows (k+1, V) of probabilities or logits (argmax taken here, first index on ties;
            fused into the kernel on Metal).
        draft_tokens: (k,) draft token ids.
    """
    if target.ndim == 1:
        return _verify.verify_greedy_reference(target, draft_tokens)
    if backend_name() == "metal":
        return _verify.verify_greedy_rows_metal(target, draft_tokens)
    return _verify.verify_greedy_rows_reference(target, draft_tokens)


__all__ = ["probabilities", "verify_with_uniforms", "verify_greedy", "backend_name", "KernelUnavailableError",
           "METAL_AVAILABLE"]

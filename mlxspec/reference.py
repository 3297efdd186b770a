"""A float32 reference for greedy checks: is a divergence rounding or a bug?

At temperature 0 speculative decoding must reproduce plain decoding token for token. A
verify pass over k+1 rows computes the same logits as k+1 one-row steps, but with another
reduction order. In float32 the two agree to about 1e-6; in bfloat16 one unit in the last
place (ulp) of a logit near 20 is 0.125, so where the two best tokens are that close the
argmax may flip, and from there the texts legitimately part. To tell such a flip from a
bug, the first differing position is judged by the target run in float32
(`float32_weights`), with d = z32[plain decoding's token] - z32[the other path's token]:

    working dtype float32      rounding iff |d| < NEAR_TIE_TOL (float noise, as before)
    bfloat16 / float16         rounding iff d <= ROUNDING_ULPS * ulp(m), m = the larger
                               |z32| of the two tokens; d <= 0 means float32 ranks them like
                               the other path (plain decoding was the one rounded off)
    otherwise                  bug
    no float32 copy fits       unclassified (never called rounding without evidence)

Where float32 matmuls are themselves rounded (MLX's CUDA backend multiplies float32 in TF32,
11 significant bits: `device.float32_matmul_roundoff`), the reference is only that precise:
ROUNDING_ULPS ulps at TF32's precision are added to the bound (and for a float32 working
dtype they replace NEAR_TIE_TOL when larger), so a float32 run there can round too.

A sampled divergence is judged the same way: every sampled token is the winner of a race,
argmax z / T - log E with noise E fixed by the seed and the position (`mlxspec.sampling`),
so plain decoding and the other path ranked the two tokens by z gap - T (log E[expected] -
log E[got]), and only rounding in z can make them rank differently.

With a quantized KV cache (`mlxspec.kvquant`) float32 is no reference: a key a float ulp
from a rounding boundary of its 4-bit (say) grid lands on either side depending on the pass
that computed it (on the demo about 5 % of the packed key words of a prompt differ between
feeding it whole and token by token, and one position's gap between its two best tokens was
0.35-1.15 logits over chunkings of 1-512 tokens where full precision gave 1.15 for all), so
the target itself, fed in several shapes, is the evidence: rounding iff one of them ranks the
two tokens like the other path, or the shapes alone move their gap by at least its smallest
value (`judge_quantized_kv`).

The working dtype is the least precise float dtype among the model's parameters: bfloat16
or float16 for dequantized weights, and for quantized weights the dtype of their scales
(their activations and embeddings round to it). ROUNDING_ULPS is measured, not guessed:
`scripts/measure_rounding.py` compares the demo target's one-row steps and k+1-row verify
passes with float32 at every position of a greedy decode; see ROUNDING_ULPS.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, List, Optional

import mlx.core as mx

from .device import float32_matmul_roundoff
from .errors import MlxSpecError

NEAR_TIE_TOL = 1e-3  # float32 working dtype: logit (= log-prob) gap below which two tokens tie
SIGNIFICAND_BITS = {mx.bfloat16: 8, mx.float16: 11, mx.float32: 24}
# Largest |(z_a - z_b) - (z32_a - z32_b)| seen for the two best tokens, in ulps of the working
# dtype at their magnitude, over one-row steps and verify passes alike; doubled (see
# scripts/measure_rounding.py and the README's precision section for the figures).
ROUNDING_ULPS = 4.0
FLOAT32_MEMORY_SHARE = 0.5  # a float32 copy may take at most this share of the available memory
PREFILL_STEP = 512  # reference passes longer than this (or windowed) go through a chunked cache
SHAPE_PROBE_STEPS = (PREFILL_STEP, 64, 16, 3)  # a quantized KV cache's judge feeds the context so (`judge_quantized_kv`)
# ...and runs the position as the first row of passes this wide, as a verify pass of k + 1 rows does:
# in bfloat16 the pass's width alone can move a gap of one ulp to zero (then the lower id wins)
SHAPE_PROBE_ROWS = (2, 5, 9)

ROUNDING, BUG, UNCLASSIFIED = "rounding", "bug", "unclassified"


class ReferenceUnavailable(MlxSpecError):
    """A float32 reference pass cannot run here (it would not fit in memory)."""


@dataclass
class Judgement:
    """How one diverging position was classified, with the float32 evidence."""

    kind: str  # "rounding" | "bug" | "unclassified"
    working_dtype: str  # "bfloat16", "float16" or "float32"
    # z32[expected] - z32[got] (less a sampled race's `noise_gap`); <= 0: float32 ranks like `got`
    float32_gap: Optional[float] = None
    # (with a quantized KV cache: that gap in the working dtype, and `bound` how far chunkings moved it)
    logit_magnitude: Optional[float] = None  # max(|z32[expected]|, |z32[got]|)
    bound: Optional[float] = None  # the largest float32 gap rounding can explain here
    reason: str = ""  # one line: why this kind

    def as_dict(self) -> dict:
        return {"divergence": self.kind, "working_dtype": self.working_dtype, "float32_gap": self.float32_gap,
                "logit_magnitude": self.logit_magnitude, "rounding_bound": self.bound, "reason": self.reason}


def working_dtype(model) -> mx.Dtype:
    """The least precise float dtype among the model's parameters (float32 if it has none)."""
    from mlx.utils import tree_flatten

    dtypes = {v.dtype for _, v in tree_flatten(model.parameters()) if v.dtype in SIGNIFICAND_BITS}
    return min(dtypes, key=SIGNIFICAND_BITS.get, default=mx.float32)


def dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def ulp(x: float, dtype: mx.Dtype, *, bits: Optional[int] = None) -> float:
    """One unit in the last place of `dtype` (or of `bits` significant bits) at |x|:
    2 ** (floor(log2 |x|) - (significand bits - 1))."""
    _, e = math.frexp(max(abs(x), 1e-30))  # |x| = f * 2**e with f in [0.5, 1)
    return math.ldexp(1.0, e - (bits or SIGNIFICAND_BITS[dtype]))


def reference_bits() -> int:
    """Significant bits of the float32 reference's matmuls here: 24, or 11 where they run in TF32."""
    return round(-math.log2(float32_matmul_roundoff()))


def rounding_bound(dtype: mx.Dtype, magnitude: float) -> float:
    """The largest float32 gap that rounding in `dtype` (and in the reference) explains at logit `magnitude`."""
    bits = reference_bits()
    noise = ROUNDING_ULPS * ulp(magnitude, dtype, bits=bits) if bits < SIGNIFICAND_BITS[mx.float32] else 0.0
    if dtype == mx.float32:
        return max(NEAR_TIE_TOL, noise)
    return ROUNDING_ULPS * ulp(magnitude, dtype) + noise


def float32_extra_bytes(model) -> int:
    """Bytes a float32 copy of the model's non-float32 float parameters takes (packed weights stay)."""
    from mlx.utils import tree_flatten

    return sum(v.size * 4 for _, v in tree_flatten(model.parameters())
               if v.dtype in SIGNIFICAND_BITS and v.dtype != mx.float32)


def available_memory() -> int:
    """Bytes free for new arrays: MemAvailable on Linux, else physical memory less MLX's active memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    from .loading.precision import physical_memory

    return max(0, physical_memory() - int(mx.get_active_memory()))


@contextmanager
def float32_weights(model, *, max_extra_bytes: Optional[int] = None) -> Iterator[None]:
    """Run `model` with float32 parameters inside the block; restore the originals on exit.

    Float parameters below float32 are replaced by float32 copies (exact: every bfloat16 and
    float16 value is a float32 value); quantized layers keep their packed weights and get
    float32 scales and biases, so they compute in float32 too. On exit, also after an
    exception, the very same original arrays are put back: nothing is rounded twice, and the
    copies' memory is released. Not for use while another thread runs the model.

    Args:
        model: an mlx-lm model (any `nn.Module`).
        max_extra_bytes: the most the float32 copies may take. Default: FLOAT32_MEMORY_SHARE of
            `available_memory()`.

    Raises:
        ReferenceUnavailable: the copies would take more than `max_extra_bytes`.
    """
    from mlx.utils import tree_flatten, tree_unflatten

    extra = float32_extra_bytes(model)
    limit = int(FLOAT32_MEMORY_SHARE * available_memory()) if max_extra_bytes is None else max_extra_bytes
    if extra > limit:
        raise ReferenceUnavailable(f"a float32 copy of the weights needs {extra / 2**20:.0f} MiB, more than the "
                                   f"{limit / 2**20:.0f} MiB allowed")
    originals = [(k, v) for k, v in tree_flatten(model.parameters())
                 if v.dtype in SIGNIFICAND_BITS and v.dtype != mx.float32]
    if not originals:
        yield
        return
    model.update(tree_unflatten([(k, v.astype(mx.float32)) for k, v in originals]))
    try:
        yield
    finally:
        model.update(tree_unflatten(originals))
        mx.clear_cache()  # hand the copies' buffers back now, not at the next timed run


def next_token_logits(model, ids: List[int], *, max_kv_size: Optional[int] = None, kv_quant=None) -> mx.array:
    """Float32 logits (V,) of the token after `ids`, as the model computes them in its own dtypes.

    A context of at most PREFILL_STEP tokens without a window is one cache-free call; a longer
    or windowed one goes through the engine's caches in chunks (the window seen as the engine
    sees it; attention memory bounded), as does one whose KV cache is quantized (`kv_quant`, the
    engine's `mlxspec.kvquant.KVQuant`).
    """
    if max_kv_size is None and kv_quant is None and len(ids) <= PREFILL_STEP:
        return model(mx.array(ids, dtype=mx.uint32)[None])[0, -1].astype(mx.float32)
    from .sequence import Sequence

    seq = Sequence(model, max_kv_size=max_kv_size, headroom=1, prefill_step=PREFILL_STEP, kv_quant=kv_quant)
    seq.prefill(ids[:-1])
    return seq.forward(ids[-1:])[-1].astype(mx.float32)


def judge(model, context: List[int], expected: int, got: int, *, max_kv_size: Optional[int] = None,
          max_extra_bytes: Optional[int] = None, kv_quant=None, noise_gap: float = 0.0) -> Judgement:
    """Classify a greedy divergence after `context`: plain decoding chose `expected`, the other path `got`.

    One float32 pass of the target over `context` (outside any timing). See the module docstring
    for the rule; `max_kv_size` and `kv_quant` are the engine's, `max_extra_bytes` as for `float32_weights`.
    `noise_gap`: a sampled divergence's share of the race (`sampling.race`), T (log E[expected] -
    log E[got]): the race ranks z / T - log E, so the logit gap it compares is z gap - noise_gap,
    and rounding in the logits moves that gap as it moves a greedy one.
    """
    if kv_quant is not None:
        return judge_quantized_kv(model, context, expected, got, kv_quant, noise_gap)
    dtype = working_dtype(model)
    name = dtype_name(dtype)
    try:
        with float32_weights(model, max_extra_bytes=max_extra_bytes):
            z = next_token_logits(model, list(context), max_kv_size=max_kv_size)
            z_e, z_g = float(z[expected]), float(z[got])
    except ReferenceUnavailable as e:
        return Judgement(UNCLASSIFIED, name, reason=f"no float32 reference: {e}")
    gap, magnitude = z_e - z_g - noise_gap, max(abs(z_e), abs(z_g))
    bound = rounding_bound(dtype, magnitude)
    if dtype == mx.float32:
        kind = ROUNDING if abs(gap) < bound else BUG
        why = f"float32 gap {gap:+.2e} {'within' if kind == ROUNDING else 'beyond'} float noise ({bound:g})"
    elif gap <= 0:
        kind, why = ROUNDING, f"float32 ranks them like the speculative path (gap {gap:+.4f})"
    else:
        kind = ROUNDING if gap <= bound else BUG
        units = gap / ulp(magnitude, dtype)
        why = (f"float32 gap {gap:.4f} = {units:.2f} {name} ulp at |logit| {magnitude:.2f}, "
               f"{'within' if kind == ROUNDING else 'beyond'} the rounding bound {bound:.4f}")
    return Judgement(kind, name, gap, magnitude, bound, why)


def judge_quantized_kv(model, context: List[int], expected: int, got: int, kv_quant,
                       noise_gap: float = 0.0) -> Judgement:
    """`judge` for a target whose KV cache is quantized: the gap g = z[expected] - z[got] after
    `context` in the working dtype, with the context fed in chunks of each of SHAPE_PROBE_STEPS and
    then, in chunks of PREFILL_STEP, the position run as the first row of passes of each of
    SHAPE_PROBE_ROWS rows. Rounding iff one of them ranks `got` first (g <= 0), or the shapes alone
    move g by at least its smallest value (max g - min g >= min g); bug otherwise."""
    from .sequence import Sequence

    gaps = []
    shapes = [(step, 1) for step in SHAPE_PROBE_STEPS] + [(PREFILL_STEP, rows) for rows in SHAPE_PROBE_ROWS]
    for step, rows in shapes:
        seq = Sequence(model, max_kv_size=None, headroom=rows, prefill_step=step, kv_quant=kv_quant)
        seq.prefill(list(context[:-1]))
        z = seq.forward(list(context[-1:]) + [got] * (rows - 1))[0].astype(mx.float32)  # rows after it: the width only
        gaps.append(float(z[expected]) - float(z[got]) - noise_gap)
    low, spread = min(gaps), max(gaps) - min(gaps)
    kind = ROUNDING if low <= 0 or spread >= low else BUG
    shown = ", ".join(f"{g:+.4f}" for g in gaps)
    why = (f"quantized KV cache: gap {shown} fed in chunks of {', '.join(map(str, SHAPE_PROBE_STEPS))} tokens, "
           f"then as the first of {', '.join(map(str, SHAPE_PROBE_ROWS))} rows; "
           + ("one shape ranks them like the other path" if low <= 0 else
              f"the shapes move it by {spread:.4f}, {'at least' if kind == ROUNDING else 'less than'} its "
              f"smallest value"))
    return Judgement(kind, dtype_name(working_dtype(model)), gaps[0], None, spread, why)

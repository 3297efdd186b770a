"""Fused speculative verification: one launch decides a round -> int32 [n_accepted, next_token].

Equals `mlxspec.verify.verify_with_uniforms` given the same uniforms (see that module for
the math). One threadgroup:
  1. every thread walks the k draft positions: accept x_i iff u_i * q_i(x_i) < p_i(x_i);
     n = the first rejection (k when all are accepted). Same float32 ops as the reference.
  2. the row to sample is w = max(0, p_n - q_n) (p_k for the bonus token), or p_n when w
     has no mass. Each thread owns a contiguous chunk of the vocabulary: it sums its chunk
     and notes its last positive index.
  3. an exclusive scan of the chunk sums (SIMD prefix sums + one value per SIMD-group)
     gives each chunk its starting cumulative weight; each thread walks its chunk for the
     first positive-weight index whose cumulative weight exceeds u_k * total; the minimum
     over threads, capped at the last positive index, is the token (never in the tail).
The cumulative sums are chunked rather than sequential, so the token can differ from the
reference's only when u_k * total lies within rounding (~1e-6 relative) of a CDF boundary.

The greedy variant takes the target rows (probabilities or logits, any float dtype) and
accepts while the argmax (first index on ties) equals the draft token.
"""

from __future__ import annotations

import mlx.core as mx

from ..verify import verify_greedy as verify_greedy_reference
from ..verify import verify_with_uniforms as verify_with_uniforms_reference
from .common import REDUCE_HEADER, THREAD_IDS, make_kernel, threadgroup_size

__all__ = ["SAMPLE_SPEC", "GREEDY_SPEC", "verify_with_uniforms_reference", "verify_greedy_rows_reference",
           "launch_sample", "launch_greedy"]

SAMPLE_SOURCE = THREAD_IDS + r"""
  const int V = target_shape[1];

  // 1. Acceptance of each draft token, in order; n = first rejection.
  int n = K;
  for (int i = 0; i < K; ++i) {
    const int x = draft_tokens[i];
    const float px = target[size_t(i) * V + x];
    const float qx = draft[size_t(i) * V + x];
    if (!(uniforms[i] * qx < px)) {
      n = i;
      break;
    }
  }
  const device float* p = target + size_t(n) * V;
  const device float* q = draft + size_t(n < K ? n : 0) * V;
  const bool has_q = n < K;

  // 2. Chunk sums and last positive index, for the residual and for p itself.
  const int chunk = (V + ntg - 1) / ntg;
  const int begin = metal::min(tid * chunk, V);
  const int end = metal::min(begin + chunk, V);
  float rsum = 0.0f, psum = 0.0f;
  int rlast = -1, plast = -1;
  for (int i = begin; i < end; ++i) {
    const float pi = p[i];
    const float r = has_q ? metal::max(pi - q[i], 0.0f) : metal::max(pi, 0.0f);
    rsum += r;
    psum += pi;
    rlast = r > 0.0f ? i : rlast;
    plast = pi > 0.0f ? i : plast;
  }
  rlast = tg_max(rlast, si, sg, lane, nsg);
  plast = tg_max(plast, si, sg, lane, nsg);
  const bool use_residual = rlast >= 0;  // the residual has mass
  int last = use_residual ? rlast : plast;
  last = last >= 0 ? last : V - 1;  // an all-zero row: as the reference, V - 1
  const float mine = use_residual ? rsum : psum;

  // 3. Exclusive scan of the chunk sums in thread (= vocabulary) order.
  const float in_simd = simd_prefix_exclusive_sum(mine);
  const float simd_total = simd_sum(mine);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lane == 0) sf[sg] = simd_total;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float before = in_simd;
  float total = 0.0f;
  for (uint s = 0; s < nsg; ++s) {
    before += s < sg ? sf[s] : 0.0f;
    total += sf[s];
  }
  const float target_mass = uniforms[K] * total;

  int found = V;
  float run = before;
  for (int i = begin; i < end; ++i) {
    const float pi = p[i];
    const float w = use_residual ? (has_q ? metal::max(pi - q[i], 0.0f) : metal::max(pi, 0.0f)) : pi;
    run += w;
    if (w > 0.0f && run > target_mass) {
      found = i;
      break;
    }
  }
  found = tg_min(found, si, sg, lane, nsg);
  if (tid == 0) {
    out[0] = n;
    out[1] = metal::min(found, last);
  }
"""

GREEDY_SOURCE = THREAD_IDS + r"""
  const int V = target_shape[1];

  int n = K;
  int next = 0;
  for (int r = 0; r <= K; ++r) {  // uniform: every thread computes the same argmax
    const device T* row = target + size_t(r) * V;
    float best = -INFINITY;
    int best_i = V;
    for (int i = tid; i < V; i += ntg) {
      const float v = static_cast<float>(row[i]);
      if (v > best || best_i == V) {
        best = v;
        best_i = i;
      }
    }
    const int a = tg_argmax(best, best_i, V, sf, si, sg, lane, nsg);
    if (r < K && a == draft_tokens[r]) continue;
    n = r;
    next = a;
    break;
  }
  if (tid == 0) {
    out[0] = n;
    out[1] = next;
  }
"""

SAMPLE_SPEC = dict(
    name="mlxspec_verify_sample",
    input_names=["target", "draft", "draft_tokens", "uniforms"],
    output_names=["out"],
    source=SAMPLE_SOURCE,
    header=REDUCE_HEADER,
)
GREEDY_SPEC = dict(
    name="mlxspec_verify_greedy",
    input_names=["target", "draft_tokens"],
    output_names=["out"],
    source=GREEDY_SOURCE,
    header=REDUCE_HEADER,
)

_sample_kernel = make_kernel(SAMPLE_SPEC)
_greedy_kernel = make_kernel(GREEDY_SPEC)

def launch_sample(kernel, target_probs: mx.array, draft_probs: mx.array, draft_tokens: mx.array,
                  uniforms: mx.array) -> mx.array:
    """Run the sampling kernel (Metal or emulated). Shapes as `verify_with_uniforms`."""
    k = draft_tokens.shape[0]
    V = target_probs.shape[-1]
    if k == 0:  # no draft rows: pass a one-row placeholder the kernel never reads
        draft_probs = mx.zeros((1, V), mx.float32)
        draft_tokens = mx.zeros((1,), mx.int32)
    tg = threadgroup_size(V)
    (out,) = kernel(
        inputs=[target_probs.astype(mx.float32), draft_probs.astype(mx.float32),
                draft_tokens.astype(mx.int32), uniforms.astype(mx.float32)],
        template=[("K", k)],
        grid=(tg, 1, 1),
        threadgroup=(tg, 1, 1),
        output_shapes=[(2,)],
        output_dtypes=[mx.int32],
    )
    return out


def launch_greedy(kernel, target_rows: mx.array, draft_tokens: mx.array) -> mx.array:
    """Run the greedy kernel (Metal or emulated): target rows (k+1, V), draft tokens (k,)."""
    k = draft_tokens.shape[0]
    if target_rows.dtype not in (mx.float16, mx.bfloat16, mx.float32):
        target_rows = target_rows.astype(mx.float32)
    if k == 0:
        draft_tokens = mx.zeros((1,), mx.int32)
    tg = threadgroup_size(target_rows.shape[-1])
    (out,) = kernel(
        inputs=[target_rows, draft_tokens.astype(mx.int32)],
        template=[("T", target_rows.dtype), ("K", k)],
        grid=(tg, 1, 1),
        threadgroup=(tg, 1, 1),
        output_shapes=[(2,)],
        output_dtypes=[mx.int32],
    )
    return out


def verify_greedy_rows_reference(target_rows: mx.array, draft_tokens: mx.array) -> mx.array:
    """Reference for the greedy kernel: argmax of each target row, then `verify_greedy`."""
    return verify_greedy_reference(mx.argmax(target_rows, axis=-1).astype(mx.int32), draft_tokens)


def verify_with_uniforms_metal(target_probs, draft_probs, draft_tokens, uniforms) -> mx.array:
    if _sample_kernel is None:
        raise RuntimeError("[kernels.verify] the Metal kernel is unavailable (no Metal device)")
    return launch_sample(_sample_kernel, target_probs, draft_probs, draft_tokens, uniforms)


def verify_greedy_rows_metal(target_rows, draft_tokens) -> mx.array:
    if _greedy_kernel is None:
        raise RuntimeError("[kernels.verify] the Metal kernel is unavailable (no Metal device)")
    return launch_greedy(_greedy_kernel, target_rows, draft_tokens)

"""What the kernel modules share: Metal reduction helpers and the kernel factory."""

from __future__ import annotations

import mlx.core as mx

# Every kernel body starts with these: its thread's place in the group and in its SIMD-group,
# and the 32-entry scratch the reductions below use.
THREAD_IDS = r"""
  threadgroup float sf[32];
  threadgroup int si[32];

  const int tid = int(thread_index_in_threadgroup);
  const int ntg = int(threads_per_threadgroup.x);
  const uint sg = simdgroup_index_in_threadgroup;
  const uint lane = thread_index_in_simdgroup;
  const uint nsg = simdgroups_per_threadgroup;
"""

# Threadgroup-wide reductions. Every thread of the group gets the result; `scratch` holds
# one partial per SIMD-group (32 entries) and is free again when the helper returns.
# Called with uniform control flow by every thread of the group.
REDUCE_HEADER = r"""
template <typename U>
METAL_FUNC U tg_sum(U v, threadgroup U* scratch, uint sg, uint lane, uint nsg) {
  v = simd_sum(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lane == 0) scratch[sg] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return simd_sum(lane < nsg ? scratch[lane] : U(0));
}

template <typename U>
METAL_FUNC U tg_max(U v, threadgroup U* scratch, uint sg, uint lane, uint nsg) {
  v = simd_max(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lane == 0) scratch[sg] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return simd_max(lane < nsg ? scratch[lane] : scratch[0]);
}

template <typename U>
METAL_FUNC U tg_min(U v, threadgroup U* scratch, uint sg, uint lane, uint nsg) {
  v = simd_min(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lane == 0) scratch[sg] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return simd_min(lane < nsg ? scratch[lane] : scratch[0]);
}

// Index of the largest value, the smallest index among equal maxima (NaNs are never
// the maximum). Threads without elements pass value -INFINITY and index `none`.
METAL_FUNC int tg_argmax(float v, int i, int none, threadgroup float* fs, threadgroup int* is,
                         uint sg, uint lane, uint nsg) {
  float m = tg_max(v, fs, sg, lane, nsg);
  int a = tg_min(v == m ? i : none, is, sg, lane, nsg);
  // All values -inf (or NaN): the first index, as mx.argmax.
  return a == none ? 0 : a;
}
"""


def threadgroup_size(V: int) -> int:
    """Threads per row of V entries: ~8 entries per thread, a multiple of 32, at most 1024."""
    return min(1024, max(32, -(-V // 8 + 31) // 32 * 32))


def make_kernel(spec: dict):
    """`mx.fast.metal_kernel(**spec)` once at import; None where there is no Metal."""
    if not mx.metal.is_available():
        return None
    try:
        return mx.fast.metal_kernel(**spec, compile_options={"math_mode": "safe"})
    except TypeError:  # MLX before compile_options: safe math is its only mode
        return mx.fast.metal_kernel(**spec)

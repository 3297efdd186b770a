"""Fused processed softmax: logits rows -> probabilities after temperature, top-k, top-p, min-p.

One launch for a batch of rows, one threadgroup per row, float32 accumulation. It equals
`mlxspec.sampling.probabilities` (the reference, wrapped below):
  p = softmax((logits - max) / temperature); keep p >= max(t_k, t_p, t_min); renormalise,
where every filter is a *value* threshold, so ties at a threshold are kept:
  t_k   = the k-th largest p (the largest t with #{p >= t} >= k),
  t_p   = the smallest present p whose strictly-larger mass is < top_p,
  t_min = min_p * max(p).
Non-negative floats order like their bit patterns, so t_k and t_p are found by a 16-way
search over the 32-bit pattern: each pass over the row counts (top-k) and sums (top-p) the
entries at or above 15 probe values, shrinking the interval 16x; 8 passes pin the exact
bits, with no sort. Temperature 0 writes the one-hot row at the argmax (first index on ties).
Rows stay in device memory (the output buffer holds p between passes).
"""

from __future__ import annotations

import mlx.core as mx

from ..sampling import SamplingParams
from ..sampling import probabilities as probabilities_reference
from .common import REDUCE_HEADER, THREAD_IDS, make_kernel, threadgroup_size

__all__ = ["SPEC", "probabilities_reference", "probabilities_metal", "launch"]

SOURCE = THREAD_IDS + r"""
  constexpr int P = 15;  // probes per search pass: 4 bits of the threshold per pass
  threadgroup float pmass[P * 32];
  threadgroup uint pcount[P * 32];

  const uint row = threadgroup_position_in_grid.y;
  const int V = logits_shape[1];
  const device T* x = logits + size_t(row) * V;
  device float* y = out + size_t(row) * V;

  const float temperature = params[0];
  const float top_p = params[1];
  const int top_k = int(params[2]);
  const float min_p = params[3];

  if (temperature == 0.0f) {
    // Greedy: one-hot at the argmax.
    float best = -INFINITY;
    int best_i = V;
    for (int i = tid; i < V; i += ntg) {
      float v = static_cast<float>(x[i]);
      if (v > best || best_i == V) {
        best = v;
        best_i = i;
      }
    }
    int a = tg_argmax(best, best_i, V, sf, si, sg, lane, nsg);
    for (int i = tid; i < V; i += ntg) {
      y[i] = i == a ? 1.0f : 0.0f;
    }
    return;
  }

  // Pass 1: the maximum logit. Subtracted before dividing (as the reference does), so a tiny
  // temperature sends the others to -inf instead of every logit to inf and the row to NaN.
  float m = -INFINITY;
  for (int i = tid; i < V; i += ntg) {
    m = metal::max(m, static_cast<float>(x[i]));
  }
  m = tg_max(m, sf, sg, lane, nsg);

  // Pass 2: e = exp((x - max) / temperature) (exactly 0 for masked -inf logits in safe math) and its sum.
  float s = 0.0f;
  for (int i = tid; i < V; i += ntg) {
    float e = metal::exp((static_cast<float>(x[i]) - m) / temperature);
    y[i] = e;
    s += e;
  }
  const float inv = 1.0f / tg_sum(s, sf, sg, lane, nsg);

  // Pass 3: p = e / sum, its maximum and total mass.
  float pmax = 0.0f;
  float total = 0.0f;
  for (int i = tid; i < V; i += ntg) {
    float p = y[i] * inv;
    y[i] = p;
    pmax = metal::max(pmax, p);
    total += p;
  }
  pmax = tg_max(pmax, sf, sg, lane, nsg);
  total = tg_sum(total, sf, sg, lane, nsg);

  const bool use_k = top_k > 0 && top_k < V;
  const bool use_p = top_p < 1.0f;
  const bool use_min = min_p > 0.0f;
  if (!(use_k || use_p || use_min)) {
    return;
  }

  // Thresholds as bit patterns of non-negative floats: keep p iff bits(p) >= thr.
  uint thr = 0;
  if (use_min) {
    thr = as_type<uint>(min_p * pmax);
  }
  // top-k: largest b with #{bits >= b} >= k.   Invariant: count(klo) >= k > count(khi).
  // top-p: smallest c with H(c) = mass{bits >= c} < top_p; then keep bits >= c - 1.
  //        Invariant: H(plo) >= top_p > H(phi). If H(0) < top_p everything is kept.
  const uint top = as_type<uint>(pmax) + 1;
  uint klo = 0, khi = use_k ? top : 1;
  uint plo = 0, phi = (use_p && total >= top_p) ? top : 1;
  while (khi - klo > 1 || phi - plo > 1) {
    const bool search_k = khi - klo > 1;
    const bool search_p = phi - plo > 1;
    const uint kstep = (khi - klo + P) / (P + 1);
    const uint pstep = (phi - plo + P) / (P + 1);
    uint cnt[P];
    float mass[P];
    for (int j = 0; j < P; ++j) {
      cnt[j] = 0;
      mass[j] = 0.0f;
    }
    for (int i = tid; i < V; i += ntg) {
      const float p = y[i];
      const uint b = as_type<uint>(p);
      for (int j = 0; j < P; ++j) {
        cnt[j] += b >= klo + uint(j + 1) * kstep ? 1u : 0u;
        mass[j] += b >= plo + uint(j + 1) * pstep ? p : 0.0f;
      }
    }
    // Reduce the 2P partials over the group (uniform branches: same values everywhere).
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int j = 0; j < P; ++j) {
      if (search_k) {
        uint c = simd_sum(cnt[j]);
        if (lane == 0) pcount[j * 32 + sg] = c;
      }
      if (search_p) {
        float a = simd_sum(mass[j]);
        if (lane == 0) pmass[j * 32 + sg] = a;
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int j = 0; j < P; ++j) {
      if (search_k) cnt[j] = simd_sum(lane < nsg ? pcount[j * 32 + lane] : 0u);
      if (search_p) mass[j] = simd_sum(lane < nsg ? pmass[j * 32 + lane] : 0.0f);
    }
    const uint kbase = klo, pbase = plo;
    for (int j = 0; j < P && search_k; ++j) {
      const uint probe = kbase + uint(j + 1) * kstep;
      if (probe >= khi) break;
      if (cnt[j] >= uint(top_k)) {
        klo = probe;
      } else {
        khi = probe;
        break;
      }
    }
    for (int j = 0; j < P && search_p; ++j) {
      const uint probe = pbase + uint(j + 1) * pstep;
      if (probe >= phi) break;
      if (mass[j] < top_p) {
        phi = probe;
        break;
      } else {
        plo = probe;
      }
    }
  }
  if (use_k) thr = metal::max(thr, klo);
  if (use_p && total >= top_p) thr = metal::max(thr, phi - 1);

  // Renormalise the kept entries; masked entries are exactly 0.
  float kept = 0.0f;
  for (int i = tid; i < V; i += ntg) {
    const float p = y[i];
    kept += as_type<uint>(p) >= thr ? p : 0.0f;
  }
  kept = tg_sum(kept, sf, sg, lane, nsg);
  for (int i = tid; i < V; i += ntg) {
    const float p = y[i];
    y[i] = as_type<uint>(p) >= thr ? p / kept : 0.0f;
  }
"""

SPEC = dict(
    name="mlxspec_processed_softmax",
    input_names=["logits", "params"],
    output_names=["out"],
    source=SOURCE,
    header=REDUCE_HEADER,
)

_kernel = make_kernel(SPEC)


def launch(kernel, logits: mx.array, params: SamplingParams) -> mx.array:
    """Run `kernel` (the Metal kernel or an emulated one) on rows of logits (..., V)."""
    shape = logits.shape
    V = shape[-1]
    rows = logits.reshape(-1, V)
    if rows.dtype not in (mx.float16, mx.bfloat16, mx.float32):
        rows = rows.astype(mx.float32)
    p = mx.array([params.temperature, params.top_p, float(params.top_k), params.min_p], dtype=mx.float32)
    tg = threadgroup_size(V)
    (out,) = kernel(
        inputs=[rows, p],
        template=[("T", rows.dtype)],
        grid=(tg, rows.shape[0], 1),
        threadgroup=(tg, 1, 1),
        output_shapes=[rows.shape],
        output_dtypes=[mx.float32],
    )
    return out.reshape(shape)


def probabilities_metal(logits: mx.array, params: SamplingParams) -> mx.array:
    """The fused kernel; raises RuntimeError where Metal is unavailable."""
    if _kernel is None:
        raise RuntimeError("[kernels.softmax] the Metal kernel is unavailable (no Metal device)")
    return launch(_kernel, logits, params)

#!/usr/bin/env python
"""Run the fused kernels against the pure-MLX references and time them.

On a Mac (Metal): the real kernels, with µs per call for kernel and reference and the speedup.
With --emulate (any machine): the same comparisons through the CPU harness
(`mlxspec.kernels.emulator`); the timing columns then show emulated time (not GPU time).

    python scripts/verify_metal.py --emulate --vocab 8193 --k 5 --seed 7

Exit status 0 only when every comparison agrees; the last line says how many did.
"""

from __future__ import annotations

import argparse
import sys
import time

from pathlib import Path

import mlxspec  # noqa: F401  (first: it picks MLX's CPU BLAS before mlx.core binds one, see mlxspec/blas.py)
import mlx.core as mx
import numpy as np

try:
    import mlxspec  # noqa: F401  (installed)
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mlxspec.kernels import compare, softmax, verify  # noqa: E402


def _time(fn, repeats: int) -> float:
    """Median µs per call of fn() including evaluation."""
    mx.eval(fn())
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        mx.eval(fn())
        samples.append(time.perf_counter() - t)
    return float(np.median(samples)) * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--emulate", action="store_true", help="run the kernel sources on the CPU harness (no Metal needed)")
    ap.add_argument("--vocab", type=int, default=32000, help="vocabulary size V (default 32000)")
    ap.add_argument("--k", type=int, default=4, help="draft tokens per round (default 4)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--trials", type=int, default=1, help="independent rounds of cases (default 1)")
    ap.add_argument("--repeats", type=int, default=50, help="timed calls per measurement on Metal (default 50)")
    args = ap.parse_args(argv)
    if args.vocab < 1 or args.k < 0 or args.trials < 1:
        ap.error("--vocab must be >= 1, --k >= 0, --trials >= 1")

    if args.emulate:
        from mlxspec.kernels.emulator import EmulatedKernel

        kernels = {name: EmulatedKernel(**spec) for name, spec in
                   (("softmax", softmax.SPEC), ("sample", verify.SAMPLE_SPEC), ("greedy", verify.GREEDY_SPEC))}
        backend = "emulated (CPU harness; times are emulation, not GPU)"
    else:
        if not mx.metal.is_available():
            print("Metal is not available here; use --emulate to run the kernel sources on the CPU harness.",
                  file=sys.stderr)
            return 2
        mx.set_default_device(mx.gpu)
        kernels = {"softmax": softmax._kernel, "sample": verify._sample_kernel, "greedy": verify._greedy_kernel}
        backend = f"metal ({mx.metal.device_info().get('device_name', 'GPU')})"
    print(f"backend: {backend}; V={args.vocab} k={args.k} seed={args.seed} trials={args.trials}", flush=True)
    header = f"{'kernel':8} {'case':24} {'shape':>14} {'max err':>9} {'agree':>6} {'kernel µs':>10} {'ref µs':>9} {'speedup':>7}"
    print(header)
    print("-" * len(header), flush=True)

    agreed = total = 0

    def row(kind, case, shape, verdict, run_kernel, run_ref):
        nonlocal agreed, total
        if args.emulate:
            t = time.perf_counter()
            mx.eval(run_kernel())
            tk, tr, speed = f"{(time.perf_counter() - t) * 1e6:.0f}*", "n/a", "n/a"
        else:
            a, b = _time(run_kernel, args.repeats), _time(run_ref, args.repeats)
            tk, tr, speed = f"{a:.1f}", f"{b:.1f}", f"{b / a:.2f}x"
        total += 1
        agreed += verdict.ok
        flag = "yes" if verdict.ok else "NO"
        if verdict.ok and verdict.excused:
            flag = f"yes~{verdict.excused}"
        print(f"{kind:8} {case[:24]:24} {shape:>14} {verdict.max_error:9.2e} {flag:>6} {tk:>10} {tr:>9} {speed:>7}", flush=True)
        if not verdict.ok or verdict.detail:
            print(f"         {verdict.detail}", flush=True)

    V, k = args.vocab, args.k
    for trial in range(args.trials):
        rng = np.random.default_rng(args.seed + trial)
        for case, logits, params in compare.softmax_cases(V, rng):
            out = softmax.launch(kernels["softmax"], logits, params)
            p = params
            name = f"{case} t={p.temperature:g} k={p.top_k} p={p.top_p:g} m={p.min_p:g}"
            row("softmax", name, "x".join(map(str, logits.shape)), compare.compare_probabilities(out, logits, params),
                lambda: softmax.launch(kernels["softmax"], logits, params),
                lambda: softmax.probabilities_reference(logits, params))
        for case, p, q, x, u in compare.verify_cases(V, k, rng):
            p, q, x, u = map(mx.array, (p, q, x, u))
            out = verify.launch_sample(kernels["sample"], p, q, x, u)
            row("verify", case, f"{k + 1}x{V}", compare.compare_verify(out, p, q, x, u),
                lambda: verify.launch_sample(kernels["sample"], p, q, x, u),
                lambda: verify.verify_with_uniforms_reference(p, q, x, u))
        for case, rows, x in compare.greedy_cases(V, k, rng):
            x = mx.array(x)
            out = verify.launch_greedy(kernels["greedy"], rows, x)
            ref = verify.verify_greedy_rows_reference(rows, x)
            ok = out.tolist() == ref.tolist()
            row("greedy", f"{case}/{str(rows.dtype).split('.')[-1]}", f"{k + 1}x{V}",
                compare.Verdict(ok, detail="" if ok else f"{out.tolist()} != reference {ref.tolist()}"),
                lambda: verify.launch_greedy(kernels["greedy"], rows, x),
                lambda: verify.verify_greedy_rows_reference(rows, x))
    if args.emulate:
        print("* emulated wall time on the CPU harness, not GPU time")
    print(f"{agreed}/{total} comparisons agreed")
    return 0 if agreed == total else 1


if __name__ == "__main__":
    sys.exit(main())

"""How far low-precision logits stray from float32: the measurement behind `ROUNDING_ULPS`.

    python scripts/measure_rounding.py                    # demo target, bfloat16 and quantized
    python scripts/measure_rounding.py --prompts 12 --tokens 64 --ks 1,3,7 --dtypes bfloat16
    python scripts/measure_rounding.py --max-kv-size 64       # through a sliding window

For each prompt of the builtin suite (stratified over categories) the target decodes
greedily with one-row steps (plain decoding), then the same tokens are fed again in verify
passes of k+1 rows (every draft accepted), and once more in float32 (`float32_weights`).
At every generated position, for the two best tokens a, b (by float32, by the step and by
the verify pass: every pair a divergence could involve) it takes the gap error

    |(z[a] - z[b]) - (z32[a] - z32[b])|  in ulps of the working dtype at max |z32[a]|, |z32[b]|

A correct speculative path can only flip a pair whose float32 gap is below its own gap
error, so the largest error seen bounds the float32 gap of a rounding divergence. Also
printed: the verify-vs-step gap error (what reorders between the two paths) and the
argmax flips seen. Prints one Markdown table row per (dtype, path).
"""

from __future__ import annotations

import argparse

import mlxspec  # noqa: F401  (first: it picks MLX's CPU BLAS before mlx.core binds one, see mlxspec/blas.py)
import mlx.core as mx

from mlxspec.bench.prompts import builtin_suite, stratified
from mlxspec.loading import load_model
from mlxspec.modelmeta import logit_width
from mlxspec.prompts import encode_prompt
from mlxspec.reference import dtype_name, float32_weights, ulp, working_dtype
from mlxspec.sequence import Sequence


def rows_in_chunks(model, ids, gen, size, window):
    """Logits predicting each token of `gen`, fed after the prompt in chunks of `size` rows."""
    seq = Sequence(model, max_kv_size=window, headroom=size)
    seq.prefill(ids[:-1])
    feed = [ids[-1]] + gen[:-1]
    out = []
    for i in range(0, len(feed), size):
        out.append(seq.forward(feed[i:i + size]).astype(mx.float32))
        mx.eval(out[-1])
    return mx.concatenate(out)  # (T, V)


def greedy_steps(model, ids, n, window):
    """Plain greedy decoding with one-row steps: (tokens, their logits rows (T, V))."""
    seq = Sequence(model, max_kv_size=window, headroom=1)
    seq.prefill(ids[:-1])
    tok, toks, rows = ids[-1], [], []
    for _ in range(n):
        z = seq.forward([tok])[-1].astype(mx.float32)
        tok = int(mx.argmax(z).item())
        toks.append(tok)
        rows.append(z)
    return toks, mx.stack(rows)


def top2(z):
    idx = mx.argsort(-z, axis=-1)[:, :2]
    return idx.tolist()


def gap_errors(z, z32, pairs, dtype):
    """Per position: the largest |gap_z - gap_z32| over `pairs[t]`, in ulps of `dtype`."""
    out = []
    zl, z32l = z, z32
    for t, plist in enumerate(pairs):
        worst = 0.0
        for a, b in plist:
            za, zb = float(zl[t, a]), float(zl[t, b])
            ra, rb = float(z32l[t, a]), float(z32l[t, b])
            unit = ulp(max(abs(ra), abs(rb)), dtype)
            worst = max(worst, abs((za - zb) - (ra - rb)) / unit)
        out.append(worst)
    return out


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo", help="model reference (default: demo)")
    ap.add_argument("--dtypes", default="bfloat16,quantized", help="load precisions (default: bfloat16,quantized)")
    ap.add_argument("--prompts", type=int, default=6, help="builtin prompts, stratified (default: 6)")
    ap.add_argument("--tokens", type=int, default=48, help="greedy tokens per prompt (default: 48)")
    ap.add_argument("--ks", default="1,3,7", help="draft lengths k: verify passes of k+1 rows (default: 1,3,7)")
    ap.add_argument("--max-kv-size", type=int, default=None, help="KV window, as the engine's (default: none)")
    args = ap.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    prompts = stratified(builtin_suite(), args.prompts)
    print("| dtype | path | positions | gap error p50 / p99 / max (ulp) | argmax flips vs step | "
          "flips: float32 gap (ulp) |")
    print("|---|---|---|---|---|---|")
    for choice in args.dtypes.split(","):
        model, tok, _ = load_model(args.model, dtype=choice)
        wd = working_dtype(model)
        errors = {p: [] for p in ["step", *(f"verify k={k}" for k in ks), *(f"verify-vs-step k={k}" for k in ks)]}
        flips = {p: [] for p in errors}
        for p in prompts:
            ids = encode_prompt(p.messages(), tok, logit_width(model))
            w = args.max_kv_size
            gen, z_step = greedy_steps(model, ids, args.tokens, w)
            with float32_weights(model):
                z32 = rows_in_chunks(model, ids, gen, len(gen), w)
            paths = {"step": z_step, **{f"verify k={k}": rows_in_chunks(model, ids, gen, k + 1, w) for k in ks}}
            pairs = [set() for _ in gen]
            for z in (z32, *paths.values()):
                for t, (a, b) in enumerate(top2(z)):
                    pairs[t].add((min(a, b), max(a, b)))
            for name, z in paths.items():
                errors[name] += gap_errors(z, z32, pairs, wd)
                if name != "step":
                    errors[f"verify-vs-step {name[7:]}"] += gap_errors(z, z_step, pairs, wd)
                    am, am_step = mx.argmax(z, -1).tolist(), mx.argmax(z_step, -1).tolist()
                    for t, (x, y) in enumerate(zip(am, am_step)):
                        if x != y:  # the step's token y, the verify pass's x
                            d = float(z32[t, y]) - float(z32[t, x])
                            flips[name].append(d / ulp(max(abs(float(z32[t, y])), abs(float(z32[t, x]))), wd))
        label = f"{choice} ({dtype_name(wd)})" + (f", window {args.max_kv_size}" if args.max_kv_size else "")
        for name, xs in errors.items():
            f = flips.get(name) or []
            shown = ", ".join(f"{d:+.2f}" for d in f) or "-"
            print(f"| {label} | {name} | {len(xs)} | {quantile(xs, 0.5):.2f} / {quantile(xs, 0.99):.2f} / "
                  f"{max(xs):.2f} | {len(f) if not name.startswith('verify-vs') else '-'} | {shown} |", flush=True)


if __name__ == "__main__":
    main()

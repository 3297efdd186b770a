"""Forward cost of a model per load precision: 1 and 5 new tokens after a KV prefix.

    python scripts/measure_precision.py              # the demo target, every precision
    python scripts/measure_precision.py --model PATH --prefix 256 --repeats 20

Each timing is one `model(tokens, cache=cache)` call forced with `mx.eval`, measured with
`time.perf_counter`; the cache is trimmed back after every call so each repeat sees the
same prefix, and precisions take turns within each repeat so a drifting machine load hits
them alike. Prints the median of the repeats (after warm-up) as a Markdown table. The
figures chose the CPU default in `mlxspec/loading/precision.py`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlxspec  # noqa: F401  (first: it picks MLX's CPU BLAS before mlx.core binds one, see mlxspec/blas.py)
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxspec.loading import load_model
from mlxspec.device import backend


class Bench:
    """One model with a `prefix`-token KV cache; `step(new)` times one forward of `new` tokens."""

    def __init__(self, model, prefix: int):
        self.model = model
        self.cache = make_prompt_cache(model)
        mx.eval(model(mx.arange(100, 100 + prefix)[None], cache=self.cache))

    def step(self, new: int) -> float:
        tokens = mx.arange(200, 200 + new)[None]
        start = time.perf_counter()
        mx.eval(self.model(tokens, cache=self.cache))
        elapsed = time.perf_counter() - start
        for c in self.cache:
            c.trim(new)  # back to the prefix, so every repeat sees the same context
        return elapsed * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo", help="model reference (default: demo)")
    ap.add_argument("--prefix", type=int, default=128, help="KV prefix length, tokens (default: 128)")
    ap.add_argument("--repeats", type=int, default=15, help="timed repeats per cell (default: 15)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed repeats first (default: 3)")
    ap.add_argument("--dtypes", default="quantized,bfloat16,float16,float32")
    args = ap.parse_args()
    benches, infos = {}, {}
    for dtype in args.dtypes.split(","):
        model, _, infos[dtype] = load_model(args.model, dtype=dtype)
        benches[dtype] = Bench(model, args.prefix)
    # Interleave precisions within each repeat, so drifting machine load hits all alike.
    times = {(d, n): [] for d in benches for n in (1, 5)}
    for i in range(args.warmup + args.repeats):
        for d, bench in benches.items():
            for n in (1, 5):
                ms = bench.step(n)
                if i >= args.warmup:
                    times[d, n].append(ms)
    print(f"backend: {backend()}, model: {args.model}, prefix: {args.prefix} tokens, "
          f"median of {args.repeats} interleaved repeats\n")
    print("| precision | weights MB | 1 token ms | 5 tokens ms | 5 / 1 |")
    print("|---|---|---|---|---|")
    for d in benches:
        one, five = statistics.median(times[d, 1]), statistics.median(times[d, 5])
        print(f"| {d} | {infos[d].weights_bytes / 1e6:.0f} | {one:.1f} | {five:.1f} | {five / one:.2f} |")


if __name__ == "__main__":
    main()

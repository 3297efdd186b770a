"""Measure the shipped draft against the demo target with MLX.

    python scripts/eval_draft.py [--gguf PATH] [--suite held-out|bench|FILE.jsonl] [--prompts 32] [--max-tokens 64] [--k 4]

Greedy: runs real greedy speculative decoding on held-out chat prompts (the draft proposes k
tokens, the target verifies them in one pass, the caches roll back), so the target's
continuation is exact and every round is counted:
    acceptance      = accepted / drafted
    tokens per pass = mean over rounds of (accepted + 1)
T = 0.7: at every position of that path both models' distributions p (target) and q (draft)
were computed in the right context; per position it reports, exactly (no sampling noise),
    rejection sampling   E_{x~q}[min(1, p(x)/q(x))] = sum_x min(p, q)
    token matching       P(x_p == x_q), x_p ~ p, x_q ~ q independent = sum_x p * q
Step time: one token after a prefix, median of many, for each model; the draft both as
shipped (quantized) and dequantized to bf16 (MLX's CPU backend has slow quantized kernels).
--dequantize-draft runs the acceptance part with the dequantized draft: the same weights,
only faster where quantized matmuls are slow.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import mlxspec  # noqa: F401  (first: it picks MLX's CPU BLAS before mlx.core binds one, see mlxspec/blas.py)
import mlx.core as mx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]
from mlxspec.training.draft_prompts import SUITE_HELP, chat_ids, eval_suite  # noqa: E402
from mlxspec.loading import demo  # noqa: E402

DRAFT = ROOT / "mlxspec" / "data" / "smollm2-draft"


def load_pair(gguf, draft_dir):
    """(bf16 target from the GGUF, the draft, the draft's tokenizer)."""
    from mlx_lm import load
    from smollm2_mlx import load_target

    draft, tokenizer = load(str(draft_dir))
    return load_target(gguf), draft, tokenizer


def speculative_greedy(target, draft, prompt, *, k: int, max_tokens: int, eos: int, temperature: float):
    """Greedy speculative decoding; returns (tokens, per-round accepted counts, drafted counts, T-stats)."""
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    tc, dc = make_prompt_cache(target), make_prompt_cache(draft)
    mx.eval(target(mx.array([prompt[:-1]]), cache=tc), draft(mx.array([prompt[:-1]]), cache=dc))
    pend_t, pend_d = [prompt[-1]], [prompt[-1]]  # tokens not yet in each cache
    out, accepted, drafted, rej, match = [], [], [], [], []
    while len(out) < max_tokens:
        kk = min(k, max_tokens - len(out))
        x, props, dlogits = pend_d, [], []
        for _ in range(kk):
            logits = draft(mx.array([x]), cache=dc)[0, -1]
            t = int(mx.argmax(logits))
            props.append(t)
            dlogits.append(logits)
            x = [t]
        trim_prompt_cache(dc, len(pend_d) + kk - 1)  # back to before pend_d
        tl = target(mx.array([pend_t + props]), cache=tc)[0, len(pend_t) - 1:]  # (kk + 1, V)
        best = mx.argmax(tl, axis=-1).tolist()
        a = 0
        while a < kk and props[a] == best[a]:
            a += 1
        # Positions 0..min(a, kk-1) of this round had both distributions in the right context.
        for j in range(min(a + 1, kk)):
            p = mx.softmax(tl[j].astype(mx.float32) / temperature)
            q = mx.softmax(dlogits[j].astype(mx.float32) / temperature)
            rej.append(mx.minimum(p, q).sum().item())
            match.append((p * q).sum().item())
        trim_prompt_cache(tc, kk - a)
        new = props[:a] + [best[a]]
        accepted.append(a)
        drafted.append(kk)
        pend_t = [best[a]]
        pend_d = pend_d + new
        out += new
        if eos in new:
            out = out[: out.index(eos) + 1]
            break
    return out[:max_tokens], accepted, drafted, rej, match


def step_time(model, prefix, reps: int) -> float:
    """Median seconds for one token after `prefix` (the cache is rolled back after each)."""
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([prefix]), cache=cache))
    times = []
    for i in range(reps + 2):
        t0 = time.perf_counter()
        mx.eval(model(mx.array([[prefix[-1]]]), cache=cache))
        times.append(time.perf_counter() - t0)
        trim_prompt_cache(cache, 1)
    return statistics.median(times[2:])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", help="target GGUF (default: the demo GGUF in the mlxspec cache)")
    p.add_argument("--draft", default=str(DRAFT), help="draft folder (default: the shipped one)")
    p.add_argument("--seed", type=int, default=0, help="prompt seed used by train_draft.py")
    p.add_argument("--held-out", type=int, default=32, help="held-out prompts in train_draft.py")
    p.add_argument("--suite", default="held-out", metavar="held-out|bench|FILE.jsonl", help=SUITE_HELP)
    p.add_argument("--prompts", type=int, default=32, help="prompts of the suite to decode")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--reps", type=int, default=30, help="timed steps per model")
    p.add_argument("--dequantize-draft", action="store_true", help="acceptance with the dequantized draft")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    from mlx_lm import load
    from mlx_lm.utils import dequantize_model

    mx.random.seed(args.seed)
    if args.gguf is None:
        if not demo.is_cached():
            sys.exit("no demo GGUF in the mlxspec cache: run `mlxspec pull demo` or pass --gguf")
        args.gguf = demo.gguf_path()
    target, draft_shipped, tok = load_pair(args.gguf, args.draft)
    draft_bf16 = dequantize_model(load(args.draft)[0])
    draft_bf16.set_dtype(mx.bfloat16)
    draft = draft_bf16 if args.dequantize_draft else draft_shipped
    eos = tok.eos_token_id
    held = eval_suite(args.suite, args.held_out, args.seed)
    acc = drf = 0
    rounds, rej, match, per_prompt = [], [], [], []
    t0 = time.time()
    for i, ex in enumerate(held[: args.prompts]):
        ids = chat_ids(tok, ex["prompt"])
        out, a, d, r, m = speculative_greedy(target, draft, ids, k=args.k, max_tokens=args.max_tokens, eos=eos,
                                             temperature=args.temperature)
        acc, drf = acc + sum(a), drf + sum(d)
        rounds += [x + 1 for x in a]
        rej += r
        match += m
        per_prompt.append({"kind": ex["kind"], "acceptance": sum(a) / sum(d), "tokens": len(out)})
        print(f"[{i + 1}/{args.prompts}] {ex['kind']:8s} acceptance {sum(a) / sum(d):.2f} "
              f"running {acc / drf:.3f} ({time.time() - t0:.0f}s)", flush=True)
    prefix = chat_ids(tok, held[0]["prompt"])
    t_target = step_time(target, prefix, args.reps)
    t_draft = step_time(draft_shipped, prefix, args.reps * 3)
    t_draft_bf16 = step_time(draft_bf16, prefix, args.reps * 3)
    res = {
        "suite": args.suite, "prompts": len(per_prompt), "max_tokens": args.max_tokens, "k": args.k,
        "draft_for_acceptance": "dequantized bf16" if args.dequantize_draft else "as shipped", "rounds": len(rounds), "drafted": drf,
        "acceptance": acc / drf, "tokens_per_target_pass": sum(rounds) / len(rounds),
        "target_step_ms": 1e3 * t_target, "draft_step_ms": 1e3 * t_draft, "draft_over_target": t_draft / t_target,
        "draft_bf16_step_ms": 1e3 * t_draft_bf16, "draft_bf16_over_target": t_draft_bf16 / t_target,
        "temperature": args.temperature, "positions": len(rej),
        "acceptance_rejection_sampling": sum(rej) / len(rej), "acceptance_token_matching": sum(match) / len(match),
        "per_kind": {},
    }
    for kind in sorted({x["kind"] for x in per_prompt}):
        vals = [x["acceptance"] for x in per_prompt if x["kind"] == kind]
        res["per_kind"][kind] = sum(vals) / len(vals)
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""What does the server cost? Streamed tokens/s through `mlxspec serve` vs `Engine.stream`, side by side.

    python scripts/bench_serve.py [--pair demo] [--max-tokens 64] [--limit 8] [--repeats 3]
    python scripts/bench_serve.py --pair tiny          # a tiny random pair: per-token overhead magnified
    python scripts/bench_serve.py --api ollama         # through Ollama's /api/chat (JSON lines) instead

The server runs as users run it: `mlxspec serve` in its own process, on loopback. This
process loads the same pair and calls `Engine.stream` directly. For each prompt of the
bench suite, both sides generate the same greedy answer (default drafter, automatic draft
length), one after the other, the order alternating; each side sees the same sequence of
prompts, so both reuse their caches alike. Both engines are warmed up (`Engine.warmup()`, which
the server runs at start), then both sides run every prompt once untimed.

Measured per run, wall clock on the client side:
  streamed tok/s = completion tokens / (request sent -> `data: [DONE]` read, or Ollama's last
                   line), for the server
                   completion tokens / (stream() called -> last event), for the engine
and the engine's own tokens/s inside each (GenerationStats.tokens_per_second). Prints the
per-prompt medians and the ratio server / engine (the target is >= 0.97).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _tiny_pair import load

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="demo", help="a pair name, or 'tiny' for the tiny pair built in code (default: demo)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per answer (default: 64)")
    ap.add_argument("--limit", type=int, default=8, help="prompts from the bench suite (default: 8)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per prompt and side (default: 3)")
    ap.add_argument("--num-draft", default=None, help="fixed draft length on both sides, or 0 for plain decoding "
                    "(default: auto; a fixed length keeps the two cost models from choosing differently)")
    ap.add_argument("--api", choices=("openai", "ollama"), default="openai",
                    help="the server's route: /v1/chat/completions (SSE) or Ollama's /api/chat (JSON lines)")
    ap.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    ap.add_argument("--serve-tiny", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the tiny server process
    args = ap.parse_args()
    if args.serve_tiny:
        serve_tiny(args.serve_tiny)
        return

    import httpx

    from mlxspec.bench.prompts import builtin_suite, select

    prompts = [p.messages() for p in select(builtin_suite(), full=False, limit=args.limit)]
    port = args.port or free_port()
    server = start_server(args.pair, port)
    try:
        name, engine = load(None if args.pair == "tiny" else args.pair)
        engine.warmup()  # as the server does at start: compiled shapes, a seeded cost model
        url = f"http://127.0.0.1:{port}" + ("/api/chat" if args.api == "ollama" else "/v1/chat/completions")
        through_server = through_ollama if args.api == "ollama" else through_openai
        with httpx.Client(timeout=600) as http:
            extra = request_extra(args.num_draft)
            for messages in prompts:  # warm-up: first-use allocation on both sides
                through_server(http, url, messages, 8, extra)
                direct(engine, messages, 8, extra)
            runs = {"server": [], "engine": []}
            for r in range(args.repeats):
                for i, messages in enumerate(prompts):
                    sides = ["server", "engine"] if (r + i) % 2 == 0 else ["engine", "server"]
                    for side in sides:
                        run = (through_server(http, url, messages, args.max_tokens, extra) if side == "server"
                               else direct(engine, messages, args.max_tokens, extra))
                        runs[side].append((i, run))
                        print(f"  repeat {r} prompt {i} {side}: {run['tokens']} tokens, {run['tps']:.1f} tok/s",
                              file=sys.stderr, flush=True)
    finally:
        server.terminate()
        server.wait(30)
    report(name, engine, runs, prompts, args)


def request_extra(num_draft) -> dict:
    """The request fields (and Engine.stream keywords) that --num-draft stands for."""
    if num_draft is None:
        return {}
    return {"speculative": False} if num_draft == "0" else {"num_draft": int(num_draft)}


def through_openai(http, url: str, messages, max_tokens: int, extra: dict) -> dict:
    body = {"messages": messages, "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True},
            **extra}
    t0 = time.perf_counter()
    last, pieces = None, []
    with http.stream("POST", url, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                last = json.loads(line[len("data: "):])
                if last["choices"]:
                    pieces.append(last["choices"][0]["delta"].get("content") or "")
    wall = time.perf_counter() - t0
    tokens = last["usage"]["completion_tokens"]
    return {"tokens": tokens, "tps": tokens / wall, "engine_tps": last["mlxspec"]["tokens_per_second"],
            "text": "".join(pieces)}


def through_ollama(http, url: str, messages, max_tokens: int, extra: dict) -> dict:
    body = {"messages": messages, "options": {"num_predict": max_tokens}, **extra}  # (streamed: Ollama's default)
    t0 = time.perf_counter()
    last, pieces = None, []
    with http.stream("POST", url, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            last = json.loads(line)
            pieces.append(last["message"]["content"])
    wall = time.perf_counter() - t0
    tokens = last["eval_count"]
    return {"tokens": tokens, "tps": tokens / wall, "engine_tps": last["mlxspec"]["tokens_per_second"],
            "text": "".join(pieces)}


def direct(engine, messages, max_tokens: int, extra: dict) -> dict:
    t0 = time.perf_counter()
    n, stats, pieces = 0, None, []
    for ev in engine.stream(messages, max_tokens=max_tokens, **extra):
        n, stats = n + 1, ev.stats
        pieces.append(ev.text)
    wall = time.perf_counter() - t0
    return {"tokens": n, "tps": n / wall, "engine_tps": stats.tokens_per_second, "text": "".join(pieces)}


def report(name, engine, runs, prompts, args) -> None:
    """Per prompt, medians of both sides: streamed tok/s (what a client sees) and the engine's own tok/s
    (what the engine did, so a difference between the engines' choices shows apart from the server's cost)."""
    print(f"{name}: {len(prompts)} prompts x {args.repeats} repeats x {args.max_tokens} tokens, greedy, "
          f"drafter {engine.default_drafter}, num_draft {args.num_draft or 'auto'}; server ({args.api}'s route) and "
          f"engine interleaved")
    print(f"{'prompt':>6} {'server tok/s':>13} {'engine tok/s':>13} {'ratio':>7}   {'inner ratio':>11}")
    ratios, inner = [], []
    for i in range(len(prompts)):
        med = {side: {key: statistics.median(run[key] for j, run in rs if j == i) for key in ("tps", "engine_tps")}
               for side, rs in runs.items()}
        ratios.append(med["server"]["tps"] / med["engine"]["tps"])
        inner.append(med["server"]["engine_tps"] / med["engine"]["engine_tps"])
        print(f"{i:>6} {med['server']['tps']:>13.1f} {med['engine']['tps']:>13.1f} {ratios[-1]:>7.3f}   "
              f"{inner[-1]:>11.3f}")
    tok = {side: sum(run["tokens"] for _, run in rs) for side, rs in runs.items()}
    same = sum(a["text"] == b["text"] for (_, a), (_, b) in zip(runs["server"], runs["engine"]))
    ratio = statistics.median(ratios)
    print(f"tokens generated: server {tok['server']}, engine {tok['engine']}; "
          f"identical answers {same}/{len(runs['server'])}")
    print(f"engine's own tok/s, inside the server / direct (median over prompts): {statistics.median(inner):.3f}")
    print(f"streamed tok/s, server / Engine.stream (median over prompts): {ratio:.3f} "
          f"({'meets' if ratio >= 0.97 else 'BELOW'} the 0.97 target)")


def start_server(pair: str, port: int) -> subprocess.Popen:
    import httpx

    argv = ([__file__, "--serve-tiny", str(port)] if pair == "tiny" else
            ["-m", "mlxspec", "serve", "--pair", pair, "--port", str(port), "--log-level", "warning"])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, *argv], env=env)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited with status {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    sys.exit("the server did not answer /health within 600 s")


def serve_tiny(port: int) -> None:
    from mlxspec.serve import ServeOptions, serve

    _, engine = load(None)
    sys.exit(serve(engine, ServeOptions(port=port, log_level="warning")))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()

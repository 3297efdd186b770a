"""Structured output's speed: constrained decoding by each drafter against constrained plain decoding,
and free text, on one engine, interleaved prompt by prompt, after a warm-up.

    python scripts/bench_grammar.py [--pair demo] [--max-tokens 96] [--reps 2]

Prints tokens per second per mode and each mode's median per-prompt ratio to constrained plain
decoding, and checks that every constrained greedy output equals constrained plain decoding's and
parses as JSON when it ended.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlxspec

PROMPTS = [
    ("Describe a cat as JSON with its name, age and favourite food.",
     {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                       "favourite_food": {"type": "string"}},
      "required": ["name", "age", "favourite_food"], "additionalProperties": False}),
    ("List three European capitals with their countries, as JSON.",
     {"type": "object", "properties": {"capitals": {"type": "array", "items": {
         "type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
         "required": ["city", "country"], "additionalProperties": False}}},
      "required": ["capitals"], "additionalProperties": False}),
    ("Give a recipe for pancakes as JSON: a title, the ingredients and the steps.",
     {"type": "object", "properties": {"title": {"type": "string"},
                                       "ingredients": {"type": "array", "items": {"type": "string"}},
                                       "steps": {"type": "array", "items": {"type": "string"}}},
      "required": ["title", "ingredients", "steps"], "additionalProperties": False}),
    ("Write a JSON object for a user profile: username, email, a list of interests, and whether they "
     "are active.", None),
    ("Classify the sentiment of 'I loved this film, the music was wonderful' as JSON with a label and "
     "a confidence between 0 and 1.",
     {"type": "object", "properties": {"label": {"enum": ["positive", "negative", "neutral"]},
                                       "confidence": {"type": "number"}},
      "required": ["label", "confidence"], "additionalProperties": False}),
    ("Return a JSON array of five prime numbers with a short note on each.", None),
]


def fmt_of(schema):
    if schema is None:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="demo", help="the pair to load (default demo)")
    ap.add_argument("--max-tokens", type=int, default=96, help="tokens per answer (default 96)")
    ap.add_argument("--reps", type=int, default=2, help="passes over the prompts, interleaved (default 2)")
    args = ap.parse_args()
    engine = mlxspec.load(args.pair)
    drafters = [d for d in ("ngram", "eagle", "model") if d in engine.drafters]
    modes = [("plain, JSON", dict(speculative=False), True), ("plain, free text", dict(speculative=False), False)]
    modes += [(f"{d}, JSON", dict(drafter=d), True) for d in drafters]
    t0 = time.perf_counter()
    engine.warmup()
    for _, opts, constrained in modes:  # first uses: the grammar tables and compiled shapes
        ask = [{"role": "user", "content": PROMPTS[0][0]}]
        engine.generate(ask, max_tokens=16, response_format=fmt_of(PROMPTS[0][1]) if constrained else None, **opts)
    print(f"warm-up {time.perf_counter() - t0:.0f} s; {len(PROMPTS)} prompts x {args.reps}, "
          f"{args.max_tokens} tokens at most, greedy")
    speed = {m[0]: [] for m in modes}
    tokens = {m[0]: 0 for m in modes}
    seconds = {m[0]: 0.0 for m in modes}
    ratios = {m[0]: [] for m in modes}
    for rep in range(args.reps):
        for text, schema in PROMPTS:
            ask = [{"role": "user", "content": text}]
            outs = {}
            for name, opts, constrained in (modes if rep % 2 == 0 else modes[::-1]):
                engine.reset()
                r = engine.generate(ask, max_tokens=args.max_tokens,
                                    response_format=fmt_of(schema) if constrained else None, **opts)
                s = r.stats
                outs[name] = r
                speed[name].append(s.tokens / s.seconds)
                tokens[name] += s.tokens
                seconds[name] += s.seconds
            base = outs["plain, JSON"]
            if base.finish_reason == "stop":
                json.loads(base.text)
            for name, _, constrained in modes:
                if constrained:
                    assert outs[name].tokens == base.tokens, f"{name} differs from plain decoding on {text!r}"
                ratios[name].append(speed[name][-1] / speed["plain, JSON"][-1])
    print(f"{'mode':<18} {'tok/s':>7} {'x plain JSON (median per prompt)':>34}")
    for name, _, _ in modes:
        print(f"{name:<18} {tokens[name] / seconds[name]:7.1f} {statistics.median(ratios[name]):34.2f}")


if __name__ == "__main__":
    main()

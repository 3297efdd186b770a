"""One rank's side of tests/test_distributed.py, run under `mlx.launch --backend ring -n 2`.

Every rank builds the same tiny models (fixed seeds), shards the target over the group,
runs the same requests, and writes what it saw to OUT_DIR/rank<r>.json; the test compares
the files. Rank 1 is made slow on purpose (its drafters sleep), so its own cost model
would pick other draft lengths than rank 0's: only coordination keeps the passes aligned.

    python tests/dist_worker.py OUT_DIR [scenario]

Scenarios: "main" (default), "die" and "hang" (rank 1 exits, or stops responding, in the
middle of a request; rank 0 must end with an error, not hang).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny import make_llama, make_tokenizer, streamed  # noqa: E402

from mlxspec import Engine  # noqa: E402
from mlxspec.distributed import Coordinator, DistributedError  # noqa: E402
from mlxspec.errors import InvalidArgumentError  # noqa: E402
from mlxspec.loading.fingerprint import model_fingerprint  # noqa: E402
from mlxspec.shard import shard_model  # noqa: E402

SLOW_SECONDS = 0.004  # rank 1's extra host time per proposal
PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"
MAX_TOKENS = 24


def varied(noise: float = 0.0):
    """A tiny llama whose greedy output varies (random tiny models repeat one token): weaker
    embeddings, stronger residual branches. With `noise`, the same model with its MLP output
    weights perturbed (fixed seed): a draft. At 0.1 it agrees with the target's greedy choice
    on 21 of the 24 reference tokens, often enough that drafting pays however noisy this
    machine's timings are, not always, so rejections are exercised (a 1-layer half of it agreed
    on none, and drafted only while the prior's acceptance lasted: whether it drafted at all
    depended on the timings)."""
    model = make_llama(0, layers=2)
    for layer in model.model.layers:
        layer.mlp.down_proj.weight = layer.mlp.down_proj.weight * 8
        layer.self_attn.o_proj.weight = layer.self_attn.o_proj.weight * 8
    model.model.embed_tokens.weight = model.model.embed_tokens.weight * 0.1
    if noise:
        key = mx.random.key(5)
        for layer in model.model.layers:
            w = layer.mlp.down_proj.weight
            key, sub = mx.random.split(key)
            layer.mlp.down_proj.weight = w + noise * mx.random.normal(w.shape, key=sub) * mx.abs(w).mean()
    mx.eval(model.parameters())
    return model


def slow_down(engine, seconds: float) -> None:
    """Make every proposal on this rank slower (uneven per-rank timings)."""
    for d in engine.drafters.values():
        propose = d.propose

        def slow(*args, _propose=propose, **kwargs):
            time.sleep(seconds)
            return _propose(*args, **kwargs)

        d.propose = slow


def record(result) -> dict:
    s = result.stats
    return {"tokens": result.tokens, "rounds": s.rounds, "drafted": s.drafted, "accepted": s.accepted,
            "k_histogram": {str(k): v for k, v in sorted(s.k_histogram.items())}}


def main(out_dir: Path, scenario: str) -> None:
    group = mx.distributed.init()
    rank = group.rank()
    tok = make_tokenizer()
    target = varied()
    how = shard_model(target, group)
    # Passes of these tiny models cost about the same at every length; say so, rather than let the
    # prior guess for this device (steep on a CPU's reference BLAS) keep 24 tokens from drafting.
    flat = {j: 1.0 + 0.1 * (j - 1) for j in range(1, 17)}
    if scenario != "main":
        engine = Engine(target, tok, group=group, cost_prior=flat)
    else:
        draft = varied(noise=0.1)
        reference = Engine(varied(), tok)  # unsharded, this process only
        engine = Engine(target, tok, draft, draft_tokenizer=tok, group=group, cost_prior=flat)
    if rank == 1:
        slow_down(engine, SLOW_SECONDS)
    out = {"rank": rank, "size": group.size(), "sharding": how}

    if scenario in ("die", "hang"):
        events = engine.stream(PROMPT, max_tokens=MAX_TOKENS, drafter="ngram")
        for i, _ in enumerate(events):
            if rank == 1 and i == 3:
                if scenario == "die":
                    os._exit(7)  # a rank that dies mid-request
                time.sleep(3600)  # a rank that hangs mid-request
        return

    # Greedy, automatic k, both drafters: equal to the unsharded target, same decisions on every rank.
    want = reference.generate(PROMPT, max_tokens=MAX_TOKENS, speculative=False).tokens
    out["reference"] = want
    for name in ("ngram", "model"):
        out[f"greedy_{name}"] = record(engine.generate(PROMPT, max_tokens=MAX_TOKENS, drafter=name))
        # a fixed k too: automatic k may decline to draft on a loaded machine, this one drafts
        out[f"greedy_{name}_k3"] = record(engine.generate(PROMPT, max_tokens=MAX_TOKENS, drafter=name,
                                                          num_draft=3))

    # Seeded sampling: the same tokens on every rank (compared by the test).
    for name in ("ngram", "model"):
        out[f"sampled_{name}"] = record(engine.generate(PROMPT, max_tokens=MAX_TOKENS, drafter=name,
                                                        temperature=0.9, seed=11))
    # typical-p and XTC (its coin keyed by the seed) on top: shared with the request, the same on every rank
    filters = dict(temperature=0.9, seed=11, typical_p=0.9, xtc_probability=0.5, xtc_threshold=0.05)
    out["filtered"] = record(engine.generate(PROMPT, max_tokens=MAX_TOKENS, drafter="model", **filters))
    out["filtered_plain"] = engine.generate(PROMPT, max_tokens=MAX_TOKENS, speculative=False, **filters).tokens

    # A grammar: each rank masks its own rows the same way, and equals constrained plain decoding.
    grammar = {"type": "regex", "regex": r"[a-z(), :+*\n-]{1,40}"}
    out["constrained"] = record(engine.generate(PROMPT, max_tokens=MAX_TOKENS, drafter="ngram", num_draft=3,
                                                response_format=grammar))  # fixed k: the test asserts drafts
    out["constrained_reference"] = reference.generate(PROMPT, max_tokens=MAX_TOKENS, speculative=False,
                                                      response_format=grammar).tokens

    # A logit_bias of -100 on all the grammar allows after "a": the tokens before the conflict are
    # streamed, then every rank ends with the same error, as the unsharded target does.
    a, b, c = (ord(ch) + 3 for ch in "abc")  # the tiny tokenizer's byte tokens
    eos = tok.eos_token_id
    for case, (regex, bias) in enumerate([("a(b|c)", {b: -100, c: -100}), ("ab", {eos: -100})]):
        conflict = dict(max_tokens=8, response_format={"type": "regex", "regex": regex}, logit_bias=bias)
        for name, who, drafter in (("ngram", engine, "ngram"), ("model", engine, "model"),
                                   ("reference", reference, "none")):
            got, error = streamed(who, PROMPT, drafter=drafter, **conflict)
            out[f"conflict{case}_{name}"] = {"tokens": got, "error": error}
    out["after_conflict"] = record(engine.generate(PROMPT, max_tokens=MAX_TOKENS, drafter="ngram"))

    # A logit_bias (shared as JSON: string keys) and penalties, row by row alike on every rank.
    shaped = dict(logit_bias={want[0]: -100, want[1]: 2.5}, frequency_penalty=0.5, repetition_penalty=1.3,
                  dry_multiplier=0.8, dry_allowed_length=1)
    out["shaped"] = record(engine.generate(PROMPT, max_tokens=MAX_TOKENS, drafter="ngram", **shaped))
    out["shaped_reference"] = reference.generate(PROMPT, max_tokens=MAX_TOKENS, speculative=False, **shaped).tokens

    # The prompt's logprobs: computed by a prefill every rank runs, equal to the unsharded target's.
    scored = engine.generate(PROMPT, max_tokens=3, drafter="ngram", prompt_logprobs=2)
    out["prompt_logprobs"] = {"tokens": scored.tokens, "scored": scored.prompt_logprobs}
    out["prompt_logprobs_reference"] = reference.generate(PROMPT, max_tokens=3, speculative=False,
                                                          prompt_logprobs=2).prompt_logprobs

    # Rank 0's consumer closes the stream early; rank 1 reads on. Both must end together and
    # leave the same caches: the next request still equals the reference.
    events = engine.stream(PROMPT, max_tokens=MAX_TOKENS, drafter="ngram")
    seen = 0
    for _ in events:
        seen += 1
        if rank == 0 and seen == 5:
            events.close()
            break
    out["closed_after"] = seen
    # What the target's caches hold now, on each rank (the next request only realigns them by
    # chance: when its prompt leaves the committed text before the shorter rank's end).
    out["cached_after_close"] = {"tokens": list(engine.target.tokens),
                                 "offsets": [c.offset for c in engine.target.caches]}
    out["after_close"] = record(engine.generate(PROMPT + "    ", max_tokens=MAX_TOKENS, drafter="model"))
    out["after_close_reference"] = reference.generate(PROMPT + "    ", max_tokens=MAX_TOKENS,
                                                      speculative=False).tokens

    # A cancel set on rank 1 only (a terminal's Ctrl-C reaches each rank at its own token) is
    # rank 0's to act on: rank 1 reads on in step, to the same end.
    import threading

    elsewhere = threading.Event()
    if rank == 1:
        elsewhere.set()
    out["cancelled_elsewhere"] = record(engine.generate(PROMPT, max_tokens=MAX_TOKENS, drafter="ngram",
                                                        cancel=elsewhere))
    out["cancelled_elsewhere_reference"] = reference.generate(PROMPT, max_tokens=MAX_TOKENS, speculative=False).tokens

    # Embeddings: every rank runs the passes, on rank 0's inputs (rank 1 was given others), equal to
    # the unsharded target's; then rank 1 follows rank 0's requests, embeddings and generations, as
    # behind a server, until rank 0 releases it.
    texts = ["def add(a, b):", "return a - b", PROMPT]
    got = engine.embed(texts if rank == 0 else ["other"], pooling="last", normalize=-1, cancel=elsewhere)
    out["embedded"] = {"vectors": np.array(got.vectors).tolist(), "tokens": got.tokens}
    out["embedded_reference"] = np.array(reference.embed(texts, pooling="last", normalize=-1).vectors).tolist()
    if rank == 0:
        out["followed_embedding"] = np.array(engine.embed(texts[:2]).vectors).tolist()
        out["followed_greedy"] = record(engine.generate(PROMPT, max_tokens=MAX_TOKENS, drafter="ngram"))
        engine.release()
    else:
        out["followed"] = engine.follow()
    out["followed_embedding_reference"] = np.array(reference.embed(texts[:2]).vectors).tolist()

    # Weights that differ between ranks are found at load (fingerprints), on every rank.
    try:
        Coordinator(group).agree({"target weights": model_fingerprint(make_llama(rank))})
        out["agree_differing"] = "no error"
    except DistributedError as e:
        out["agree_differing"] = str(e)

    # Options that differ between ranks (another --dtype) are found at load too: once, rank 1 read
    # the decisions against float16 bytes and "finished" at once while rank 0 lost its peer.
    from tiny_gguf import write_tiny_gguf

    import mlxspec

    gguf = out_dir / f"rank{rank}-files" / "t.gguf"  # the same file on every rank, as on every host
    gguf.parent.mkdir()
    write_tiny_gguf(gguf)
    try:
        mlxspec.load(str(gguf), "none", dtype="float16" if rank else "float32", distributed=True)
        out["load_differing"] = "no error"
    except DistributedError as e:
        out["load_differing"] = str(e)
    try:  # each rank drafts for itself, so the drafter is one of those options
        mlxspec.load(str(gguf), "none" if rank else "ngram", distributed=True)
        out["drafter_differing"] = "no error"
    except DistributedError as e:
        out["drafter_differing"] = str(e)

    # An adapter, folded into the weights before they are sharded: the fused target's text.
    from mlxspec.loading.model import load_model
    from test_adapters import write_adapter

    untied = gguf.parent / "untied.gguf"  # (whose text an adapter changes: test_adapters.py's)
    write_tiny_gguf(untied, tied=False)
    gguf = untied
    mx.random.seed(3)  # (a LoRA layer's first weights are drawn): the same adapter files on every rank
    adapter = write_adapter(lambda: load_model(str(gguf))[0], gguf.parent / "adapter", num_layers=2)
    ids = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
    # (float32: this process's MLX took no fast BLAS, so the default here is bfloat16, whose sums the
    # shards round otherwise than the whole target at this random model's near-ties)
    sharded = mlxspec.load(str(gguf), "ngram", dtype="float32", adapter_path=str(adapter), fuse_adapter=True,
                           distributed=True)
    out["adapter"] = {"kind": sharded.target_info.adapter_kind, "sharding": sharded.target_info.sharding,
                      "greedy": record(sharded.generate(ids, max_tokens=MAX_TOKENS, num_draft=3))}
    whole = mlxspec.load(str(gguf), "none", dtype="float32", adapter_path=str(adapter), fuse_adapter=True)  # alone
    out["adapter_reference"] = whole.generate(ids, max_tokens=MAX_TOKENS).tokens
    out["adapter_base"] = mlxspec.load(str(gguf), "none", dtype="float32").generate(ids, max_tokens=MAX_TOKENS).tokens
    try:
        mlxspec.load(str(gguf), "ngram", adapter_path=str(adapter), distributed=True)
        out["adapter_unfused"] = "no error"
    except InvalidArgumentError as e:
        out["adapter_unfused"] = str(e)

    # Drafts that differ between ranks (a broken replica) are caught by the history check.
    if rank == 1:
        ngram = engine.drafters["ngram"]
        inner = ngram.propose

        def wrong(history, k, params=None, seed=0):
            d = inner(history, k, params, seed)
            d.tokens = [(t + 1) % 200 + 3 for t in d.tokens]
            return d

        ngram.propose = wrong
    try:
        engine.generate(PROMPT, max_tokens=MAX_TOKENS, drafter="ngram", num_draft=4)
        out["diverged"] = "no error"
    except DistributedError as e:
        out["diverged"] = str(e)
    out["decisions"] = engine.coord.decisions
    (out_dir / f"rank{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "main")

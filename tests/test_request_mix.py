"""Seeded random mixes of requests on one engine, each answer checked against decoding alone.

The other tests hold one setting still and vary another. Here a request sequence mixes them the
way a server's clients do: drafter, draft length, trees, lookup, sampling and penalties per
request; conversations continued, cut back to a prefix and started afresh; streams left
midway and overtaken; on engines with and without a KV window and parked conversations. Every
answer must be the one decoding alone gives for that request from nothing: greedy, mlx-lm's
tokens; sampled or penalised, the plain engine's for the same seed.
"""

import random

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import KVCache, RotatingKVCache

import tiny
from mlxspec import Engine
from mlxspec.bench.neartie import check_greedy

EOS = 2  # the tiny tokenizer's <|im_end|>
PENALTIES = ("repetition_penalty", "frequency_penalty", "presence_penalty", "dry_multiplier")
FILTERS = (("top_p", [0.5, 0.9]), ("top_k", [5, 40]), ("min_p", [0.05, 0.2]), ("typical_p", [0.5, 0.9]),
           ("xtc_probability", [0.5, 1.0]), ("mirostat", [1, 2]), ("top_n_sigma", [0.5, 2.0]))
REQUESTS = 30


@pytest.fixture(scope="module")
def target():
    return tiny.make_llama(0, tie_embeddings=False)  # its text depends on what it reads


def mlx_lm_greedy(model, ids, n, window):
    """mlx-lm's greedy tokens from a fresh cache; under a window the prompt goes one token at a
    time (mlx-lm's multi-token prefill lets a chunk read past the window, single steps do not)."""
    cache = [RotatingKVCache(max_size=window, keep=4) if window else KVCache() for _ in model.layers]
    steps = generate_step(mx.array(ids), model, max_tokens=n, prompt_cache=cache,
                          prefill_step_size=1 if window else 2048)
    out = [int(t) for t, _ in steps]
    return out[: out.index(EOS) + 1] if EOS in out else out


def next_prompt(rng, conversations):
    r = rng.random()
    if conversations and r < 0.4:  # a conversation continued: its prefix is cached (or parked)
        return rng.choice(conversations) + [rng.randrange(3, 259) for _ in range(rng.randrange(1, 12))]
    if conversations and r < 0.55:  # cut back: the caches roll back, past a wrapped window too
        base = rng.choice(conversations)
        return base[: rng.randrange(2, len(base) + 1)]
    ids = [rng.randrange(3, 259) for _ in range(rng.randrange(2, 60))]
    return (ids[:8] * 8)[: rng.randrange(10, 48)] if rng.random() < 0.3 else ids  # repeats: lookup drafts


def next_options(rng):
    kw = dict(max_tokens=rng.randrange(1, 70), num_draft=rng.choice(["auto", "auto", 0, 1, 2, 4, 7]),
              tree=rng.choice(["auto", "off", 3, 8]), lookup=rng.choice([True, False]))
    if (drafter := rng.choice(["model", "eagle", "ngram", None])) is not None:
        kw["drafter"] = drafter
    if rng.random() < 0.5:
        kw.update(temperature=rng.choice([0.3, 0.8, 1.0, 1.5]), seed=rng.randrange(1000))
        for name, values in FILTERS:
            if rng.random() < 0.2:
                kw[name] = rng.choice(values)
    for name, values in zip(PENALTIES, ([1.1, 1.5], [0.5, -0.5], [0.5, 1.0], [0.8, 2.0])):
        if rng.random() < 0.2:
            kw[name] = rng.choice(values)
    return kw


# (seed, the engine's default drafter, its head, its draft, KV window, parked conversations)
ENGINES = [
    (1, "model", "copy", "other", None, 0),
    (2, "eagle", "noisy", "target", None, 2),
    (3, "ngram", "random", "other", 48, 2),
    (4, "model", "noisy", "target", 80, 0),
    (5, "eagle", "copy", "other", 48, 0),
    (6, "eagle", "random", "target", 80, 2),
]


@pytest.mark.parametrize("seed,drafter,head,draft,window,parked", ENGINES)
def test_a_mix_of_requests_answers_each_as_decoding_alone(target, tmp_path, seed, drafter, head, draft, window,
                                                          parked):
    rng = random.Random(seed)
    head_dir = tiny.make_eagle_head(target, tmp_path / "head", copy=head != "random",
                                    noise=0.05 if head == "noisy" else 0.0)  # copy: drafts the target's text
    draft_model = target if draft == "target" else tiny.make_llama(1, layers=1, tie_embeddings=False)
    engine = Engine(target, tiny.make_tokenizer(), draft_model=draft_model, eagle_head=head_dir, drafter=drafter,
                    max_kv_size=window, prompt_cache_size=parked)
    alone = Engine(target, tiny.make_tokenizer(), drafter="none", max_kv_size=window)
    conversations, drafted, sampled = [], 0, 0
    for i in range(REQUESTS):
        ids, kw = next_prompt(rng, conversations), next_options(rng)
        if rng.random() < 0.15:  # a stream left after a few events: the next request overtakes it
            left = engine.stream(ids, **kw)
            for _ in range(rng.randrange(0, 5)):
                next(left, None)
            if rng.random() < 0.5:
                left.close()
        events = list(engine.stream(ids, **kw))
        got = [ev.token for ev in events]
        drafted += events[-1].stats.drafted
        temperature = kw.get("temperature", 0.0)
        if temperature or any(name in kw for name in PENALTIES):
            sampled += temperature > 0
            plain = {k: v for k, v in kw.items() if k not in ("num_draft", "tree", "lookup", "drafter")}
            ref = [ev.token for ev in alone.stream(ids, **plain)]
        else:
            ref = mlx_lm_greedy(target, ids, kw["max_tokens"], window)
        if got != ref:  # only rounding at a near-tie may part them (never on this CPU in float32)
            exact = temperature == 0 or not any(k in kw for k, _ in FILTERS)
            check = check_greedy(target, ids, ref, got, max_kv_size=window, temperature=temperature,
                                 seed=kw.get("seed")) if exact and not any(k in kw for k in PENALTIES) else None
            assert check is not None and check.ok, f"request {i} {kw}, {len(ids)} prompt tokens: got {got}, want {ref}"
        conversations.append(ids + got)
    assert drafted > 0 and sampled > 0  # the mix drafted, and sampled: the checks had something to check

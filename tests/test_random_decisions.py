"""Lossless whatever the cost model decides. Its decisions follow timings, so a path taken only on
some machine, or under load, is a path these tests must take too: every length, tree, side leaf,
probe and guess is chosen at random here, with every request option that shapes a row, and each
answer must be plain decoding's (greedy: its tokens; seeded sampling: its tokens too), also on the
caches an earlier answer left (the same request again, and a reply to it), also after a stream
that its reader left early.

(A min_tokens ban by row index instead of depth let tree rounds end answers early, seen once as a
flaky test under load; these requests found it in about one in eighty of those that set
min_tokens, which failed two of the three seeds.)
"""

from __future__ import annotations

import random

import pytest

import tiny
from test_grammar import MOOD, WORDS  # its regex and JSON schema
from mlxspec import Engine
from mlxspec.costmodel import CostModel

ASK = [{"role": "user", "content": "say it say it again"}]
FILTERS = {"top_p": 0.9, "typical_p": 0.8, "top_n_sigma": 1.5, "xtc_probability": 0.5, "min_p": 0.05, "top_k": 20}


@pytest.fixture
def chance(monkeypatch):
    """The cost model's choices made at random (within what each may return)."""
    rng = random.Random(0)

    def nodes(self, reach):
        self.probing = self.exploring = False
        top = min(self.k_max, len(reach))
        m = rng.choice([0, 0, rng.randint(0, top)]) if top else 0
        self.exploring = bool(m) and rng.random() < 0.2  # re-timing rounds draft chains
        if not m and top and rng.random() < 0.3:
            self.probing, m = True, 1
        return m

    monkeypatch.setattr(CostModel, "choose_nodes", nodes)
    monkeypatch.setattr(CostModel, "speed", lambda self, k, kind="": rng.random())  # lookup against the model
    monkeypatch.setattr(CostModel, "choose_widening", lambda self, k, tokens, reach, extra=0.0:
                        rng.randint(0, len(reach)))
    return rng


def request(rng: random.Random, free: list) -> dict:
    """Random options of a request: sampling and its filters or mirostat, logit_bias, ending
    tokens with min_tokens, ignore_eos, logprobs, a grammar, post-sampling probabilities, a fixed
    draft length, trees off or capped, lookup, penalties or DRY."""
    kw = {"max_tokens": rng.choice([8, 24, 40])}
    if rng.random() < 0.5:
        kw.update(temperature=rng.choice([0.5, 1.0]), seed=rng.randrange(100))
        if rng.random() < 0.15:
            kw["mirostat"] = rng.choice([1, 2])
        else:
            kw.update({k: v for k, v in FILTERS.items() if rng.random() < 0.25})
    if rng.random() < 0.4:
        kw["logit_bias"] = {free[rng.randrange(6)]: -5.0, rng.randrange(tiny.VOCAB): 3.0}
    if rng.random() < 0.5:  # endings plain decoding would write early, banned until after them
        at = rng.randrange(6)
        kw.update(stop_token_ids=free[at:at + 4], min_tokens=min(at + 1 + rng.randrange(8), kw["max_tokens"]))
    kw.update({"logprobs": 3} if rng.random() < 0.3 else {}, **({"ignore_eos": True} if rng.random() < 0.2 else {}))
    if rng.random() < 0.15:
        kw["response_format"] = rng.choice([WORDS, MOOD])
    if rng.random() < 0.15:
        kw["post_sampling_probs"] = True
    if rng.random() < 0.2:  # a fixed draft length, then no cost model for it
        kw["num_draft"] = rng.randint(1, 6)
    if rng.random() < 0.2:
        kw["tree"] = rng.choice(["off", 3])
    if rng.random() < 0.2:
        kw["lookup"] = rng.random() < 0.5
    shaping = rng.random()
    if shaping < 0.15:
        kw["presence_penalty"] = 0.5
    elif shaping < 0.25:
        kw["repetition_penalty"] = 1.3
    elif shaping < 0.35:
        kw.update(dry_multiplier=0.8, dry_allowed_length=1)
    return kw


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_decisions_keep_every_drafter_s_answer_plain_decoding_s(seed, chance, tmp_path):
    def model():
        return tiny.make_llama(seed, tie_embeddings=seed == 1, layers=1 if seed == 1 else 2)

    target, tok = model(), tiny.make_tokenizer()
    # a draft model that is the target's copy drafts what it would write, endings included: its
    # trees reach far, and past where a ban makes the target choose otherwise
    drafters = {"model": {"draft_model": tiny.make_llama(seed + 50, tie_embeddings=False)},
                "model copy": {"draft_model": model()}, "ngram": {},
                "eagle": {"eagle_head": tiny.make_eagle_head(target, tmp_path / "head", seed=4, copy=True,
                                                             noise=0.05)}}
    free = Engine(target, tok, drafter="none").generate(ASK, max_tokens=20).tokens
    rng = random.Random(100 + seed)
    trees = drafted = replies = reused = left = stops = 0
    for _ in range(30):
        kw = request(rng, free)
        if rng.random() < 0.15:
            kw["prediction"] = tok.decode(free[:12])
        window = rng.choice([None, None, 16])
        if rng.random() < 0.2:  # a stop string: two tokens of what plain decoding writes without it
            probe = Engine(target, tok, drafter="none", max_kv_size=window).generate(ASK, **kw).tokens
            at = rng.randrange(max(1, len(probe) - 1))
            kw["stop"] = [tok.decode(probe[at:at + 2]) or "x"]  # (a stop string is never empty)
        plain = Engine(target, tok, drafter="none", max_kv_size=window).generate(ASK, **kw).tokens
        # a reply to the answer: its prompt starts with the first turn's, whose cached entries it reuses
        more = ASK + [{"role": "assistant", "content": tok.decode(plain)}, {"role": "user", "content": "again"}]
        plain_more = Engine(target, tok, drafter="none", max_kv_size=window).generate(more, **kw).tokens
        for name, models in drafters.items():
            engine = Engine(target, tok, drafter=name.split()[0], max_kv_size=window, **models)
            if rng.random() < 0.3:  # a stream its reader leaves early: the next answer starts on what it left
                stream = engine.stream(more if rng.random() < 0.5 else ASK, **kw)
                for _ in zip(range(rng.randint(1, 4)), stream):
                    pass
                stream.close()
                left += 1
            for turn, (ask, want) in enumerate([(ASK, plain), (ASK, plain), (more, plain_more)]):
                r = engine.generate(ask, **kw)  # the second and third on caches the one before left
                assert r.tokens == want, (name, window, turn, kw)
                trees, drafted = trees + r.stats.tree_rounds, drafted + r.stats.drafted
                replies += turn == 2
                stops += r.stop_reason in (kw.get("stop") or ())
                reused += (r.stats.prompt_tokens - r.stats.prefilled_tokens) if turn == 2 else 0
    assert trees > 20 and drafted > 500  # the paths were taken
    assert reused > 10 * replies  # the replies reused their first turn's entries
    assert left > 10 and stops > 10


def test_typical_p_beside_top_n_sigma_under_a_grammar_decodes_and_every_drafter_agrees(chance, tmp_path):
    """Found by these requests with another seed: typical-p and top-n-sigma kept no token in
    common, the row was NaN, and plain decoding wrote a token the grammar bans (an error)."""
    target, tok = tiny.make_llama(5, tie_embeddings=False, layers=2), tiny.make_tokenizer()
    kw = {"max_tokens": 8, "temperature": 1.0, "seed": 16, "typical_p": 0.8, "top_n_sigma": 1.5, "min_p": 0.05,
          "response_format": WORDS, "presence_penalty": 0.5}
    said = tok.decode([35, 115, 115, 113, 109, 115, 115, 115])
    ask = ASK + [{"role": "assistant", "content": said}, {"role": "user", "content": "again"}]
    plain = Engine(target, tok, drafter="none").generate(ask, **kw)
    assert plain.finish_reason == "length" and len(plain.tokens) == 8
    drafters = {"model": {"draft_model": tiny.make_llama(5, tie_embeddings=False, layers=2)}, "ngram": {},
                "eagle": {"eagle_head": tiny.make_eagle_head(target, tmp_path / "head", seed=4, copy=True)}}
    for name, models in drafters.items():
        for _ in range(3):
            assert Engine(target, tok, drafter=name, **models).generate(ask, **kw).tokens == plain.tokens, name

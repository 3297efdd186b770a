"""The shipped EAGLE head for the demo target (mlxspec/data/smollm2-eagle): size, identity, acceptance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# PROMPTS: the training scripts' held-out prompts (mlxspec/training/draft_prompts.py, seed 0: never trained on).
from test_draft_model import PROMPTS, demo_gguf

HEAD = Path(__file__).resolve().parent.parent / "mlxspec" / "data" / "smollm2-eagle"
# Greedy acceptance of the engine at k = 4 on exactly these prompts, 48 tokens each, measured
# when the head was trained (72 of 276; the model card has the wider figures). Greedy decoding is
# deterministic; 0.8x leaves room for other backends' float differences and still fails an
# untrained head (near 0). (The previous head, trained on templated prompts alone, scores 0.332
# on these templated ones and less than this head on the bench suite and other held-out prompts.)
MEASURED_ACCEPTANCE = 0.261
FLOOR = 0.8


def test_folder_is_small_and_names_its_target():
    cfg = json.loads((HEAD / "config.json").read_text())
    assert cfg["model_type"] == "eagle_head"
    assert (cfg["target"]["vocab_size"], cfg["target"]["hidden_size"]) == (49152, 576)
    assert 0 < cfg["draft_vocab_size"] < 49152
    size = sum(f.stat().st_size for f in HEAD.iterdir() if f.is_file())
    assert size <= 20 * 2**20, f"the head folder is {size} bytes; keep it under 20 MiB"


@pytest.mark.demo
def test_loads_against_the_demo_target_only():
    demo_gguf()
    import mlxspec
    from mlxspec.errors import IncompatibleModelsError

    engine = mlxspec.load("demo", drafter="eagle")
    assert "eagle" in engine.drafters and engine.target.keep_hidden
    plain = mlxspec.load("demo", drafter="ngram")
    assert "eagle" not in plain.drafters and not plain.target.keep_hidden
    from mlxspec.drafters.eagle import load_head
    import tiny

    with pytest.raises(IncompatibleModelsError, match="hidden size 576"):
        load_head(HEAD, tiny.make_llama(0, vocab_size=49152, hidden=64))


@pytest.mark.demo
@pytest.mark.slow
def test_greedy_acceptance_stays_above_the_floor():
    demo_gguf()
    import mlxspec

    engine = mlxspec.load("demo", drafter="eagle", num_draft=4)
    accepted = drafted = 0
    for prompt in PROMPTS:
        msgs = [{"role": "user", "content": prompt}]
        r = engine.generate(msgs, max_tokens=48, lookup=False)  # the head's own drafts: its chains do not copy
        assert r.tokens == engine.generate(msgs, max_tokens=48, speculative=False).tokens
        accepted, drafted = accepted + r.stats.accepted, drafted + r.stats.drafted
    assert drafted > 0
    assert accepted / drafted >= FLOOR * MEASURED_ACCEPTANCE, (accepted / drafted, MEASURED_ACCEPTANCE)

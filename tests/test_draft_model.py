"""The shipped SmolLM2 draft (mlxspec/data/smollm2-draft): loads, matches the target's tokenizer, accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DRAFT = Path(__file__).resolve().parent.parent / "mlxspec" / "data" / "smollm2-draft"
TEXTS = [
    "Hello, world!",
    "def add(a, b):\n    return a + b  # tabs\tand  spaces",
    "Ünïcödé: naïve café, 東京, Ελληνικά, Привет",
    "emoji 🤖🚀 and 👩‍💻 mixed with numbers 3.14159 and 1,000,000",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
]
MESSAGES = [{"role": "user", "content": "Write a haiku about the sea."}]
# Three of the draft's held-out prompts (never trained on; mlxspec/training/draft_prompts.py, seed 0).
PROMPTS = [
    "How would you teach volunteering to a beginner? Use bullet points.",
    "Give me three interesting facts about the immune system. Keep it short.",
    "Write a short Python program that computes the greatest common divisor of two numbers, with comments.",
]
# Greedy acceptance of the engine at k = 4 on exactly these three prompts, 64 tokens each
# (102 accepted of 333 drafted when the draft was trained; the model card has the wider
# figures). The run is greedy and deterministic; 0.8x leaves room for other backends' float
# differences and still fails the previous, weaker draft (about 0.1).
MEASURED_ACCEPTANCE = 0.306
FLOOR = 0.8


def demo_gguf():
    from mlxspec.loading import demo

    if not demo.is_cached():
        pytest.skip("the demo GGUF is not in the mlxspec cache (run `mlxspec pull demo`)")
    return demo.gguf_path()


@pytest.fixture(scope="module")
def draft():
    from mlx_lm import load

    return load(str(DRAFT))


def test_config_is_the_targets_llama():
    cfg = json.loads((DRAFT / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["tie_word_embeddings"] is True
    assert cfg["vocab_size"] == 49152 and cfg["max_position_embeddings"] >= 8192
    assert (cfg["rope_theta"], cfg["bos_token_id"], cfg["eos_token_id"]) == (100000.0, 1, 2)
    size = sum(f.stat().st_size for f in DRAFT.iterdir() if f.is_file())
    assert size <= 20 * 2**20, f"the draft folder is {size} bytes; keep it under 20 MiB"


def test_loads_with_mlx_lm(draft):
    import mlx.core as mx

    model, tokenizer = draft
    ids = tokenizer.encode("The sea is", add_special_tokens=False)
    logits = model(mx.array([ids]))
    assert logits.shape == (1, len(ids), 49152)
    assert bool(mx.all(mx.isfinite(logits)))
    assert tokenizer.eos_token_id == 2


@pytest.mark.demo
def test_tokenizer_matches_the_gguf(draft):
    # The reference is the tokenizer mlxspec builds from the GGUF's own metadata (itself checked
    # against the GGUF in test_demo_model); transformers' GGUF reader would need torch.
    import mlx.core as mx

    from mlxspec.loading.gguf_tokenizer import tokenizer_from_gguf

    _, metadata = mx.load(str(demo_gguf()), return_metadata=True)
    ref = tokenizer_from_gguf(metadata)
    _, tok = draft
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == ref.encode(text, add_special_tokens=False), text
        assert tok.decode(ids) == text
    kw = dict(add_generation_prompt=True, tokenize=False)
    assert tok.apply_chat_template(MESSAGES, **kw) == ref.apply_chat_template(MESSAGES, **kw)


@pytest.mark.demo
@pytest.mark.slow
def test_greedy_acceptance_stays_above_the_floor(draft):
    demo_gguf()
    import mlxspec

    engine = mlxspec.load("demo", drafter="model", num_draft=4)
    assert engine.draft_info.source == "builtin"
    accepted = drafted = 0
    for prompt in PROMPTS:
        stats = engine.generate([{"role": "user", "content": prompt}], max_tokens=64).stats
        accepted, drafted = accepted + stats.accepted, drafted + stats.drafted
    assert drafted > 0
    assert accepted / drafted >= FLOOR * MEASURED_ACCEPTANCE, (accepted / drafted, MEASURED_ACCEPTANCE)

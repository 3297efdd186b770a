"""scripts/eval_eagle.py's counting: first-step agreement, also by how sure the target was."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import eval_eagle  # noqa: E402


@pytest.mark.parametrize("p, bucket", [(0.0, "0-0.3"), (0.29, "0-0.3"), (0.3, "0.3-0.5"), (0.69, "0.5-0.7"),
                                       (0.9, "0.9-1"), (1.0, "0.9-1")])
def test_confidence_buckets_cover_zero_to_one(p, bucket):
    assert eval_eagle.confidence_bucket(p) == bucket


def test_agreement_counts_hits_within_each_confidence_bucket():
    # A drafter whose rows are already its logits over a 4-token vocabulary (no draft ids).
    drafter = SimpleNamespace(logits=lambda rows: rows, draft_ids=None)
    agreement = object.__new__(eval_eagle.Agreement)
    agreement.drafter, agreement.whole, agreement.vocab = drafter, mx.eye(4), None
    out = [3, 0, 1, 2, 2]
    rows = mx.array([[0, 0, 0, 9],   # row 0 follows the prompt: not counted
                     [9, 1, 0, 0],   # predicts 0: hit, target sure 0.95
                     [0, 0, 9, 0],   # predicts 2, target chose 1: miss, sure 0.95
                     [0, 0, 9, 0],   # hit, sure 0.4
                     [9, 0, 0, 0]],  # miss, sure 0.2
                    dtype=mx.float32)
    sure = mx.array([1.0, 0.95, 0.95, 0.4, 0.2])
    c = agreement.count(rows, out, sure)
    assert (c["positions"], c["top1"]) == (4, 2)
    assert c["by_confidence"] == {"0.9-1": [2, 1], "0.3-0.5": [1, 1], "0-0.3": [1, 0]}
    assert sum(n for n, _ in c["by_confidence"].values()) == c["positions"]


def test_confidence_buckets_merge_over_prompts_by_position_not_by_prompt():
    # Two prompts' counts: shares are of all positions, agreement pooled within each bucket.
    rows = [{"by_confidence": {"0.9-1": [3, 3], "0-0.3": [1, 0]}},
            {"by_confidence": {"0.9-1": [1, 0], "0.3-0.5": [5, 2]}}]
    merged = eval_eagle.by_confidence(rows)
    assert list(merged) == ["0-0.3", "0.3-0.5", "0.9-1"]
    assert merged["0.9-1"] == {"share": 4 / 10, "top1": 3 / 4}
    assert merged["0.3-0.5"] == {"share": 5 / 10, "top1": 2 / 5}
    assert merged["0-0.3"] == {"share": 1 / 10, "top1": 0.0}


def _figures(kinds):
    return {"suite": "held-out", "prompts": 6, "max_tokens": 48, "k": 4, "lookup": "on",
            "judged_acceptance": 0.5834, "judged_acceptance_interval": [0.5121, 0.6543], "step_acceptance": [0.5, 0.625],
            "tokens_per_target_pass": 2.1789, "tokens_per_target_pass_interval": [1.9, 2.41], "acceptance": 0.3125,
            "drafted": 480, "first_step_top1": 0.577, "first_step_top5": 0.79, "draft_vocab_coverage": 0.91,
            "temperature": 0.7, "first_step_sum_min_pq": 0.569, "sampled_acceptance": 0.237, "head_step_ms": 3.1,
            "target_step_ms": 72.5, "head_over_target": 3.1 / 72.5,
            "per_kind": {k: {"judged_acceptance": 0.25 * (i + 1), "tokens_per_pass": 1.5 + i} for i, k in enumerate(kinds)}}


def test_the_screen_shows_every_headline_figure_with_its_interval():
    text = eval_eagle.summary(_figures(["code", "math"]), "my-head")
    assert "head my-head on held-out: 6 prompts x 48 tokens, k = 4, lookup on" in text
    for shown in ("0.583  (95 % over prompts 0.512-0.654)", "0.50 0.62", "2.18   (95 % 1.90-2.41)", "0.312  (480 drafted)",
                  "top-1 0.577, top-5 0.790", "holds 0.910", "sum min(p, q) 0.569", "sampled accepted / drafted 0.237",
                  "3.10 / 72.50 ms = 4.3 %"):
        assert shown in text, shown
    assert [line.split() for line in text.splitlines()[-2:]] == [["code", "0.250", "1.50"], ["math", "0.500", "2.50"]]


def test_one_kind_gets_no_table_of_kinds():
    assert "by kind" not in eval_eagle.summary(_figures(["code"]), "h")

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

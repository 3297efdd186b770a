"""scripts/train_eagle.py's settings, without training (no torch needed): the --feature-layers
forms, their errors, and run tags that keep other settings' heads apart (resuming must never
continue a run trained with other settings)."""
import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import train_eagle  # noqa: E402


@pytest.mark.parametrize("spec,want", [("final", []), ("auto", [2, 14, 26]), ("0,15,29", [0, 15, 29]), ("7", [7])])
def test_feature_layer_forms(spec, want):
    assert train_eagle.feature_layers(spec, 30) == want


@pytest.mark.parametrize("spec", ["3,3", "30", "-1", "a,b", "", "1,,2"])
def test_bad_feature_layers_say_what_is_allowed(spec):
    with pytest.raises(SystemExit, match=r"distinct layer indices in 0\.\.29, or 'auto' or 'final'"):
        train_eagle.feature_layers(spec, 30)


def _args(**kw):
    base = dict(draft_vocab=4096, intermediate=1536, epochs=3.5, batch=8, lr=1e-3, noise=0.1, unroll=2,
                unroll_weight=0.8, ce_weight=0.3, loss_on="answers", seed=0, layers=[])
    return argparse.Namespace(**{**base, **kw})


def test_run_tags_follow_data_and_settings():
    train = [None] * 10
    tag = train_eagle.run_tag(_args(), train)
    assert tag == train_eagle.run_tag(_args(), train)  # resuming finds the same files
    others = {train_eagle.run_tag(_args(unroll=4), train), train_eagle.run_tag(_args(layers=[2, 14, 26]), train),
              train_eagle.run_tag(_args(lr=3e-3), train), train_eagle.run_tag(_args(), train[:9])}
    assert tag not in others and len(others) == 4

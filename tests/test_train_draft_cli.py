"""scripts/train_draft.py's run tags (no torch needed): the trained draft is cached under a name
made from its answer shards and settings, so more prompts or another setting never export a
stale draft, and a rerun with the same ones reuses its own."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import train_draft  # noqa: E402

ARGS = train_draft.parse_args(["--gguf", "t.gguf", "--work", "w"])
SHARDS = [Path("w/gen") / f"train-t0-{i:03d}.npz" for i in range(4)] + [Path("w/gen/held_out-t0-000.npz")]


def _tag(shards=SHARDS, **kw):
    args = train_draft.parse_args(["--gguf", "t.gguf", "--work", "w"])
    for k, v in kw.items():
        setattr(args, k, v)
    return train_draft.run_tag(args, shards)


def test_same_answers_and_settings_reuse_the_run():
    assert _tag() == _tag() == _tag(shards=list(reversed(SHARDS)))
    assert train_draft.final_path(ARGS, Path("w"), SHARDS).name == f"draft_final-{_tag()}.pt"


def test_more_answers_or_other_settings_start_a_new_run():
    more = SHARDS + [Path("w/gen/train-t0.7-000.npz")]
    others = [_tag(shards=more), _tag(shards=SHARDS[1:]), _tag(lr=1e-3), _tag(epochs=2.0), _tag(layers=3),
              _tag(hidden=320), _tag(seed=1), _tag(max_len=256)]
    assert len(set(others)) == len(others) and _tag() not in others

"""scripts/replay_first_uses.py: unwarmed engines on a virtual H100 clock, doubting first uses or not."""

import sys
from pathlib import Path

import pytest

import tiny
from mlxspec import Engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import replay_first_uses as replay  # noqa: E402

# Longer than 17 tokens: their prefill is no pass length a round uses, whose first use it would be.
PROMPTS = [[5, 6, 7, 8, 9, 10, 5, 6, 7, 11, 12] * 2, [12, 11, 7, 6, 5, 10, 9, 8] * 3, [40, 41, 42, 40, 41, 43] * 3]


@pytest.fixture(scope="module")
def replayed():
    target = tiny.make_llama(1)
    ref = Engine(target, None)
    jobs = [(p, None, ref.generate(p, max_tokens=80, speculative=False).tokens, 80) for p in PROMPTS]
    return replay.replay(lambda: Engine(target, None, drafter="ngram"), jobs, reps=2, first_use=1.8)


def test_doubted_first_uses_price_every_length_at_its_cost(replayed):
    """(Every answer was checked against plain decoding's inside.) Taken at their word, first uses
    that compiled (1.8x) stay the price of lengths never re-timed. Doubted, a length timed only at
    its first use is priced at what the others predict, and every length at its true cost."""
    trusting, doubting = replayed[False], replayed[True]
    assert len(trusting["speed"]) == len(doubting["speed"]) == 2 * len(PROMPTS)
    assert not trusting["unsure"] and any(v > 1.5 * true for v, _, true in trusting["curve"].values())
    for j, (priced, timed, true) in doubting["curve"].items():
        assert priced == pytest.approx(true, rel=0.15), (j, priced, true)
        if j in doubting["unsure"]:  # (its first use: 1.8x, or its cost where another pass compiled it)
            assert priced <= timed and timed in (pytest.approx(1.8 * true), pytest.approx(true))
        else:
            assert priced == timed == pytest.approx(true, rel=0.02), (j, priced, timed, true)
    assert doubting["unsure"] and len(doubting["curve"]) > len(doubting["unsure"])


def test_the_cli_checks_its_arguments(capsys):
    for argv in (["--reps", "0"], ["--first-use", "0.5"], ["--max-tokens", "0"]):
        with pytest.raises(SystemExit):
            replay.main(argv)
        assert "must be >= 1" in capsys.readouterr().err

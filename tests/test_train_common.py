"""mlxspec/training/train_common.py: what the training scripts say while their answer stage runs."""

from __future__ import annotations


from mlxspec.training import train_common


def test_each_batch_line_counts_its_own_tokens_then_the_run_s_and_the_time_still_to_go(capsys):
    now = [1000.0]
    clock = train_common.AnswerClock(5, 3, clock=lambda: now[0])  # 5 batches, 2 already cached
    for n, at, tokens in ((2, 1060.0, 100), (3, 1300.0, 500), (4, 1330.0, 50)):
        now[0] = at
        clock.done(n, f"train-{n}", tokens)
    lines = [line.split("] ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert lines == [
        "generate 3/5 train-2: 100 answer tokens; 100 in 60s so far (1.7 tok/s); 2 to go, about 2 min at this pace",
        "generate 4/5 train-3: 500 answer tokens; 600 in 300s so far (2.0 tok/s); 1 to go, about 2 min at this pace",
        "generate 5/5 train-4: 50 answer tokens; 650 in 330s so far (2.0 tok/s)",
    ]


def test_a_short_wait_is_not_called_zero_minutes(capsys):
    now = [0.0]
    clock = train_common.AnswerClock(3, 3, clock=lambda: now[0])
    now[0] = 10.0
    clock.done(0, "held_out-000", 40)
    assert capsys.readouterr().out.rstrip().endswith("; 2 to go, under a minute at this pace")

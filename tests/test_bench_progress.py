"""`mlxspec bench` on a stderr that is no terminal: progress as plain lines, not a bar it cannot show."""

from __future__ import annotations

import io
import re

from rich.console import Console

from mlxspec.commands.bench import ProgressLines


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_line_at_most_every_few_seconds_and_one_at_the_end():
    out = io.StringIO()
    log = ProgressLines(Console(file=out, width=40), total=10, every=10.0)
    log.clock = clock = Clock()
    log.start = log.last = 0.0
    for i in range(10):
        clock.t += 3.0  # a run every 3 s: lines after 12 s (run 4), 24 s (run 8), and the last at 30 s
        log.advance(f"p{i} speculative")
    lines = out.getvalue().splitlines()
    assert lines == ["bench: 4/10 runs (p3 speculative), about 18 s left",
                     "bench: 8/10 runs (p7 speculative), about 6 s left",
                     "bench: 10/10 runs (p9 speculative) in 30 s"]  # one line each, never wrapped at 40


def test_the_time_left_counts_from_the_first_run_not_from_the_warm_up():
    # A GPU's first process compiles for minutes before run 1: timed from the start, the first
    # line said "about 38490 s left" for a bench that ended five minutes later.
    out = io.StringIO()
    log = ProgressLines(Console(file=out, width=60), total=10, every=10.0)
    log.clock = clock = Clock()
    log.start = log.last = 0.0
    clock.t = 200.0  # the warm-up
    log.restart()
    for i in range(10):
        clock.t += 3.0
        log.advance(f"p{i} vanilla")
    assert out.getvalue().splitlines() == ["bench: 4/10 runs (p3 vanilla), about 18 s left",
                                           "bench: 8/10 runs (p7 vanilla), about 6 s left",
                                           "bench: 10/10 runs (p9 vanilla) in 30 s"]


def test_a_bench_piped_to_a_file_says_its_progress_in_lines_and_one_prompt_in_the_singular(
        monkeypatch, tmp_path, capsys):
    from bench_helpers import bench_cli_json

    bench_cli_json(monkeypatch, tmp_path, "--limit", "1", "--max-tokens", "4", "--drafter", "ngram", "--no-peer")
    captured = capsys.readouterr()  # neither is a terminal here
    assert "loading models…" in captured.err
    monkeypatch.setenv("MLX_RANK", "1")  # another rank of a sharded run (mlx.launch numbers them): rank 0 says it
    bench_cli_json(monkeypatch, tmp_path, "--limit", "1", "--max-tokens", "4", "--drafter", "ngram", "--no-peer")
    assert "loading models…" not in capsys.readouterr().err
    assert "bench: 2/2 runs (" in captured.err  # vanilla and the n-gram drafter on the one prompt
    lines = captured.err.splitlines()  # the warm-up is said before it starts and when it ends, before any run
    warming = lines.index("bench: warming up: every pass shape compiles once, untimed…")
    warmed = next(i for i, line in enumerate(lines) if re.fullmatch(r"bench: warmed up in \d+\.\d s", line))
    first_run = next(i for i, line in enumerate(lines) if line.startswith("bench: ") and " runs (" in line)
    assert warming < warmed < first_run
    assert "(median of per-prompt ratios, 1 prompt," in captured.out

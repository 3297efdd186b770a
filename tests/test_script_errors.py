"""The measuring scripts the README shows say mlxspec's own errors in one line, as the trainers do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script, args, names", [
    ("eval_eagle.py", ["--head", "{tmp}/no-head"], "no-head"),
    ("chain_ceiling.py", ["--head", "{tmp}/no-head"], "no-head"),
    ("long_chats.py", ["--target", "{tmp}/no-target", "--suite", "bench", "--out", "{tmp}/chats"], "no-target"),
])
def test_a_missing_head_or_target_is_one_line_and_exit_status_1(tmp_path, script, args, names):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *argv], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert run.returncode == 1, run.stderr
    assert run.stderr.startswith("error: ") and names in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_a_measurement_stopped_by_ctrl_c_says_so_without_promising_a_resume(capsys):
    from mlxspec.training import train_common

    def stopped():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as e:
        train_common.run_main(stopped, "interrupted")
    err = capsys.readouterr().err
    assert e.value.code == 130 and err.strip() == "interrupted", err


def test_run_main_passes_on_main_s_exit_status():
    from mlxspec.training import train_common

    for status in (0, 3, None):
        with pytest.raises(SystemExit) as e:
            train_common.run_main(lambda: status)
        assert e.value.code == status


def test_a_trainer_stopped_by_a_full_disk_says_so_in_one_line_a_measurement_does_not_promise_a_resume(capsys):
    import errno

    from mlxspec.training import train_common

    def full():
        raise OSError(errno.ENOSPC, "No space left on device", "work/eagle-gen/train-000.npz")

    with pytest.raises(SystemExit) as e:
        train_common.run_main(full)
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.count("\n") == 1
    assert "the disk is full (writing work/eagle-gen/train-000.npz)" in err
    assert "the same command resumes" in err
    with pytest.raises(OSError):  # a measurement resumes nothing: its traceback is not turned into that promise
        train_common.run_main(full, "interrupted")

    def denied():
        raise PermissionError(errno.EACCES, "Permission denied", "work")
    with pytest.raises(PermissionError):  # only a full disk is said so
        train_common.run_main(denied)

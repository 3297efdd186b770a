"""Files other runs read: written whole or not at all, and updated by one process at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlxspec.files import write_atomic

ROOT = Path(__file__).resolve().parent.parent


def test_an_interrupted_write_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    write_atomic(path, '{"old": 1}\n')

    def interrupted(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, '{"new": 2}\n')
    assert path.read_text() == '{"old": 1}\n' and [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_the_file_gets_the_usual_mode_not_a_temporary_file_s(tmp_path):
    umask = os.umask(0o022)
    try:
        write_atomic(tmp_path / "f", "x")
    finally:
        os.umask(umask)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o644


SAVER = """
import sys
from mlxspec.calibration import save
for i in range(100):
    save({"key": f"{sys.argv[2]}-{i}", "curve": {}}, sys.argv[1])
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX advisory locks")
def test_two_processes_saving_calibrations_at_once_keep_every_entry(tmp_path):
    path = tmp_path / "calibration.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", SAVER, str(path), name], env=env) for name in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    keys = set(json.loads(path.read_text())["models"])
    assert keys == {f"{n}-{i}" for n in "ab" for i in range(100)}

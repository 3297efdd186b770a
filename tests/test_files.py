"""Files other runs read: written whole or not at all, and updated by one process at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlxspec.files import write_all_atomic, write_atomic

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


def test_several_files_are_written_all_or_none(tmp_path, monkeypatch):
    """A full disk while the second file is written, or a folder where it should be, leaves the
    first file's old text (a chat's /save writes its .md and .json so), and no temporary file;
    the error names the file that failed."""
    first, second = tmp_path / "chat.md", tmp_path / "chat.json"
    write_all_atomic({first: "old md\n", second: "old json\n"})
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            raise OSError(28, "No space left on device")

    writes = []

    def fdopen(fd, *a, **kw):
        writes.append(fd)
        return Full(real_fdopen(fd, *a, **kw)) if len(writes) == 2 else real_fdopen(fd, *a, **kw)

    monkeypatch.setattr(os, "fdopen", fdopen)
    with pytest.raises(OSError) as e:
        write_all_atomic({first: "new md\n", second: "new json\n"})
    assert e.value.errno == 28 and e.value.filename == str(second)
    monkeypatch.undo()
    assert first.read_text() == "old md\n" and second.read_text() == "old json\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.json", "chat.md"]

    second.unlink()
    second.mkdir()
    with pytest.raises(IsADirectoryError) as e:
        write_all_atomic({first: "new md\n", second: "new json\n"})
    assert e.value.filename == str(second) and first.read_text() == "old md\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.json", "chat.md"]
    write_all_atomic({first: "new md\n"})
    assert first.read_text() == "new md\n"


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


def test_a_failed_safetensors_write_is_the_oserror_it_was_with_the_file_named(tmp_path, monkeypatch):
    import errno
    import shutil

    import mlx.core as mx

    from mlxspec.files import save_safetensors

    arrays = {"w": mx.zeros((10, 10))}  # 400 bytes
    save_safetensors(tmp_path / "ok.safetensors", arrays)
    assert mx.array_equal(mx.load(str(tmp_path / "ok.safetensors"))["w"], arrays["w"])

    def fails(path, _):  # what MLX raises when its write falls short
        raise RuntimeError("[write] Unable to write 400 bytes to file.")
    monkeypatch.setattr(mx, "save_safetensors", fails)
    for free, code in ((399, errno.ENOSPC), (10**9, errno.EIO)):
        monkeypatch.setattr(shutil, "disk_usage", lambda p, free=free: shutil._ntuple_diskusage(10**10, 0, free))
        with pytest.raises(OSError) as e:
            save_safetensors(tmp_path / "w.safetensors", arrays)
        assert e.value.errno == code and e.value.filename == str(tmp_path / "w.safetensors")
        assert "Unable to write 400 bytes" in str(e.value)

    def other(path, _):
        raise RuntimeError("[save_safetensors] unsupported dtype")
    monkeypatch.setattr(mx, "save_safetensors", other)
    with pytest.raises(RuntimeError, match="unsupported dtype"):
        save_safetensors(tmp_path / "w.safetensors", arrays)


def test_staged_files_replace_theirs_together_or_leave_them_as_they_were(tmp_path):
    import errno

    from mlxspec.files import staged

    a, b = tmp_path / "w.npz", tmp_path / "w.json"
    a.write_text("old a")
    b.write_text("old b")
    with staged(a, b) as [ta, tb]:
        assert ta.parent == tmp_path and ta.name.startswith(".") and ta.suffix == ".npz" and tb.suffix == ".json"
        ta.write_text("new a")
        tb.write_text("new b")
        assert a.read_text() == "old a"  # nothing replaced before the block ends
    assert (a.read_text(), b.read_text()) == ("new a", "new b") and sorted(tmp_path.iterdir()) == [b, a]

    def fails(error, writes=2):
        with staged(a, b) as [ta, tb]:
            ta.write_text("half")
            if writes == 2:
                tb.write_text("half")
            raise error

    for error in (KeyboardInterrupt(), ValueError("no"), OSError(errno.EACCES, "denied", "/elsewhere")):
        with pytest.raises(type(error)) as e:
            fails(error)
        assert e.value is error  # other errors, and files named elsewhere, pass as they were
        assert (a.read_text(), b.read_text()) == ("new a", "new b") and sorted(tmp_path.iterdir()) == [b, a]
    # a full disk names no file: the one being written (the last begun) is named, never a temporary one
    for writes, meant in ((1, a), (2, b)):
        with pytest.raises(OSError) as e:
            fails(OSError(errno.ENOSPC, "No space left on device"), writes)
        assert e.value.errno == errno.ENOSPC and e.value.filename == str(meant), e.value
        assert sorted(tmp_path.iterdir()) == [b, a]
    with pytest.raises(OSError) as e:
        with staged(a) as [ta]:
            raise OSError(errno.EIO, "I/O error", str(ta))
    assert e.value.filename == str(a) and e.value.errno == errno.EIO


def test_staged_suffixes_survive_writers_that_add_their_own(tmp_path):
    import numpy as np

    from mlxspec.files import staged

    writers = {"x.npy": lambda t: np.save(t, np.arange(3)), "x.npz": lambda t: np.savez(t, v=np.arange(3))}
    for name, write in writers.items():
        with staged(tmp_path / name) as [tmp]:
            write(tmp)
        assert (tmp_path / name).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy", "x.npz"]
    assert np.load(tmp_path / "x.npz")["v"].tolist() == [0, 1, 2]

"""Writing files that other runs read: whole or not at all, and one writer at a time."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


def write_atomic(path, text: str) -> None:
    """Write `text` to `path` through a temporary file of its own in the same folder and an atomic
    rename: an interrupted run leaves the old file or the new one, and two writers at once leave
    one of theirs, never a mix. The file gets the usual mode (0666 less the umask)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make a shared cache file private
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def locked(path) -> Iterator[None]:
    """Hold an exclusive lock on `<path>.lock` (POSIX advisory; none where fcntl is missing) for a
    read-modify-write of `path`, so two processes updating it at once each keep their change."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock, as before
        yield
        return
    lock = Path(path).with_name(Path(path).name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)

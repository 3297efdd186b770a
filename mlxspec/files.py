"""Writing files that other runs read: whole or not at all, and one writer at a time."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path
from typing import Dict, Iterator, List


def write_atomic(path, text: str) -> None:
    """Write `text` to `path` through a temporary file of its own in the same folder and an atomic
    rename: an interrupted run leaves the old file or the new one, and two writers at once leave
    one of theirs, never a mix. The file gets the usual mode (0666 less the umask)."""
    write_all_atomic({path: text})


def write_all_atomic(texts: Dict[object, str]) -> None:
    """Write several files (path -> text) as `write_atomic` does, all or none: every text goes to
    its temporary file first, and only then do they replace the old files, in the order given.
    A full disk, or a folder where a file should be, leaves every old file as it was.

    Raises:
        OSError: naming the file (`filename`) whose writing failed.
    """
    staged = []  # (temporary, final)
    umask = os.umask(0)  # (read by setting it: put back at once)
    os.umask(umask)
    try:
        for path, text in texts.items():
            path = Path(path)
            if path.is_dir():  # os.replace would fail only after the files before it were replaced
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
                staged.append((tmp, path))
                with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                    f.write(text)
            except OSError as e:  # a full disk's error names no file
                raise OSError(e.errno, e.strerror or str(e), str(path)) from e
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make a shared cache file private
        for tmp, path in staged:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise


def save_safetensors(path, arrays: dict) -> None:
    """`mx.save_safetensors`, whose failed write (a RuntimeError without an errno) is raised as
    the OSError it was: ENOSPC where the disk has less free than the arrays take, else EIO, with
    the file named, so the callers' full-disk handling and the command line's one line apply."""
    import shutil

    import mlx.core as mx

    try:
        mx.save_safetensors(str(path), arrays)
    except RuntimeError as e:
        if "write" not in str(e).lower():
            raise
        free = shutil.disk_usage(Path(path).parent).free
        code = errno.ENOSPC if free < sum(a.nbytes for a in arrays.values()) else errno.EIO
        raise OSError(code, f"{os.strerror(code)} ({e})", str(path)) from None


def staged_path(path) -> Path:
    """Where a file is written whole before one rename makes it `path`: beside it, hidden, its
    suffix kept last (MLX's safetensors writer adds one otherwise): model.safetensors ->
    .model.tmp.safetensors. For a writer that is alone (a fixed name, not `write_atomic`'s)."""
    path = Path(path)
    return path.with_name(f".{path.stem}.tmp{path.suffix}")


@contextlib.contextmanager
def staged(*paths) -> Iterator[List[Path]]:
    """Write files whole or not at all, for one writer alone: yields, for each of `paths`, the
    `staged_path` to write it to. When the block ends they replace `paths`, back to back in the
    order given; when it raises (a full disk, Ctrl-C) they are removed, so neither half a file
    (which a later run would trust because it exists) nor a stray temporary one is left. A write
    error that names no file, or a temporary one (a full disk's), is raised naming the file meant.

        with staged(path) as [tmp]:
            np.save(tmp, array)
    """
    finals = [Path(p) for p in paths]
    tmps = [staged_path(p) for p in finals]
    try:
        yield tmps
    except BaseException as e:
        begun = [f for f, t in zip(finals, tmps) if t.exists()]
        for t in tmps:
            t.unlink(missing_ok=True)
        meant = dict(zip(map(str, tmps), finals)).get(str(e.filename)) if isinstance(e, OSError) else None
        if isinstance(e, OSError) and (meant or e.filename is None):
            raise OSError(e.errno, e.strerror or str(e), str(meant or (begun or finals)[-1])) from e
        raise
    for t, f in zip(tmps, finals):
        os.replace(t, f)


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

"""What the training scripts here share: the log, the work folder's files (written whole, read
or said damaged), argparse's number types, progress inside a long batch, the learning-rate
schedule, and a start and an end (Ctrl-C) that say what to do.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import random
import sys
import time
from pathlib import Path



def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def damaged(path, error: BaseException) -> SystemExit:
    """A work file that cannot be read (a run stopped while writing it, a full disk): which one,
    why, and what to do, instead of a reader's traceback."""
    return SystemExit(f"cannot read {path} ({type(error).__name__}: {error}): it is damaged (a run stopped while "
                      f"writing it, or a full disk?); delete it and run the same command again, which makes it anew")


def read_work(path, reader):
    """`reader(path)`, or `damaged(path)` raised if the file cannot be read."""
    try:
        return reader(path)
    except Exception as e:
        raise damaged(path, e) from None


def read_arrays(path, *keys, mapped: bool = False) -> tuple:
    """The arrays `keys` of an .npz work file, or `damaged(path)` raised if it cannot be read.

    `mapped`: each a read-only memory map of the file instead. A large target's features are
    gigabytes (600 K entries x 3,584 wide in float16 are 4.3 GB), which batches then read from
    disk as they need them instead of all of them staying in memory."""
    import numpy as np

    def whole(p):
        z = np.load(p)
        return tuple(z[k] for k in keys)
    return read_work(path, (lambda p: tuple(_mapped_member(p, k) for k in keys)) if mapped else whole)


def _mapped_member(path, key: str):
    """The array `key` of an .npz file as a read-only memory map of the file, where np.savez
    stored it uncompressed (a compressed one is read whole)."""
    import struct
    import zipfile

    import numpy as np

    with zipfile.ZipFile(path) as z:
        info = z.getinfo(key + ".npy")
    if info.compress_type != zipfile.ZIP_STORED:
        return np.load(path)[key]
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)  # the member's local header: its name's and extra field's lengths end it
        if local[:4] != b"PK\x03\x04":
            raise ValueError(f"no local header for {key}.npy")
        start = info.header_offset + 30 + sum(struct.unpack("<HH", local[26:30]))
        f.seek(start)
        major, _ = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        offset = f.tell()
    size = int(np.prod(shape)) * dtype.itemsize
    if dtype.hasobject or offset - start + size > info.file_size:
        raise ValueError(f"{key}.npy holds less than its header says")
    if not size:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=shape, order="F" if fortran else "C", offset=offset)


def room_for_maps(n: int) -> int:
    """How many of n memory maps may be made. Each keeps its file open (Python's mmap holds a
    descriptor of its own), so the soft limit on open files (256 on macOS by default) is raised
    towards n more than the process needs for itself, as far as the hard limit allows."""
    import resource

    own = 128  # the process's libraries, logs, checkpoints and what its libraries open
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= n + own:
        return n
    for limit in (n + own if hard == resource.RLIM_INFINITY else min(n + own, hard), 10240):
        try:  # macOS refuses more than its per-process maximum even under an unlimited hard limit
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(limit, soft), hard))
            soft = max(limit, soft)
            break
        except (ValueError, OSError):
            continue
    return max(0, min(n, soft - own))


def read_array(path, mapped: bool = False):
    """An .npy work file (`mapped`: as a read-only memory map, see `read_arrays`), or `damaged(path)` raised."""
    import numpy as np

    return read_work(path, lambda p: np.load(p, mmap_mode="r" if mapped else None))


def save_array(path: Path, array) -> None:
    """Write an .npy work file (a NumPy array) whole or not at all: a later run trusts it because it exists."""
    import numpy as np

    from mlxspec.files import staged

    with staged(path) as [tmp]:
        np.save(tmp, array)


def sized(n: int) -> str:
    """Bytes as people read them on a disk: GB from a tenth of one, else MB."""
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def entry_bytes(hidden: int, layers=()) -> int:
    """What one kept entry of an answer shard takes on disk: its id (int32) and its features
    (float16), the final hidden state and each tapped layer's output."""
    return 4 + 2 * hidden * (1 + len(layers))


def say_space(folder: Path, prompts, max_new: int, per_entry: int) -> int:
    """Before the answers are written: how much disk they take at most (every one of `prompts`,
    token ids, kept with an answer as long as `max_new` allows), and a warning where the disk
    holding `folder` has less free, before the hours that would end there rather than after them.
    Returns that many bytes."""
    import shutil

    entries = sum(len(ids) + max_new for ids in prompts)
    if not entries:
        return 0
    need, free = entries * per_entry, shutil.disk_usage(folder).free
    log(f"the answers and features still to write take up to {sized(need)} in {folder} ({sized(free)} free there)")
    if need > free:
        log("warning: they may not fit on that disk: free some space, give --work on another disk, or fewer "
            "prompts or a smaller --max-new; a run stopped by a full disk resumes from its last finished shard")
    return need


FULL_DISK = (errno.ENOSPC, errno.EDQUOT)


def full_disk(e: OSError, work=None) -> str:
    """What a trainer stopped by a full disk says, in one line: every write is staged
    (`mlxspec.files.staged`), so the unfinished file is gone and the finished ones are kept."""
    move = f"move {work} to another disk and give it as --work" if work else \
        "move the --work folder to another disk and give it as --work"
    return (f"the disk is full (writing {e.filename or work}); the unfinished file was removed. Free some space, "
            f"or {move}: the same command resumes from the last finished stage, shard or checkpoint")


GEN_BATCH = 48  # the answers' default batch: its shards keep the names they always had

RESUMES = "interrupted: the same command resumes from the last finished stage, shard or checkpoint"


def run_main(main, interrupted: str = RESUMES) -> None:
    """`main()`, with Ctrl-C said in one line (`interrupted`: the trainers resume, a measurement
    does not) and the usual exit status (130), and mlxspec's own errors (a model or head not
    found, a head made for another target) in one line, exit status 1; else main()'s status."""
    from mlxspec.errors import MlxSpecError

    try:
        status = main()
    except KeyboardInterrupt:
        print(f"\n{interrupted}", file=sys.stderr)
        sys.exit(130)
    except MlxSpecError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:
        if e.errno not in FULL_DISK or interrupted != RESUMES:
            raise
        print(f"error: {full_disk(e)}", file=sys.stderr)
        sys.exit(1)
    sys.exit(status)


def unwritable_folder(folder: Path) -> str:
    """Why no file can be written in `folder`, made if missing ("" when one can): said before
    the hours of work that end writing there, not after them."""
    if folder.exists() and not folder.is_dir():
        return "is a file, not a folder"
    there = folder
    while not there.exists():  # the nearest part of the path that is there
        there = there.parent
    if not there.is_dir():
        return f"{there} is a file, so no folder can be made under it"
    if not os.access(there, os.W_OK | os.X_OK):
        return "is not writable" if there == folder else f"{there} is not writable, so no folder can be made in it"
    return ""


HEARTBEAT = 30.0  # seconds between progress lines inside one batch of answers (minutes on a CPU)


def batch_progress(n: int, count: int, name: str):
    """A logger for batch n (0-based) of `count` answer batches: `say(what)` prints how far it got
    and the seconds since this call."""
    t0 = time.time()

    def say(what: str) -> None:
        log(f"  batch {n + 1}/{count} {name}: {what}, {time.time() - t0:.0f}s")
    return say


def _duration(seconds: float) -> str:
    return "under a minute" if seconds < 60 else f"about {seconds / 60:.0f} min"


class AnswerClock:
    """The answer stage's line per batch written: that batch's answer tokens, the run's so far and
    their rate, and how long the batches still to make (`todo` at the start) would take at this
    run's pace per batch: a guide, since batches of longer prompts come later."""

    def __init__(self, count: int, todo: int, clock=time.time):
        self.count, self.todo, self.clock, self.made, self.batches = count, todo, clock, 0, 0
        self.t0 = clock()

    def done(self, n: int, name: str, tokens: int) -> None:
        self.made, self.batches, self.todo = self.made + tokens, self.batches + 1, self.todo - 1
        el = max(self.clock() - self.t0, 1e-9)
        left = f"; {self.todo} to go, {_duration(el / self.batches * self.todo)} at this pace" if self.todo > 0 else ""
        log(f"generate {n + 1}/{self.count} {name}: {tokens} answer tokens; {self.made} in {el:.0f}s so far "
            f"({self.made / el:.1f} tok/s){left}")


def lr_scale(step: int, total: int, warm: int) -> float:
    """The learning rate's fraction of its peak at `step` of `total`: linear warm-up over `warm`
    steps, then a cosine to the end, never below 2 % (every trainer here uses this schedule)."""
    f = (step + 1) / warm if step < warm else 0.5 * (1 + math.cos(math.pi * (step - warm) / (total - warm)))
    return max(f, 0.02)


def _number(kind, low, *, strict: bool, what: str):
    """An argparse type: a finite `kind` at least (`strict`: above) `low`, or an error naming `what`."""
    def parse(text: str):
        try:
            x = kind(text)
        except ValueError:
            x = None
        if x is None or not math.isfinite(x) or (x <= low if strict else x < low):
            raise argparse.ArgumentTypeError(f"{text!r}: give {what}")
        return x
    return parse


positive_int = _number(int, 1, strict=False, what="a whole number of at least 1")
non_negative_int = _number(int, 0, strict=False, what="a whole number of at least 0")
positive_float = _number(float, 0.0, strict=True, what="a finite number above 0")
non_negative_float = _number(float, 0.0, strict=False, what="a finite number of at least 0")


def start(args):
    """Threads capped, seeds set, the work folder made: (work folder, start time). Shared with train_eagle.py."""
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    try:
        import torch
    except ModuleNotFoundError:
        instead = ("; or give --target REF instead of --gguf: every stage then runs in MLX"
                   if hasattr(args, "target") else "")
        raise SystemExit("this trainer runs the target in PyTorch, which is not installed: pip install torch "
                         f"accelerate{instead}") from None

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    return work, time.time()


"""argparse value types shared by the commands: bad values fail with what is allowed."""

from __future__ import annotations

import argparse
import os
import tempfile


def num_draft(s: str):
    """'auto' -> None (the cost model picks), else an integer in [0, MAX_DRAFT]."""
    from mlxspec.prompts import MAX_DRAFT

    if s == "auto":
        return None
    try:
        n = int(s)
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_DRAFT:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer in 0..{MAX_DRAFT}, got {s!r}")
    return n


def _number(s: str, ok, allowed: str) -> float:
    """`s` as a float that `ok` accepts (NaN never is), or what is allowed, said."""
    try:
        x = float(s)
    except ValueError:
        x = float("nan")
    if not ok(x):
        raise argparse.ArgumentTypeError(f"expected {allowed}, got {s!r}")
    return x


def non_negative(s: str) -> float:
    return _number(s, lambda x: 0 <= x < float("inf"), "a finite number >= 0")


def top_p(s: str) -> float:
    """A nucleus threshold."""
    return _number(s, lambda x: 0 < x <= 1, "a number in (0, 1], 1 disabling it")


def min_p(s: str) -> float:
    """A fraction of the top probability."""
    return _number(s, lambda x: 0 <= x < 1, "a number in [0, 1), 0 disabling it")


def finite(s: str) -> float:
    return _number(s, lambda x: abs(x) < float("inf"), "a finite number")


def probability(s: str) -> float:
    """XTC's chance of firing at a position."""
    return _number(s, lambda x: 0 <= x <= 1, "a number in [0, 1], 0 disabling it")


def xtc_threshold(s: str) -> float:
    return _number(s, lambda x: 0 <= x <= 0.5, "a number in [0, 0.5]")


def at_least_one(s: str) -> float:
    return _number(s, lambda x: 1 <= x < float("inf"), "a finite number >= 1")


def look_back(s: str) -> int:
    """A count of tokens looked back over: -1 all of them, 0 none."""
    try:
        n = int(s)
    except ValueError:
        n = -2
    if n < -1:
        raise argparse.ArgumentTypeError(f"expected an integer >= -1 (-1: all the tokens, 0: off), got {s!r}")
    return n


def positive(s: str) -> int:
    try:
        n = int(s)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {s!r}")
    return n


def count(s: str) -> int:
    """An integer >= 0."""
    try:
        n = int(s)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {s!r}")
    return n


UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def size_bytes(s: str) -> int:
    """A size in bytes: an integer, or a number with a unit (512MB, 1.5GiB; KB/MB/GB are powers of 1000)."""
    text = s.strip().lower().replace(" ", "")
    number = text.rstrip("kmgib")
    unit = text[len(number):]
    try:
        n = float(number) * UNITS[unit]
    except (ValueError, KeyError):
        n = -1.0
    if not 0 <= n < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a size such as 2000000000, 512MB or 1.5GiB, got {s!r}")
    return int(n)


def positive_size(s: str) -> int:
    """A size in bytes of at least one (`size_bytes`)."""
    n = size_bytes(s)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a size of at least 1 byte, such as 8388608, 16MB or 64MiB, "
                                         f"got {s!r}")
    return n


def web_origin(s: str) -> str:
    """A web page's origin, scheme://host[:port] (as browsers send it in `Origin`), or "*" for any."""
    from urllib.parse import urlsplit

    if s == "*":
        return s
    try:
        parts = urlsplit(s.rstrip("/"))
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        parts, port_ok = None, False
    if not (parts and port_ok and parts.scheme in ("http", "https") and parts.hostname and not parts.path
            and not parts.query and not parts.fragment and not parts.username):
        raise argparse.ArgumentTypeError(f"expected an origin such as https://chat.example.com or "
                                         f"http://192.168.1.5:3000 (scheme, host and port only), or *, got {s!r}")
    return s.rstrip("/")


def template_args(s: str) -> dict:
    """A JSON object of chat-template variables, e.g. '{"enable_thinking": false}'."""
    import json

    from ..errors import InvalidArgumentError
    from ..prompts import check_template_kwargs

    try:
        return check_template_kwargs(json.loads(s))
    except (ValueError, InvalidArgumentError) as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object of template variables such as "
                                         f"'{{\"enable_thinking\": false}}', got {s!r} ({e})") from None


def seed(s: str) -> int:
    """An integer in [0, 2**64): the seeds the random streams key on (more would alias)."""
    from mlxspec.prompts import MAX_SEED

    try:
        n = int(s)
    except ValueError:
        n = -1
    if not 0 <= n < MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 and < 2**64, got {s!r}")
    return n


def tree(s: str):
    """'auto' or 'off' as given, else a node cap: an integer in [1, MAX_DRAFT]."""
    from mlxspec.prompts import MAX_DRAFT

    if s in ("auto", "off"):
        return s
    try:
        n = int(s)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_DRAFT:
        raise argparse.ArgumentTypeError(f"expected 'auto', 'off' or an integer in 1..{MAX_DRAFT}, got {s!r}")
    return n


def on_off(s: str) -> str:
    if s not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected 'on' or 'off', got {s!r}")
    return s


def output_path(s: str) -> str:
    """A file this run will write at its end: checked now, so minutes of work are not lost to a typo."""
    folder = os.path.dirname(os.path.abspath(s))
    if os.path.isdir(s):
        raise argparse.ArgumentTypeError(f"{s!r} is a folder; give a file path in it")
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{folder!r} is a file, not a folder; give a path in a folder")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"the folder {folder!r} does not exist; create it or give another path")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"the folder {folder!r} is not writable")
    if os.path.exists(s) and not os.access(s, os.W_OK):
        raise argparse.ArgumentTypeError(f"{s!r} exists and is not writable")
    # Permission bits do not tell everything (root passes them; /proc, a read-only mount): a file
    # made and removed there now does, and leaves nothing behind.
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".mlxspec-probe-")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot write in the folder {folder!r}: {e.strerror or e}") from None
    return s


def data_path(s: str) -> str:
    """`output_path`, or "-" for stdout."""
    return s if s == "-" else output_path(s)


def reference(s: str) -> str:
    """A pair name or a model reference: anything but blank (a blank one used to mean the demo)."""
    if not s.strip():
        raise argparse.ArgumentTypeError(f"expected a pair name (see `mlxspec models`) or a model reference, got {s!r}")
    return s


def folder(s: str) -> str:
    """A folder's path (whether it exists and what it holds is said by whoever reads it): not blank."""
    if not s.strip():
        raise argparse.ArgumentTypeError(f"expected a folder's path, got {s!r}")
    return s


def kv_window(s: str) -> int:
    """--max-kv-size: the engine's rule (`cache.check_max_kv_size`), said in the flag's terms."""
    n = positive(s)
    if n < 5:
        raise argparse.ArgumentTypeError(f"expected an integer >= 5 (4 tokens are always kept), got {s!r}")
    return n

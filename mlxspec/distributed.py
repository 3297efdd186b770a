"""Rank 0 decides, every rank follows: the one place mlxspec talks to the other ranks.

With the target sharded over an `mx.distributed` group, every target pass runs collectives
inside the model, so every rank must run exactly the same passes in the same order. Every
rank runs the same loop and computes its own decisions (draft lengths from its own cost
model, which learns from its own timings), then `Coordinator.decide` replaces them by rank
0's: one all-sum of a few ints in which the other ranks contribute zeros. The drafter is
replicated (same history, same seed, same draft tokens on every rank), so only the
lengths travel. A check value per rank (a hash of the committed history) rides in the
same all-sum, so ranks whose outputs diverge stop with an error instead of feeding the
sharded layers different inputs.

Ring collectives run in submission order on one stream, so a decision waits for the pass
already in flight; the loop therefore decides right after each read, when none is.

A rank that dies makes the ring report a lost connection on the others; a rank that hangs
is caught by a watchdog thread that ends the process when one wait on the other ranks
exceeds `timeout` seconds (`MLXSPEC_DISTRIBUTED_TIMEOUT`, default 120).

In a single process (no group, or a group of one) `decide` and `share` return their
argument and `watched` returns the function it is given: the single-process loop pays
nothing.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

import mlx.core as mx

from .errors import InvalidArgumentError, MlxSpecError

TIMEOUT_ENV = "MLXSPEC_DISTRIBUTED_TIMEOUT"
DEFAULT_TIMEOUT = 120.0  # seconds one wait on the other ranks may take before the watchdog ends the process
EXIT_STATUS = 3  # process exit status when the watchdog fires
_HASH_MOD = (1 << 61) - 1


class DistributedError(MlxSpecError):
    """The ranks of a distributed engine disagree (weights, tokenizers, outputs) or lost each other."""


def is_distributed(engine) -> bool:
    """The engine's target is sharded over several ranks (its Coordinator is active)."""
    return bool(getattr(getattr(engine, "coord", None), "active", False))


def launched_rank() -> int:
    """This process's rank as mlx.launch numbered it (MLX_RANK), known before the group is
    joined; 0 for a process it did not start."""
    try:
        return int(os.environ.get("MLX_RANK", "0"))
    except ValueError:
        return 0


def history_hash(tokens: Sequence[int], h: int = 0) -> int:
    """A rolling hash of token ids, never 0 (0 means "no check" to `decide`); extend with `h`."""
    for t in tokens:
        h = (h * 1_000_003 + t + 1) % _HASH_MOD
    return h or 1


class Coordinator:
    """Decisions and requests from rank 0 for every rank of `group`.

    Args:
        group: an `mx.distributed.Group`, or None (a single process).
        timeout: seconds one wait on the other ranks may take. Default: the environment
            variable MLXSPEC_DISTRIBUTED_TIMEOUT, else 120.
    """

    def __init__(self, group=None, *, timeout: Optional[float] = None):
        self.group = group
        self.size = group.size() if group is not None else 1
        self.rank = group.rank() if group is not None else 0
        self.active = self.size > 1
        self.is_main = self.rank == 0
        self.timeout = check_timeout(timeout if timeout is not None else os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT)
        self.decisions = 0  # decisions taken (all-sums issued by `decide`)
        self.decision_seconds = 0.0  # time spent in them
        self.broken = False  # a collective failed: the group is unusable
        self._watchdog = _Watchdog(self.timeout, self.rank) if self.active else None

    def __repr__(self) -> str:
        return f"Coordinator(rank={self.rank}, size={self.size})"

    def decide(self, values: List[int], *, check: Optional[int] = None) -> List[int]:
        """Rank 0's `values` on every rank: one all-sum of len(values) + size int64s.

        Args:
            values: this rank's decisions (ignored on the other ranks).
            check: a value every rank must agree on (e.g. `history_hash`), or None (no check).

        Raises:
            DistributedError: two ranks gave different non-None checks.
        """
        if not self.active:
            return values
        t = time.perf_counter()
        n = len(values)
        x = [0] * (n + self.size)
        if self.is_main:
            x[:n] = values
        x[n + self.rank] = check or 0
        out = self._wait(lambda: self._all_sum(x), "a decision")
        self.decisions += 1
        self.decision_seconds += time.perf_counter() - t
        checks = [c for c in out[n:] if c]
        if check and len(set(checks)) > 1:
            self.broken = True
            raise DistributedError(
                f"rank {self.rank}: the ranks' outputs diverged (history hashes {out[n:]}); their weights, "
                f"tokenizers or MLX builds differ")
        return out[:n]

    def share(self, obj):
        """Rank 0's JSON-able `obj` on every rank (two all-sums). The other ranks may wait here for
        rank 0's next request as long as it takes; rank 0 only for them to be there (watched)."""
        if not self.active:
            return obj

        def both():
            data = json.dumps(obj).encode() if self.is_main else b""
            size = self._all_sum([len(data) if self.is_main else 0])[0]
            buf = mx.array(list(data), dtype=mx.uint8) if self.is_main else mx.zeros((size,), mx.uint8)
            return mx.distributed.all_sum(buf, group=self.group, stream=mx.cpu).tolist()

        if self.is_main:
            out = self._wait(both, "the other ranks to take the next request")
        else:
            try:
                out = both()
            except RuntimeError as e:  # the ring reports a peer that went away
                self.broken = True
                raise DistributedError(f"rank {self.rank}: lost rank 0 while waiting for its next request: {e}") from e
        return json.loads(bytes(out).decode())

    def gather(self, values: List[int], what: str) -> List[List[int]]:
        """Every rank's `values` (same length on every rank), in rank order; watched."""
        if not self.active:
            return [list(values)]
        n = len(values)
        x = [0] * (n * self.size)
        x[self.rank * n:(self.rank + 1) * n] = values
        out = self._wait(lambda: self._all_sum(x), what)
        return [out[r * n:(r + 1) * n] for r in range(self.size)]

    def agree(self, fingerprints: Dict[str, int], *, failed: bool = False) -> None:
        """Check that every rank has the same fingerprints (and that none failed); one all-sum.

        Args:
            fingerprints: name -> int below 2**62; the same names on every rank, a failed one included.
            failed: this rank could not produce them (it raises its own error afterwards).

        Raises:
            DistributedError: on every rank, naming the ranks that failed or the fingerprints that differ.
        """
        if not self.active:
            return
        names = sorted(fingerprints)
        rows = self.gather([int(failed)] + [fingerprints[k] for k in names], "the other ranks' models")
        bad = [r for r, row in enumerate(rows) if row[0]]
        if bad:
            raise DistributedError(f"rank(s) {bad} could not load the models (their own output says why)")
        differ = [name for i, name in enumerate(names) if len({row[1 + i] for row in rows}) > 1]
        if differ:
            raise DistributedError(
                f"the ranks' {', '.join(differ)} differ (rank {self.rank} of {self.size}); every rank must load "
                f"the same checkpoint, tokenizer and head with the same options: copy the same files to every host "
                f"and start every rank with the same command")

    def watched(self, fn: Callable, what: str) -> Callable:
        """`fn` itself in a single process; else `fn` under the watchdog (it waits on the other
        ranks), which names `what` it waited for if they do not come."""
        if not self.active:
            return fn

        def call(*args, **kwargs):
            return self._wait(lambda: fn(*args, **kwargs), what)

        return call

    def _all_sum(self, values: List[int]) -> List[int]:
        return mx.distributed.all_sum(mx.array(values, dtype=mx.int64), group=self.group, stream=mx.cpu).tolist()

    def _wait(self, fn: Callable, what: str):
        self._watchdog.arm(what)
        try:
            return fn()
        except RuntimeError as e:  # the ring reports a peer that went away
            self.broken = True
            raise DistributedError(f"rank {self.rank}: lost the other ranks while waiting for {what}: {e}") from e
        finally:
            self._watchdog.disarm()


class _Watchdog:
    """Ends the process when an armed wait outlives `timeout`: a hung rank must not hang the others."""

    def __init__(self, timeout: float, rank: int):
        self.timeout, self.rank = timeout, rank
        self._deadline: Optional[float] = None
        self._what = ""
        threading.Thread(target=self._run, name="mlxspec-watchdog", daemon=True).start()

    def arm(self, what: str) -> None:
        self._what = what
        self._deadline = time.monotonic() + self.timeout

    def disarm(self) -> None:
        self._deadline = None

    def _run(self) -> None:
        tick = min(1.0, self.timeout / 4)
        while True:
            time.sleep(tick)
            deadline = self._deadline
            if deadline is not None and time.monotonic() > deadline:
                sys.__stderr__.write(
                    f"mlxspec: error: rank {self.rank} waited more than {self.timeout:.0f} s for the other ranks "
                    f"({self._what}); one of them died or hangs. Exiting (set {TIMEOUT_ENV} to wait longer).\n")
                sys.__stderr__.flush()
                os._exit(EXIT_STATUS)


def check_timeout(value) -> float:
    """The watchdog's seconds: a finite number > 0 (from the argument or MLXSPEC_DISTRIBUTED_TIMEOUT)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise InvalidArgumentError(f"{TIMEOUT_ENV} (the seconds a rank waits for the others) must be a finite "
                                   f"number > 0, got {value!r}")
    return seconds


def init_group(backend: str = "any"):
    """Join the group `mlx.launch` set up; a group of one when the process was not launched that way.
    A launched rank whose peers never join (a host not started, or started without --distributed)
    ends after the watchdog's timeout, with a dump of where it waited, rather than wait forever."""
    if "MLX_RANK" not in os.environ:  # not launched: nothing to wait for
        return mx.distributed.init(backend=backend)
    import faulthandler

    # MLX holds the GIL while it waits here, so no Python thread can watch it: faulthandler's own does
    faulthandler.dump_traceback_later(check_timeout(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT), exit=True,
                                      file=sys.__stderr__)
    try:
        return mx.distributed.init(backend=backend)
    finally:
        faulthandler.cancel_dump_traceback_later()

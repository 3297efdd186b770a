"""Which device MLX computes on: the one answer every module asks (precision defaults, cost
priors, calibration keys, reports). Low-level on purpose: it imports nothing of mlxspec but `blas`."""

from __future__ import annotations

import os
import platform
import threading
import weakref

from . import blas

BACKENDS = ("metal", "cuda", "cpu")


def backend() -> str:
    """"metal" (Apple GPU), "cuda" (MLX's CUDA backend on an NVIDIA GPU) or "cpu", for the default device."""
    import mlx.core as mx

    if mx.default_device().type != mx.gpu:
        return "cpu"
    if mx.metal.is_available():
        return "metal"
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        return "cuda"
    return "cpu"


CUDNN_SDPA_VAR = "MLX_CUDA_USE_CUDNN_SDPA"


def adopt_attention() -> None:
    """Keep MLX's CUDA attention off cuDNN for this process, unless the user set CUDNN_SDPA_VAR.

    MLX builds a cuDNN plan for each new (query rows, key length) of a float16/bfloat16
    attention with more than one query row: every verify pass has a new key length, so on an
    H100 each speculative round paid a plan build (the head at k = 2 ran at 0.26x plain
    decoding in float16). Without cuDNN, rows < 4 take MLX's vector kernel and longer passes its
    unfused ops, which build nothing per shape (prefill too: a long prompt's chunks then hold
    their scores in memory). MLX reads the variable once, at its first attention, so this runs
    at import. It changes nothing on Metal or the CPU, nor where activations are float32, which
    cuDNN never takes (the demo GGUF's float32 norms make them so)."""
    os.environ.setdefault(CUDNN_SDPA_VAR, "0")


def is_gpu() -> bool:
    """True on Metal and CUDA: the device runs asynchronously and small passes are launch-bound."""
    return backend() != "cpu"


def float32_matmul_roundoff() -> float:
    """Unit roundoff of a float32 matmul's inputs on this backend: MLX's CUDA backend multiplies
    float32 in TF32 (10-bit mantissa, 2**-11), the others in full float32 (2**-24)."""
    return 2.0 ** -11 if backend() == "cuda" else 2.0 ** -24


def clear_streams() -> None:
    """Free the calling thread's MLX streams; a thread that used MLX calls this as it ends.
    What registered to settle first on this thread (`clear_streams_at_thread_exit`) does so now.

    MLX keeps streams per thread and, left behind, they can abort the process at exit.
    """
    sweeper = getattr(_swept, "sweeper", None)
    if sweeper is not None:
        sweeper.settle()
    _clear_mlx_streams()


def _clear_mlx_streams() -> None:
    import mlx.core as mx

    clear = getattr(mx, "clear_streams", None)  # MLX >= 0.30
    if clear is not None:
        clear()


class _Sweeper:
    """Held in a threading.local: CPython drops it on its own thread as that thread ends, while
    MLX's streams for the thread still exist."""

    def __init__(self) -> None:
        self.ident = threading.get_ident()
        self.keepers: "weakref.WeakSet" = weakref.WeakSet()  # objects whose thread_ending() runs first

    def settle(self) -> None:
        """Each keeper's thread_ending(), once: the streams go next."""
        keepers, self.keepers = list(self.keepers), weakref.WeakSet()
        for keeper in keepers:
            try:
                keeper.thread_ending()
            except Exception:  # a thread's end has nobody to tell; the next use says what is wrong
                pass

    def __del__(self) -> None:
        if threading.get_ident() != self.ident:  # not at interpreter shutdown, from another thread
            return
        self.settle()
        _clear_mlx_streams()


_swept = threading.local()


def clear_streams_at_thread_exit(keeper=None) -> None:
    """Free the calling thread's MLX streams when it ends (not the main thread's, which the
    process frees), after `keeper.thread_ending()` (weakly held; e.g. an engine evaluating the
    arrays it keeps, which would otherwise die with the streams that were to compute them).

    For threads mlxspec does not own (a user's pool running `Engine.generate`): without it, such
    a process aborted at exit about one run in five (MLX 0.32). A thread cannot free them any
    earlier: after `clear_streams` it cannot use MLX again."""
    if threading.current_thread() is threading.main_thread():
        return
    sweeper = getattr(_swept, "sweeper", None)
    if sweeper is None:
        sweeper = _swept.sweeper = _Sweeper()
    if keeper is not None:
        sweeper.keepers.add(keeper)


def device_name() -> str:
    """The chip's name as MLX reports it (e.g. "Apple M2 Pro", "NVIDIA H100 80GB HBM3"), else the machine type."""
    import mlx.core as mx

    info_fn = getattr(mx, "device_info", None)
    if info_fn is None and mx.metal.is_available():
        info_fn = mx.metal.device_info
    try:
        name = (info_fn() if info_fn else {}).get("device_name")
    except Exception:  # device_info is informational; never fail a bench over it
        name = None
    return str(name or platform.processor() or platform.machine() or "unknown")


def describe() -> dict:
    """{"backend", "name", "os", "blas"} for reports; "blas" names what MLX's CPU matmuls run on.
    On CUDA also "cudnn_attention": whether attention may take cuDNN (`adopt_attention`)."""
    b = backend()
    out = {"backend": b, "name": device_name(), "os": platform.platform(terse=True), "blas": blas.info()["name"]}
    if b == "cuda":
        out["cudnn_attention"] = os.environ.get(CUDNN_SDPA_VAR, "1") != "0"
    return out

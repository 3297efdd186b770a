"""Which BLAS MLX's CPU float32 matmuls run on, and a faster one where MLX would use the reference BLAS.

MLX's Linux CPU wheel bundles netlib's reference BLAS (`mlx_cpu.libs/libblas-*.so`): about
2 GFLOP/s per x86 core, so a float32 matmul of k rows costs nearly k one-row ones, the one
regime where speculative decoding cannot pay. MLX binds `cblas_sgemm` when `mlx.core` is
imported (Python loads extensions with RTLD_NOW), and the dynamic linker searches the
process's global scope before a library's own dependencies, so a system BLAS loaded with
RTLD_GLOBAL before that import takes the reference BLAS's place. `import mlxspec` does it.

Measured on 2 x86 cores, demo target, 128-token prefix (`scripts/measure_precision.py`):
one new token 84.6 ms in float32 with OpenBLAS against 153.5 ms in bfloat16 (the fastest
precision with the reference BLAS); five new tokens 141.8 ms against 395.8 ms.

`MLXSPEC_BLAS`: "auto" (default: a system OpenBLAS, else BLIS, when MLX bundles the reference
BLAS; Debian/Ubuntu: `apt install libopenblas0`), "off" (keep MLX's own), or the path of a
shared library that exports `cblas_sgemm`. On macOS MLX uses Accelerate and nothing changes.

Low-level on purpose: it imports nothing of mlxspec but `errors`, and never `mlx.core`.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import os
import sys
import warnings

from .errors import InvalidArgumentError

ENV = "MLXSPEC_BLAS"
CANDIDATES = ("openblas", "blis")  # fastest first; each must export cblas_sgemm
_FALLBACK_DIRS = ("/usr/lib/*-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib", "/home/linuxbrew/.linuxbrew/lib")

_state: dict = {}  # set once by adopt(): {"name", "path", "note"}


def bundled_reference() -> str | None:
    """Path of the reference BLAS bundled with MLX's wheel, or None (found without importing mlx.core)."""
    spec = importlib.util.find_spec("mlx")
    if spec is None or not spec.submodule_search_locations:
        return None
    # `mlx` is a namespace package: a folder named mlx in the script's directory or the working
    # one comes first in its path, so look beside every part of it, not only the first.
    for part in spec.submodule_search_locations:
        found = sorted(glob.glob(os.path.join(os.path.dirname(part), "mlx*.libs", "libblas*.so*")))
        if found:
            return found[0]
    return None


def find(name: str) -> str | None:
    """A loadable path for library `name` ("openblas", "blis"), or None: the dynamic linker's cache
    first, then the usual folders. (Not ctypes.util.find_library: a miss there runs a compiler,
    tens of milliseconds on every `import mlxspec` of a machine without the library.)"""
    for line in _ldconfig():
        soname, _, path = line.partition(" => ")
        if soname.strip().split(" ")[0].startswith(f"lib{name}.so") and path:
            return path.strip()
    for d in _FALLBACK_DIRS:
        found = sorted(glob.glob(os.path.join(d, f"lib{name}.so*")))
        if found:
            return found[0]
    return None


@functools.lru_cache(maxsize=1)
def _ldconfig() -> tuple:
    """Lines of `ldconfig -p` (the linker's cache), or () where there is none."""
    import subprocess

    for exe in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=5,
                                 env={"LC_ALL": "C", "LANG": "C"})
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0:
            return tuple(out.stdout.splitlines()[1:])
    return ()


def _load(path: str):
    """dlopen `path` into the global scope; the handle, or raise OSError / ValueError saying why."""
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    if not hasattr(lib, "cblas_sgemm"):
        raise ValueError(f"{path} does not export cblas_sgemm")
    return lib


def adopt() -> dict:
    """Load a faster BLAS for MLX's CPU matmuls when there is reason to (see the module docstring).

    Idempotent; returns `info()`. Must run before `mlx.core` is imported to have any effect.

    Raises:
        InvalidArgumentError: MLXSPEC_BLAS names a library that cannot be loaded or has no cblas_sgemm.
    """
    if not _state:
        _state.update(_decide(os.environ.get(ENV, "auto").strip() or "auto"))
    return info()


def _decide(request: str) -> dict:
    """{"name", "path", "note"} for the MLXSPEC_BLAS value `request`, loading a library where one is chosen."""
    if sys.platform == "darwin":
        return dict(name="accelerate", path=None, note="MLX links Apple's Accelerate")
    reference = bundled_reference()
    mlx_own = "reference" if reference else "mlx"
    if request == "off":
        return dict(name=mlx_own, path=reference, note=f"{ENV}=off")
    if "mlx.core" in sys.modules:
        note = "mlx.core was imported before mlxspec, so MLX keeps the BLAS it bound then"
        if request != "auto":
            warnings.warn(f"{ENV}={request!r} ignored: {note}; import mlxspec first", stacklevel=4)
        return dict(name=mlx_own, path=reference, note=note)
    if request != "auto":
        try:
            _load(request)
        except (OSError, ValueError) as e:
            raise InvalidArgumentError(
                f"{ENV}={request!r} cannot be used: {e}. Allowed: 'auto' (a system OpenBLAS or BLIS if "
                f"installed), 'off' (MLX's own BLAS), or the path of a shared library exporting cblas_sgemm"
            ) from None
        return dict(name="custom", path=request, note=f"{ENV}={request}")
    if reference is None:  # MLX was built against some other BLAS: leave it be
        return dict(name="mlx", path=None, note="MLX's own BLAS (not the bundled reference)")
    for name in CANDIDATES:
        path = find(name)
        if path is None:
            continue
        try:
            _load(path)
        except (OSError, ValueError):
            continue
        return dict(name=name, path=path, note="loaded in place of MLX's bundled reference BLAS")
    return dict(name="reference", path=reference,
                note="MLX's bundled reference BLAS; install OpenBLAS (e.g. `apt install libopenblas0`) for faster CPU matmuls")


def info() -> dict:
    """{"name", "path", "note"}: the BLAS MLX's CPU float32 matmuls use. `name` is "openblas",
    "blis", "custom" (MLXSPEC_BLAS path), "accelerate", "reference" (netlib, slow) or "mlx"
    (whatever MLX was built with)."""
    if not _state:
        adopt()
    return dict(_state)


def fast() -> bool:
    """True when float32 matmuls run on a BLAS that mlxspec loaded (found, or named by
    MLXSPEC_BLAS), so float32 is the faster CPU precision; False for the reference BLAS and for
    anything unmeasured."""
    return info()["name"] in ("openblas", "blis", "custom")


LABELS = {"openblas": "OpenBLAS", "blis": "BLIS", "reference": "reference BLAS", "accelerate": "Accelerate",
          "custom": "MLXSPEC_BLAS", "mlx": "MLX's BLAS"}


def label(name: str) -> str:
    """How reports write a BLAS `name` from `info()` ("openblas" -> "OpenBLAS")."""
    return LABELS.get(name, name)

"""mlxspec: lossless speculative decoding on MLX.

    import mlxspec
    engine = mlxspec.load("demo")
    print(engine.generate("Write a haiku about the sea", max_tokens=64).text)
"""

__version__ = "0.1.0"

from . import errors  # noqa: E402
from .errors import (  # noqa: E402
    ContextLengthError,
    IncompatibleModelsError,
    InvalidArgumentError,
    MlxSpecError,
    ModelNotFoundError,
    NumericalError,
    StreamOvertakenError,
)
from . import blas as _blas  # noqa: E402

_blas.adopt()  # before anything imports mlx.core: MLX binds its BLAS then (see blas.py)
from . import device as _device  # noqa: E402

_device.adopt_attention()  # before any attention runs: MLX reads it once (see device.py)


def __getattr__(name):
    # Lazy so `import mlxspec` (and `mlxspec --help`) does not pay for MLX start-up.
    if name == "Engine":
        from .engine import Engine

        return Engine
    if name == "load":
        from .loading import load

        return load
    if name == "verify":
        import importlib

        return importlib.import_module(".verify", __name__)
    raise AttributeError(f"module 'mlxspec' has no attribute {name!r}")


__all__ = [
    "Engine",
    "load",
    "verify",
    "errors",
    "MlxSpecError",
    "InvalidArgumentError",
    "IncompatibleModelsError",
    "ModelNotFoundError",
    "ContextLengthError",
    "NumericalError",
    "StreamOvertakenError",
]

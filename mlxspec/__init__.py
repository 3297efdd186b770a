"""mlxspec: lossless speculative decoding on MLX.

    import mlxspec
    engine = mlxspec.load("demo")
    print(engine.generate("Write a haiku about the sea", max_tokens=64).text)

Entry points (loaded on first use, so `import mlxspec` does not start MLX):
    mlxspec.load(target, draft=None, *, dtype, drafter, max_kv_size, num_draft, tree, head, ...)
        -> Engine: a pair name, a model folder, a .gguf or a repo id; help(mlxspec.load)
    mlxspec.Engine(target_model, tokenizer, draft_model=None, ...): your own mlx-lm models;
        Engine.generate(prompt, ...) and Engine.stream(prompt, ...); help(mlxspec.Engine)
"""

__version__ = "0.1.0"

from . import errors  # noqa: E402
from .errors import (  # noqa: E402
    ContextLengthError,
    EngineBusyError,
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


def __dir__():  # the lazy names too: dir(), tab completion
    return sorted(set(globals()) | set(__all__))


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
    "EngineBusyError",
]

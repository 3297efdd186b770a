"""Errors raised by mlxspec. Every message says what was wrong and what is allowed."""

import math


def shown(value) -> str:
    """A short rendering of a received value for error messages (a 400-digit number is not echoed whole)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def one_line(error: BaseException, limit: int = 300) -> str:
    """An error's text on one line, cut at `limit` characters (a library's may list every weight)."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class MlxSpecError(Exception):
    """Base class of every error mlxspec raises on purpose."""


class InvalidArgumentError(MlxSpecError, ValueError):
    """An argument is out of its allowed range or of the wrong kind."""


class IncompatibleModelsError(MlxSpecError):
    """Target and draft cannot be paired (vocabularies differ), or a model's cache cannot roll back."""


class ModelNotFoundError(MlxSpecError):
    """A model reference could not be resolved to usable weights."""


class ContextLengthError(MlxSpecError):
    """A prompt does not fit in the model's context and no window is set. (A prompt that fits
    generates until the context is full, then ends with finish_reason "length".)"""


class NumericalError(MlxSpecError):
    """A model produced NaN or infinite logits."""


class CacheRollbackError(MlxSpecError):
    """A KV cache was asked to roll back further than it keeps history for."""


class EngineBusyError(MlxSpecError, RuntimeError):
    """A thread asked an engine for a generation while another thread's was running on it."""


class StreamOvertakenError(MlxSpecError, RuntimeError):
    """A stream was resumed after a later generate/stream call on the same engine took it over."""

"""Which device MLX computes on, as the bench and the calibration record it."""

from __future__ import annotations

import platform


def backend() -> str:
    """"gpu" when MLX runs on Metal, else "cpu"."""
    import mlx.core as mx

    return "gpu" if mx.metal.is_available() and mx.default_device() == mx.gpu else "cpu"


def device_name() -> str:
    """The chip's name as MLX reports it (e.g. "Apple M2 Pro"), else the platform's machine type."""
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
    """{"backend", "name", "os"} for reports."""
    return {"backend": backend(), "name": device_name(), "os": platform.platform(terse=True)}

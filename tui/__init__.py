"""The `mlxspec chat` TUI: speculative and vanilla decoding racing side by side."""

from .app import ChatApp, make_app

__all__ = ["ChatApp", "make_app"]

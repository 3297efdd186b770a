"""Where mlxspec keeps its files: one home folder (`MLXSPEC_HOME`)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`$MLXSPEC_HOME`, or the platform's user cache folder for mlxspec."""
    if home := os.environ.get("MLXSPEC_HOME"):
        return Path(home).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("mlxspec"))


def user_pairs_path() -> Path:
    """The user's own pairs, read after (and over) the packaged models.toml when it exists."""
    return cache_dir() / "models.toml"

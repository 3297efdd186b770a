"""Where mlxspec keeps its files: one home folder (`MLXSPEC_HOME`), and the models it ships."""

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


def shipped_dir() -> Path:
    """The folder of the models shipped inside the package, each a `builtin:<name>` reference."""
    return Path(__file__).resolve().parent / "data"

"""Copying to the clipboard: through the terminal (OSC 52, which Textual writes; most terminals
take it, macOS's Terminal does not), and on a Mac through pbcopy as well, since the chat runs on
the machine whose clipboard it is."""

from __future__ import annotations

import shutil
import subprocess
import sys


def copy(app, text: str) -> str:
    """Put `text` on the clipboard; returns how, for the notice that says so."""
    app.copy_to_clipboard(text)
    pbcopy = shutil.which("pbcopy") if sys.platform == "darwin" else None
    if pbcopy:
        try:
            subprocess.run([pbcopy], input=text.encode(), timeout=5, check=True)
            return "with pbcopy"
        except (OSError, subprocess.SubprocessError):
            pass  # the terminal's copy still went out
    return "through the terminal (OSC 52: if nothing was copied, your terminal does not take it)"

"""Copying to the clipboard: through the terminal (OSC 52, which Textual writes; many terminals
take it, but macOS's Terminal and GNOME's do not), and through the desktop's own clipboard tool
where this machine has one (pbcopy on a Mac, wl-copy on Wayland, xclip or xsel on X11), since
the chat runs on the machine whose clipboard it is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def tools() -> list:
    """The clipboard commands to try here, best first (none over SSH without a display)."""
    if sys.platform == "darwin":
        return [["pbcopy"]]
    found = []
    if os.environ.get("WAYLAND_DISPLAY"):
        found.append(["wl-copy"])
    if os.environ.get("DISPLAY"):
        found += [["xclip", "-selection", "clipboard"], ["xsel", "--clipboard", "--input"]]
    return found


def copy(app, text: str) -> str:
    """Put `text` on the clipboard; returns how, for the notice that says so."""
    app.copy_to_clipboard(text)
    for command in tools():
        path = shutil.which(command[0])
        if path is None:
            continue
        try:
            # (xclip and wl-copy stay behind to serve the selection: they are not waited for)
            proc = subprocess.Popen([path, *command[1:]], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            proc.stdin.write(text.encode())
            proc.stdin.close()
            if proc.wait(timeout=1) != 0:
                continue
        except subprocess.TimeoutExpired:
            pass  # still serving it, as xclip does: it has the text
        except OSError:
            continue  # the terminal's copy still went out
        return f"with {command[0]}"
    return "through the terminal (OSC 52: if nothing was copied, your terminal does not take it)"

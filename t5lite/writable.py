"""Checks that an output path can be written before a command does its work, so a run fails at
start (naming the path and the flag that set it) rather than after minutes of compute."""
from __future__ import annotations

import os
import tempfile

from t5lite.errors import ConfigError


def ensure_writable_dir(path: str, flag: str) -> None:
    """Creates `path` if needed and writes a scratch file in it; remote paths (gs://...) are left to
    their storage client."""
    if "://" in path:
        return
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise ConfigError(f"cannot write to {path} (set by {flag}): {e.strerror or e}; "
                          f"choose a folder you can write to with {flag}") from e


def ensure_new_dir(path: str, flag: str) -> None:
    """Like `ensure_writable_dir`, and `path` must be new or empty: nothing already there is replaced."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{flag} {path} is a file; give a new or empty folder")
    held = sorted(os.listdir(path)) if os.path.isdir(path) else []
    if held:
        shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
        raise ConfigError(f"{flag} {path} already holds files ({shown}); nothing was changed. Give a new or empty "
                          f"folder with {flag}, or remove this one yourself if it is not needed")
    ensure_writable_dir(path, flag)


def ensure_writable_file(path: str, flag: str) -> None:
    """The file's folder is writable and `path` is not a folder; the file itself is written later."""
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path} is a folder; give a file name")
    ensure_writable_dir(os.path.dirname(os.path.abspath(path)), flag)

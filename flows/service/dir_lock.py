"""One writer per recovery directory: ``hold_directory`` takes an exclusive lock on the
directory itself (``flock``), held until the process exits; the kernel drops it when the
process dies, kill -9 included, so a crash never leaves a stale lock behind.

>>> import tempfile
>>> directory = tempfile.mkdtemp()
>>> hold_directory(directory)
>>> hold_directory(directory)  # the same process may ask again
>>> release_directory(directory)
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from flows.service.settings import ConfigError

_held: dict[Path, int] = {}  # directory -> the open descriptor holding its lock


class DirectoryInUseError(ConfigError):
    """Another process holds the directory."""


def hold_directory(path: str | Path, what: str = "recovery directory") -> None:
    """Lock ``path`` for this process, or raise ``DirectoryInUseError`` in one line when
    another process holds it. A missing directory is nobody's yet: nothing to lock (whoever
    creates it locks it then)."""
    directory = Path(path).resolve()
    if directory in _held or not directory.exists():
        return
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be opened: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DirectoryInUseError(
            f"{what} {path} is in use by another process (one writer per directory): stop "
            "that process first, or give this one a directory of its own"
        ) from None
    _held[directory] = fd


def release_directory(path: str | Path) -> None:
    """Let go of a directory this process holds (nothing if it holds none)."""
    fd = _held.pop(Path(path).resolve(), None)
    if fd is not None:
        os.close(fd)

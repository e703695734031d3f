"""One writer per recovery directory and process: ``hold_directory`` takes an exclusive
lock (``flock``) on the file ``.tsi-process-N.lock`` in the directory, N the process's
index in its cluster (0 alone), held until the process exits. The processes of one
cluster may share a directory (each writes its own recovery partitions); two processes
with the same index may not. The kernel drops the lock when the process dies, kill -9
included, so a crash never leaves a stale lock behind; the file itself stays, harmless.

>>> import tempfile
>>> directory = tempfile.mkdtemp()
>>> hold_directory(directory)
>>> hold_directory(directory)  # the same process may ask again
>>> is_empty(directory)  # the lock file does not count
True
>>> release_directory(directory)
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from flows.service.runtime.settings import ConfigError

LOCK_PREFIX, LOCK_SUFFIX = ".tsi-process-", ".lock"
_held: dict[tuple[Path, int], int] = {}  # (directory, process) -> the locked descriptor


class DirectoryInUseError(ConfigError):
    """Another process with the same index holds the directory."""


def is_lock_file(path: Path) -> bool:
    """Whether ``path`` is a lock file of this module (not part of the stored state)."""
    return path.name.startswith(LOCK_PREFIX) and path.name.endswith(LOCK_SUFFIX)


def is_empty(path: str | Path) -> bool:
    """Whether the directory is missing or holds nothing but lock files."""
    directory = Path(path)
    return not directory.is_dir() or all(is_lock_file(p) for p in directory.iterdir())


def hold_directory(path: str | Path, process: int = 0, what: str = "recovery directory") -> None:
    """Lock ``path`` for process ``process`` of this cluster, or raise
    ``DirectoryInUseError`` in one line when another process holds it. A missing directory
    (or a path that is not one, which the directory's own checks report) is nobody's yet:
    nothing to lock (whoever creates it locks it then)."""
    directory = Path(path).resolve()
    if (directory, process) in _held or not directory.is_dir():
        return
    file = directory / f"{LOCK_PREFIX}{process}{LOCK_SUFFIX}"
    try:
        fd = os.open(file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot write its lock file ({exc.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DirectoryInUseError(
            f"{what} {path} is in use by another process (process id {process}; one writer "
            "per directory and process id): stop that process first, or give this one a "
            "directory of its own"
        ) from None
    _held[(directory, process)] = fd


def release_directory(path: str | Path, process: int = 0) -> None:
    """Let go of a directory this process holds (nothing if it holds none)."""
    fd = _held.pop((Path(path).resolve(), process), None)
    if fd is not None:
        os.close(fd)

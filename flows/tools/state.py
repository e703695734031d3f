"""Moving the service's state between recovery stores (``tsi state export`` / ``import``).

Bytewax ties a recovery store to the cluster that initialised it (its partitions, its
processes); the bandits' state and the input positions are not tied to it. To run with
another number of processes or workers: stop the service, export the state of every
process's recovery directory into one file, import the file into new, empty directories
(one per process of the new cluster, or one they share), and start the new cluster as
usual, with the same consumer group. Each shard starts from its seed and each input
partition from the position the old store had committed, so no feedback is lost or
applied twice. Members (``--members N``) export from every member's directory
(``member_state``) and import once per new member (``--member K``); an import may put
the instances in another number of shards (``--shards``).

Both commands hold the recovery lock (``flows.service.runtime.dir_lock``) of every directory they
touch while they work: a directory a running service holds is refused.

The file is a sequence of records (``flows.service.shards.shard_log.encode``): a header (the
format, the input positions, the number of instances), then the instances' entries.
It is a pickle, like the store it comes from: import only files you made.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.service.connectors.members import Members
from flows.service.instances.resting import Entry
from flows.service.runtime.dir_lock import (
    LOCK_PREFIX,
    LOCK_SUFFIX,
    DirectoryInUseError,
    hold_directory,
    is_empty,
    is_lock_file,
    release_directory,
)
from flows.service.runtime.recovery import (
    INPUTS_SEED,
    PARTITION_FILE,
    committed_entries,
    note_layout,
    resumed_inputs,
    shard_store,
)
from flows.service.runtime.shard_count import shard_count
from flows.service.shards.shard_log import encode, read_payloads, write_seed
from flows.service.wire.keys import DEFAULT_SHARDS, shard_index, shard_name
from flows.tools.member_state import input_partition, members_state

FORMAT = "tsi.state"
VERSION = 1
CHUNK = 10_000  # entries per record


class StateFileError(ValueError):
    """A state file or a directory that cannot be used, and why."""


@dataclass(frozen=True)
class Moved:
    """What an export wrote or an import read."""

    instances: int
    input_partitions: int


def export_state(recovery_dirs: Iterable[Path], path: Path, flow_id: str = "tsi") -> Moved:
    """Write the committed state of a stopped service to ``path``: the recovery directories
    of all its processes (a Bytewax cluster's: a shard's log and marker may lie in two of
    them), or of all its members (each shard from the member holding it,
    ``member_state.members_state``). Refused (``StateFileError``) while a service holds one
    of them, or when they are not one service's whole set (``ValueError``)."""
    dirs = _distinct(recovery_dirs)
    counts = {d: _partition_count(d) for d in dirs}
    with _stopped(dirs, counts):
        if set(counts.values()) == {1}:  # single-process stores: a service, or its members
            entries, inputs = members_state(dirs, flow_id)
        else:
            entries = committed_entries(dirs, flow_id)
            inputs = resumed_inputs(dirs, flow_id)
    header = {"format": FORMAT, "version": VERSION, "inputs": inputs, "instances": len(entries)}
    held = list(entries.values())
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as file:
        file.write(encode([header]))
        for start in range(0, len(held), CHUNK):
            file.write(encode(held[start : start + CHUNK]))
    partial.replace(path)
    return Moved(len(entries), len(inputs))


def read_state_file(path: Path) -> tuple[dict[str, Any], list[Entry]]:
    """(header, entries) of an exported file; ``StateFileError`` if it is not one whole."""
    try:
        payloads, _, problem = read_payloads(path)
    except OSError as exc:
        raise StateFileError(f"cannot read {path}: {exc}") from None
    header = payloads[0][0] if payloads and payloads[0] else None
    if problem is not None or not isinstance(header, dict) or header.get("format") != FORMAT:
        raise StateFileError(f"{path} is not a whole tsi state file ({problem or 'no header'})")
    if header.get("version") != VERSION:
        raise StateFileError(f"{path} is version {header.get('version')}, this tsi reads 1")
    entries = [entry for payload in payloads[1:] for entry in payload]
    if len(entries) != header["instances"]:
        raise StateFileError(f"{path} holds {len(entries)} of {header['instances']} instances")
    return header, entries


def import_state(
    path: Path,
    recovery_dirs: Iterable[Path],
    processes: int | None = None,
    shards: int | str | None = None,
    member: Members | None = None,
) -> Moved:
    """Make new recovery directories that a cluster of ``processes`` processes starts from
    as is: one directory per process (``processes`` defaults to their number), or one they
    all share. Each gets every shard's seed (a shard is read by the process serving it),
    the input positions and Bytewax's recovery partitions, one per process, as ``tsi
    run`` initialises an empty directory. Each instance goes to its shard of ``shards``
    (``check_shard_count``; default ``keys.DEFAULT_SHARDS``, a new store's): another count than the
    store's moves the state to it.

    With ``member`` (member K of N: one directory, one process): only the shards and the
    input partitions member K holds (``Members.holds``, with as many internal partitions
    as shards, as ``tsi topics create`` makes them), and the directory notes it serves as
    member K; an export is split over the new members' directories by one import each.
    Nothing is written unless every directory is new (missing, or empty) and free."""
    shards = check_shard_count(DEFAULT_SHARDS if shards is None else shards)
    dirs = _distinct(recovery_dirs)
    count = processes or len(dirs)
    if len(dirs) > 1 and count != len(dirs):
        raise StateFileError(
            f"{len(dirs)} recovery directories for {count} processes: give one directory "
            "per process, or one directory they all share"
        )
    if member is not None and (len(dirs), count) != (1, 1):
        raise StateFileError(
            f"a member's import (member {member.index} of {member.count}) makes one "
            f"single-process directory, not {len(dirs)} for {count} processes: import once "
            "per member"
        )
    header, entries = read_state_file(path)
    inputs = header["inputs"]
    by_shard: dict[int, list[Entry]] = {}
    for entry in entries:
        by_shard.setdefault(shard_index(entry.key, shards), []).append(entry)
    if member is not None:
        by_shard = {s: held for s, held in by_shard.items() if member.holds(s, shards)}
        inputs = {
            where: state for where, state in inputs.items() if member.owns(input_partition(where))
        }
    with _stopped(dirs, dict.fromkeys(dirs, count)):
        for directory in dirs:
            _check_new(directory)
        for directory in dirs:
            store = shard_store(directory)
            store.mkdir(exist_ok=True)
            for shard, held in by_shard.items():
                write_seed(store, shard_name(shard, shards), held)
            seed = store / INPUTS_SEED
            seed.with_suffix(".partial").write_bytes(encode([inputs]))
            seed.with_suffix(".partial").replace(seed)
            if member is not None:
                note_layout(directory, member)
            _init_partitions(directory, count)
    return Moved(sum(map(len, by_shard.values())), len(inputs))


def check_shard_count(shards: object) -> int:
    """A shard count (``shard_count.shard_count``'s rule: a whole number, or its digits as
    given on a command line, in [1, ``MAX_SHARDS``]); ``StateFileError`` naming anything
    else.

    >>> check_shard_count("64")
    64
    >>> for bad in (2000, "x"):
    ...     try:
    ...         check_shard_count(bad)
    ...     except StateFileError as exc:
    ...         print(exc)
    shard count 2000: must be a whole number from 1 to 1024, got '2000'
    shard count 'x': must be a whole number from 1 to 1024, got 'x'
    """
    try:
        return shard_count(str(shards))
    except ValueError as exc:
        raise StateFileError(f"shard count {shards!r}: {exc}") from None


def _init_partitions(directory: Path, count: int) -> None:
    """Bytewax's recovery partitions, last: a directory with them is a whole import."""
    from bytewax.recovery import init_db_dir

    init_db_dir(directory, count)


def _distinct(recovery_dirs: Iterable[Path]) -> list[Path]:
    """The directories, each once (``StateFileError`` if one is given twice)."""
    dirs = [Path(d) for d in recovery_dirs]
    seen: dict[Path, Path] = {}
    for directory in dirs:
        if directory.resolve() in seen:
            raise StateFileError(f"recovery directory {directory} is given twice")
        seen[directory.resolve()] = directory
    return dirs


def _partition_count(directory: Path) -> int:
    """How many partitions ``directory`` holds (at least 1: process ids to lock)."""
    names = [p.name for p in directory.iterdir()] if directory.is_dir() else []
    return max(1, sum(1 for n in names if (m := PARTITION_FILE.fullmatch(n)) and not m[2]))


@contextmanager
def _stopped(dirs: list[Path], processes: dict[Path, int]) -> Iterator[None]:
    """Hold the recovery lock of each directory for every process id that may use it
    (``processes[d]`` of them, and any a lock file names), creating missing directories
    (removed again if the body fails before writing in them); ``StateFileError`` while a
    service holds one: "stop the service first"."""
    created = []
    with ExitStack() as held:
        try:
            for directory in dirs:
                ids = set(range(processes[directory])) | _lock_ids(directory)
                for process in sorted(ids):
                    _hold(directory, process)
                    held.callback(release_directory, directory, process)
            for directory in dirs:
                if not directory.exists():
                    directory.mkdir(parents=True)
                    created.append(directory)
                    for process in range(processes[directory]):
                        _hold(directory, process)
                        held.callback(release_directory, directory, process)
            yield
        except BaseException:
            for directory in created:
                if is_empty(directory):
                    for lock in directory.iterdir():
                        lock.unlink()
                    directory.rmdir()
            raise


def _hold(directory: Path, process: int) -> None:
    try:
        hold_directory(directory, process)
    except DirectoryInUseError:
        raise StateFileError(
            f"recovery directory {directory} is in use by a running tsi process (process id "
            f"{process}): stop the service first"
        ) from None


def _lock_ids(directory: Path) -> set[int]:
    """The process ids the lock files in ``directory`` name."""
    files = [p for p in directory.iterdir() if is_lock_file(p)] if directory.is_dir() else []
    ids = (f.name[len(LOCK_PREFIX) : -len(LOCK_SUFFIX)] for f in files)
    return {int(i) for i in ids if i.isdigit()}


def _check_new(directory: Path) -> None:
    """A directory to import into must be new: nothing in it but lock files."""
    if is_empty(directory):
        return
    used = sorted(p.name for p in directory.iterdir() if not is_lock_file(p))
    raise StateFileError(
        f"recovery directory {directory} is in use (it holds {', '.join(used[:3])}): import "
        "into new, empty directories"
    )

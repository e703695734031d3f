"""The recovery directory: is it fit to serve from (``check_recovery_dir``), and what does it
hold (``read_states``: the per-instance state the dataflow snapshotted).

Bytewax keeps one SQLite file per recovery partition; the stateful step's rows hold each
shard's marker into its log (``shards/`` beside the partitions, see
``flows.service.shard_store``) at each epoch. The state of record is the latest marker at
or before the partition's committed epoch: what a restart resumes from (the commit lags
the newest snapshot by the backup interval). Only read recovery directories you trust:
snapshots and logs are pickles.
"""

from __future__ import annotations

import os
import pickle
import re
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

from flows.service.dir_lock import is_lock_file
from flows.service.logic import SHARDS, of_this_layout, shard_of
from flows.service.resting import Entry, state_of
from flows.service.settings import ConfigError
from flows.service.shard_store import ShardLog, read_payloads, read_records, shards_in, write_seed

STATE_STEP = "shards"
PER_INSTANCE_STEP = "bandit.stateful_batch"  # before shards: a Bytewax key per instance
SHARD_STORE = "shards"  # the folder of the shards' logs in a recovery directory
INPUTS_SEED = "inputs.positions"  # in it: where an imported store's inputs start
#: The way out of a damaged recovery directory, named by every message that finds one.
REBUILD_HINT = (
    "README, 'A damaged recovery directory': stop the service, mv DIR DIR.damaged, then "
    "tsi run --rebuild rebuilds the state from what the topics still hold"
)


def _committed_steps(recovery_dir: str | Path, step_pattern: str) -> Iterator[tuple[str, str, Any]]:
    """(step id, state key, snapshot or None if deleted) of every step matching
    ``step_pattern`` (SQL LIKE), as of each partition's committed epoch: what a restart
    resumes from."""
    files = sorted(Path(recovery_dir).glob("part-*.sqlite3"))
    if not files:
        raise FileNotFoundError(f"no recovery partitions (part-*.sqlite3) in {recovery_dir}")
    for path in files:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            committed = db.execute("SELECT MAX(commit_epoch) FROM commits").fetchone()[0]
            if committed is None:
                continue
            rows = db.execute(
                "SELECT step_id, state_key, ser_change FROM snaps AS s WHERE step_id LIKE ? AND"
                " snap_epoch = (SELECT MAX(snap_epoch) FROM snaps WHERE step_id = s.step_id"
                " AND state_key = s.state_key AND snap_epoch <= ?)",
                (step_pattern, committed),
            ).fetchall()
        for step, key, blob in rows:
            yield step, key, None if blob is None else pickle.loads(blob)


def shard_store(recovery_dir: str | Path) -> Path:
    """Where the shards of a recovery directory keep their logs."""
    return Path(recovery_dir) / SHARD_STORE


def read_states(recovery_dir: str | Path, flow_id: str = "tsi") -> dict[str, dict[str, Any]]:
    """{instance key: its ``Instance.to_dict()``} as of the latest committed snapshot of
    each shard (its log up to the committed marker), over all partitions of the directory.
    Shards never snapshotted yet show their seed (an upgrade, ``tsi state import``)."""
    entries = committed_entries(recovery_dir, flow_id)
    return {key: state_of(entry) for key, entry in entries.items()}


def committed_entries(recovery_dir: str | Path, flow_id: str = "tsi") -> dict[str, Entry]:
    """{instance key: its saved ``Entry``} as a restart would resume them (``read_states``)."""
    entries: dict[str, Entry] = {}
    marked = set()
    for _, shard_key, shard in _committed_steps(recovery_dir, f"{flow_id}.{STATE_STEP}"):
        if not shard:
            continue
        marked.add(shard_key)
        if "entries" in shard:
            entries.update((entry.key, entry) for entry in shard["entries"])
        else:
            path = ShardLog(shard_store(recovery_dir), shard_key).path(shard["store"]["gen"])
            found, _, problem = read_records(path, shard["store"]["end"])
            if problem is not None:
                raise ValueError(f"shard {shard_key}: {problem}")
            entries.update(found)
    for seed in sorted(shard_store(recovery_dir).glob("*.seed")):
        if seed.stem not in marked:
            entries.update(read_records(seed, None)[0])
    return entries


def seed_from_per_instance_snapshots(recovery_dir: str | Path, flow_id: str = "tsi") -> int:
    """Upgrade a recovery directory written before shards (one Bytewax key per instance,
    step ``bandit``): its instances become the seeds of their shards, which start from
    them. Done once, when the directory holds such snapshots and no shard state yet;
    returns the number of instances seeded. Input offsets are kept by Bytewax as they are
    (their steps did not change), so the upgrade loses and repeats nothing."""
    store = shard_store(recovery_dir)
    if store.exists() and any(store.iterdir()):
        return 0
    if any(True for _ in _committed_steps(recovery_dir, f"{flow_id}.{STATE_STEP}")):
        return 0
    states: dict[str, dict[str, Any]] = {}
    for _, key, state in _committed_steps(recovery_dir, f"{flow_id}.{PER_INSTANCE_STEP}"):
        if state is None:
            states.pop(key, None)
        else:
            states[key] = state
    by_shard: dict[str, list[Entry]] = {}
    for key, state in states.items():
        entry = Entry(key, state["experiment"], "state", state)
        by_shard.setdefault(shard_of(key), []).append(entry)
    for shard, entries in by_shard.items():
        write_seed(store, shard, entries)
    return len(states)


def check_shard_layout(recovery_dir: str | Path) -> None:
    """Refuse a store written with another shard count (``ConfigError`` saying how to move
    it): its instances would not reach the shards that hold them. Its shards are known
    by their names (``logic.shard_name``; before 2026-11-28 tsi used 256 shards, named
    ``shard-NNN``)."""
    names = {name for name in shards_in(shard_store(recovery_dir)) if not of_this_layout(name)}
    if names:
        shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
        raise ConfigError(
            f"recovery directory {recovery_dir} holds shards of another shard count ({shown}; "
            f"this tsi has {SHARDS}): move its state into a new directory with "
            f"`tsi state export FILE --recovery-dir {recovery_dir}` and "
            "`tsi state import FILE --recovery-dir NEW_DIR`, then run from NEW_DIR"
        )


def committed_inputs(recovery_dir: str | Path, flow_id: str = "tsi") -> dict[str, Any]:
    """{"step id/partition": state} of the Kafka inputs (their next offsets; the internal
    topic's also the source offsets it has seen), as of the committed epoch."""
    steps = (f"{flow_id}.%_in.kafka_input", f"{flow_id}.internal_in")
    return {
        f"{step}/{key}": state
        for pattern in steps
        for step, key, state in _committed_steps(recovery_dir, pattern)
        if state is not None
    }


def store_offsets(recovery_dir: str | Path, flow_id: str = "tsi") -> dict[tuple[str, int], int]:
    """{(topic, partition): next offset} of the Kafka inputs, as of the committed epoch:
    where a restart resumes reading."""
    return input_offsets(committed_inputs(recovery_dir, flow_id))


def input_offsets(inputs: dict[str, Any]) -> dict[tuple[str, int], int]:
    """{(topic, partition): next offset} of the input topics among ``committed_inputs``."""
    offsets: dict[tuple[str, int], int] = {}
    for where, offset in inputs.items():
        step, _, key = where.rpartition("/")
        partition, _, topic = key.partition("-")
        if step.endswith(".kafka_input") and isinstance(offset, int) and offset >= 0:
            offsets[(topic, int(partition))] = offset
    return offsets


def seeded_inputs(recovery_dir: str | Path) -> dict[str, Any]:
    """The input positions ``tsi state import`` left for a new store to start from
    (``committed_inputs`` of the store exported), or {}."""
    path = shard_store(recovery_dir) / INPUTS_SEED
    if not path.exists():
        return {}
    payloads, _, problem = read_payloads(path)
    if problem is not None or len(payloads) != 1:
        raise ConfigError(f"{path} is damaged ({problem}): import the state again")
    return payloads[0][0]


#: Bytewax 0.21.1's recovery partitions (``python -m bytewax.recovery DIR N``) and the
#: files sqlite keeps beside them while one is open (write-ahead log, shared memory).
PARTITION_FILE = re.compile(r"part-(\d+)\.sqlite3(-wal|-shm|-journal)?")


def check_recovery_dir(path: str | Path, processes: int = 1) -> list[Path]:
    """The recovery partitions in ``path``, or a one-line `ConfigError` saying what is wrong.

    An empty list: the directory is missing (it can be created) or empty, and `run`
    initialises it. Refused: ``path`` is not a directory or not writable; an entry that is
    not a Bytewax partition (``part-N.sqlite3``, with its ``-wal``/``-shm`` files); a
    partition sqlite cannot read (corrupt) or of another initialisation (a different
    partition count); with one process (``processes == 1``), a missing partition. A
    cluster may spread its partitions over the processes' directories, so then each
    directory may hold some of them.
    """
    directory = Path(path)
    if not directory.exists():
        _check_creatable(directory)
        return []
    if not directory.is_dir():
        raise ConfigError(f"recovery directory {directory} exists but is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"recovery directory {directory} is not writable by this user")
    parts: dict[int, Path] = {}
    for entry in sorted(directory.iterdir()):
        if (entry.name == SHARD_STORE and entry.is_dir()) or is_lock_file(entry):
            continue
        match = PARTITION_FILE.fullmatch(entry.name)
        if match is None or not entry.is_file():
            raise ConfigError(
                f"recovery directory {directory} holds {entry.name!r}, which is not a Bytewax "
                "recovery partition (part-N.sqlite3); give the service a directory of its own"
            )
        if match.group(2) is None:
            parts[int(match.group(1))] = entry
    counts = {index: _partition_count(file, index) for index, file in parts.items()}
    if len(set(counts.values())) > 1:
        found = ", ".join(f"{parts[i].name} of {n}" for i, n in sorted(counts.items()))
        raise ConfigError(
            f"recovery directory {directory} mixes partitions of different initialisations "
            f"({found})"
        )
    count = next(iter(counts.values()), 0)
    missing = [f"part-{i}.sqlite3" for i in range(count) if i not in parts]
    if processes == 1 and missing:
        raise ConfigError(
            f"recovery directory {directory} lacks {', '.join(missing)} of its {count} "
            f"partitions (restore them from a backup, or move it aside and start with --rebuild: "
            f"{REBUILD_HINT})"
        )
    return [parts[i] for i in sorted(parts)]


def _check_creatable(directory: Path) -> None:
    """Raise unless ``directory`` (missing) can be created: its nearest existing ancestor
    must be a writable directory."""
    ancestor = directory.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(
            f"recovery directory {directory} cannot be created: {ancestor} is not a writable "
            "directory"
        )


def _partition_count(file: Path, index: int) -> int:
    """The partition count recorded in Bytewax partition ``file``.

    Opened read-write (never created) as Bytewax will: a read-only connection would leave
    its -wal and -shm files behind; this one removes them on close.
    """
    if not os.access(file, os.R_OK | os.W_OK):
        raise ConfigError(f"recovery partition {file} is not readable and writable by this user")
    try:
        with closing(sqlite3.connect(f"{file.absolute().as_uri()}?mode=rw", uri=True)) as db:
            rows = db.execute("SELECT part_index, part_count FROM parts").fetchall()
    except sqlite3.Error as exc:
        raise ConfigError(
            f"recovery partition {file} cannot be read by sqlite ({exc}): restore it from a "
            f"backup, or move the directory aside and start with --rebuild ({REBUILD_HINT})"
        ) from None
    if len(rows) != 1 or rows[0][0] != index:
        raise ConfigError(
            f"recovery partition {file} does not record partition {index} (parts: {rows})"
        )
    return int(rows[0][1])

"""The recovery directory: is it fit to serve from (``check_recovery_dir``), and what does it
hold (``read_states``: the per-instance state the dataflow snapshotted).

Bytewax keeps one SQLite file per recovery partition; the stateful step's rows hold each
shard's marker into its log (``shards/`` beside the partitions, see
``flows.service.shards.shard_log``) at each epoch. The state of record is the latest marker at
or before the partition's committed epoch: what a restart resumes from (the commit lags
the newest snapshot by the backup interval). Only read recovery directories you trust:
snapshots and logs are pickles.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from flows.service.connectors.members import ALONE, Members, MembersError
from flows.service.instances.resting import Entry, state_of
from flows.service.runtime.dir_lock import is_empty, is_lock_file
from flows.service.runtime.settings import ConfigError
from flows.service.shards.shard_log import (
    ShardLog,
    loads,
    read_payloads,
    read_records,
    shards_in,
    write_seed,
)
from flows.service.wire.keys import shard_layout, shard_of

STATE_STEP = "shards"
PER_INSTANCE_STEP = "bandit.stateful_batch"  # before shards: a Bytewax key per instance
SHARD_STORE = "shards"  # the folder of the shards' logs in a recovery directory
INPUTS_SEED = "inputs.positions"  # in it: where an imported store's inputs start
MEMBERS_LAYOUT = "members.layout"  # in it: the members' count and index it last served as
#: The way out of a damaged recovery directory, named by every message that finds one.
REBUILD_HINT = (
    "docs/guides/recovery.md, 'A damaged recovery directory': stop the service, "
    "mv DIR DIR.damaged, then tsi run --rebuild rebuilds the state from what the topics still hold"
)

log = logging.getLogger(__name__)


RecoveryDirs = str | Path | Sequence[str | Path]  # one directory, or one per process


class NotOneClusterError(ValueError):
    """Recovery directories that are not the whole set of one cluster's (a directory left
    out, or one of another cluster): a person's mistake, said in one line."""


def _directories(recovery_dirs: RecoveryDirs) -> list[Path]:
    if isinstance(recovery_dirs, str | Path):
        return [Path(recovery_dirs)]
    return [Path(d) for d in recovery_dirs]


def _partitions(directory: Path) -> list[tuple[Path, int, int, int | None]]:
    """(file, index, count, committed epoch or None) of each Bytewax partition in
    ``directory``; ``FileNotFoundError`` when it holds none."""
    files = sorted(directory.glob("part-*.sqlite3"))
    if not files:
        raise FileNotFoundError(f"no recovery partitions (part-*.sqlite3) in {directory}")
    found = []
    for path in files:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            committed = db.execute("SELECT MAX(commit_epoch) FROM commits").fetchone()[0]
            for index, count in db.execute("SELECT part_index, part_count FROM parts"):
                found.append((path, int(index), int(count), committed))
    return found


def resumed_partitions(recovery_dirs: RecoveryDirs) -> list[Path]:
    """The partition files a restart of the cluster resumes from, over the recovery
    directories of all its processes: of each partition, the copy that holds commits (a
    cluster's directory holds a copy of every partition, and its process writes some of
    them). [] when nothing is committed yet (an imported store). ``NotOneClusterError`` when the
    directories are not one cluster's whole set: counts differ, a partition is committed
    in two directories, or in none while others are (a directory left out)."""
    dirs = _directories(recovery_dirs)
    copies = [(d, *part) for d in dirs for part in _partitions(d)]
    counts = {(d, count) for d, _, _, count, _ in copies}
    if len({count for _, count in counts}) > 1:
        shown = ", ".join(f"{d} of {count}" for d, count in sorted(counts))
        raise NotOneClusterError(
            f"the recovery directories hold partitions of different clusters ({shown})"
        )
    count = copies[0][3]
    committed: dict[int, list[tuple[Path, Path]]] = {}
    for directory, path, index, _, epoch in copies:
        if epoch is not None:
            committed.setdefault(index, []).append((directory, path))
    twice = sorted((i, held) for i, held in committed.items() if len(held) > 1)
    if twice:
        index, held = twice[0]
        raise NotOneClusterError(
            f"partition {index} is committed in both {held[0][0]} and {held[1][0]}: these "
            "recovery directories are not of one cluster"
        )
    missing = [i for i in range(count) if i not in committed]
    if committed and missing:
        where = ", ".join(str(d) for d in dirs)
        raise NotOneClusterError(
            f"partition {missing[0]} of {count} is committed in none of {where}: give the "
            "recovery directory of every process of the cluster"
        )
    return [committed[i][0][1] for i in sorted(committed)]


def _committed_steps(files: list[Path], step_pattern: str) -> Iterator[tuple[str, str, Any]]:
    """(step id, state key, snapshot or None if deleted) of every step matching
    ``step_pattern`` (SQL LIKE) in the partition ``files``, as of each partition's
    committed epoch: what a restart resumes from."""
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
            yield step, key, None if blob is None else loads(blob)


def _committed_shards(files: list[Path], step: str) -> dict[str, dict[str, Any]]:
    """{shard: its state} in the rows of the stateful step ``step`` at the partitions'
    committed epochs: a key group's row holds its shards' states (``{"group", "shards"}``,
    ``flows.service.shards.group_logic``), a row from before groups one shard's, keyed by
    the shard; a shard in both (an upgrade under way) is its group's."""
    alone: dict[str, dict[str, Any]] = {}
    grouped: dict[str, dict[str, Any]] = {}
    for _, key, state in _committed_steps(files, step):
        if state and "group" in state:
            grouped.update((shard, held) for shard, held in state["shards"].items() if held)
        elif state:
            alone[key] = state
    return {**alone, **grouped}


def keys_of_one_shard(recovery_dir: str | Path, flow_id: str = "tsi") -> dict[str, Any]:
    """{Bytewax key: its state} of the committed keys of ``recovery_dir`` that hold one
    shard each (the key is the shard): a store from before key groups, whose keys a
    restart hands to their groups (``group_logic.Retired``). None in a directory without
    (readable) partitions.

    >>> import tempfile; keys_of_one_shard(tempfile.mkdtemp())
    {}
    """
    try:
        rows = _committed_steps(_committed_here(recovery_dir), f"{flow_id}.{STATE_STEP}")
        return {key: state for _, key, state in rows if state and "group" not in state}
    except (FileNotFoundError, sqlite3.DatabaseError):
        return {}


def _committed_here(directory: str | Path) -> list[Path]:
    """The partitions of ``directory`` that hold commits (a cluster's process: those it
    writes)."""
    return [path for path, _, _, epoch in _partitions(Path(directory)) if epoch is not None]


def committed_shard_states(recovery_dir: str | Path, step: str) -> dict[str, dict[str, Any]]:
    """{shard: its Bytewax state at the committed epoch of ``recovery_dir``'s partitions}
    of the stateful step ``step``; none for a directory without (readable) partitions.

    >>> import tempfile; committed_shard_states(tempfile.mkdtemp(), "tsi.shards")
    {}
    """
    try:
        return _committed_shards(_committed_here(recovery_dir), step)
    except (FileNotFoundError, sqlite3.DatabaseError):
        return {}


def shard_store(recovery_dir: str | Path) -> Path:
    """Where the shards of a recovery directory keep their logs."""
    return Path(recovery_dir) / SHARD_STORE


def last_layout(recovery_dir: str | Path) -> Members:
    """The member a recovery directory last served as (``note_layout``); a service alone
    when it never served as a member, or when the note is damaged (logged): a service
    alone owns every partition, so a store behind the group on any of them is judged as
    its own (moved aside with a changelog, refused without one), never a start refused
    at every restart for the note alone.

    >>> import tempfile; where = Path(tempfile.mkdtemp())
    >>> note_layout(where, Members(2, 1)); last_layout(where)
    Members(count=2, index=1)
    >>> _ = (shard_store(where) / MEMBERS_LAYOUT).write_text("")  # a write cut short
    >>> last_layout(where)
    Members(count=1, index=0)
    """
    path = shard_store(recovery_dir) / MEMBERS_LAYOUT
    if not path.exists():
        return ALONE
    text = path.read_text(errors="replace")
    try:
        count, index = map(int, text.split())
        return Members(count, index)
    except (ValueError, MembersError):
        log.warning("%s is damaged (%r): taken as a service alone", path, text[:40])
        return ALONE


def note_layout(recovery_dir: str | Path, members: Members) -> None:
    """Note in ``recovery_dir`` the member it serves as (``last_layout``), atomically (a
    process killed while it writes leaves the old note or the new one)."""
    path = shard_store(recovery_dir) / MEMBERS_LAYOUT
    path.parent.mkdir(parents=True, exist_ok=True)
    written = path.with_name(f"{path.name}.tmp")
    with open(written, "w") as out:
        out.write(f"{members.count} {members.index}\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(written, path)


def read_states(recovery_dirs: RecoveryDirs, flow_id: str = "tsi") -> dict[str, dict[str, Any]]:
    """{instance key: its ``Instance.to_dict()``} as of the latest committed snapshot of
    each shard (its log up to the committed marker), over the recovery directories of
    all the cluster's processes. Shards never snapshotted yet show their seed (an
    upgrade, ``tsi state import``)."""
    entries = committed_entries(recovery_dirs, flow_id)
    return {key: state_of(entry) for key, entry in entries.items()}


def committed_entries(recovery_dirs: RecoveryDirs, flow_id: str = "tsi") -> dict[str, Entry]:
    """{instance key: its saved ``Entry``} as a restart would resume them (``read_states``).

    A shard's marker lies in the partition Bytewax hashed it to, which a process of a
    cluster other than the one serving the shard (and keeping its log) may hold: its log
    is looked for in every directory given."""
    dirs = _directories(recovery_dirs)
    entries: dict[str, Entry] = {}
    marked = set()
    states = _committed_shards(resumed_partitions(dirs), f"{flow_id}.{STATE_STEP}")
    for shard_key, shard in states.items():
        marked.add(shard_key)
        if "entries" in shard:
            entries.update((entry.key, entry) for entry in shard["entries"])
        else:
            path = _log_of(dirs, shard_key, shard["store"]["gen"])
            found, _, problem = read_records(path, shard["store"]["end"])
            if problem is not None:
                raise ValueError(f"shard {shard_key}: {problem}")
            entries.update(found)
    for directory in dirs:  # an import seeds every directory with the same seeds
        for seed in sorted(shard_store(directory).glob("*.seed")):
            if seed.stem not in marked:
                entries.update(read_records(seed, None)[0])
    return entries


def _log_of(dirs: list[Path], shard: str, gen: int) -> Path:
    """The log of ``shard``'s generation ``gen``: in exactly one of the directories."""
    name = ShardLog(Path(), shard).path(gen).name
    found = [shard_store(d) / name for d in dirs if (shard_store(d) / name).exists()]
    if len(found) > 1:
        raise NotOneClusterError(
            f"shard {shard}: its log {name} is in both {found[0].parent.parent} and "
            f"{found[1].parent.parent}: these recovery directories are not of one cluster"
        )
    if not found:
        raise NotOneClusterError(
            f"shard {shard}: its log {name} is in none of {', '.join(map(str, dirs))}: give "
            "the recovery directory of every process of the cluster"
        )
    return found[0]


def seed_from_per_instance_snapshots(
    recovery_dir: str | Path, shards: int, flow_id: str = "tsi"
) -> int:
    """Upgrade a recovery directory written before shards (one Bytewax key per instance,
    step ``bandit``): its instances become the seeds of their shards (of ``shards``),
    which start from them. Done once, when the directory holds such snapshots and no
    shard state yet; returns the number of instances seeded. Input offsets are kept by
    Bytewax as they are (their steps did not change), so the upgrade loses and repeats
    nothing."""
    store = shard_store(recovery_dir)
    if store.exists() and any(store.iterdir()):
        return 0
    here = _committed_here(recovery_dir)
    if any(True for _ in _committed_steps(here, f"{flow_id}.{STATE_STEP}")):
        return 0
    states: dict[str, dict[str, Any]] = {}
    for _, key, state in _committed_steps(here, f"{flow_id}.{PER_INSTANCE_STEP}"):
        if state is None:
            states.pop(key, None)
        else:
            states[key] = state
    by_shard: dict[str, list[Entry]] = {}
    for key, state in states.items():
        entry = Entry(key, state["experiment"], "state", state)
        by_shard.setdefault(shard_of(key, shards), []).append(entry)
    for shard, entries in by_shard.items():
        write_seed(store, shard, entries)
    return len(states)


def stored_shards(recovery_dir: str | Path) -> int | None:
    """The shard count of a store, read from its shards' names (``keys.shard_layout``);
    None when it holds no shard yet. ``ConfigError`` saying how to move it for a store
    holding shards of two counts, or of a layout without the count (``shard-NNN``): its
    instances would not all reach the shards that hold them.

    >>> import tempfile; where = Path(tempfile.mkdtemp())
    >>> _ = write_seed(shard_store(where), "shard-003-of-032", []); stored_shards(where)
    32
    """
    names = shards_in(shard_store(recovery_dir))
    counts: dict[int | None, list[str]] = {}
    for name in sorted(names):
        layout = shard_layout(name)
        counts.setdefault(None if layout is None else layout[1], []).append(name)
    if len(counts) == 1 and None not in counts:
        return next(iter(counts))
    if not counts:
        return None
    shown = "; ".join(
        f"{len(held)} of {'no count' if count is None else count} ({held[0]}, ...)"
        for count, held in sorted(counts.items(), key=lambda kv: kv[0] or 0)
    )
    raise ConfigError(
        f"recovery directory {recovery_dir} holds shards of more than one shard count, or "
        f"of a layout without the count ({shown}): move its state into a new directory "
        f"with `tsi state export FILE --recovery-dir {recovery_dir}` and `tsi state import "
        "FILE --shards N --recovery-dir NEW_DIR`, then run from NEW_DIR"
    )


def committed_inputs(recovery_dirs: RecoveryDirs, flow_id: str = "tsi") -> dict[str, Any]:
    """{"step id/partition": state} of the Kafka inputs (their next offsets; the internal
    topic's also the source offsets it has seen), as of the committed epoch, over the
    recovery directories of all the cluster's processes."""
    return _inputs_in(resumed_partitions(recovery_dirs), flow_id)


def resumed_inputs(recovery_dirs: RecoveryDirs, flow_id: str = "tsi") -> dict[str, Any]:
    """Where a restart resumes each input partition: its committed state, else the
    position ``tsi state import`` seeded (``seeded_inputs``)."""
    seeded = {k: v for d in _directories(recovery_dirs) for k, v in seeded_inputs(d).items()}
    return {**seeded, **committed_inputs(recovery_dirs, flow_id)}


def _inputs_in(files: list[Path], flow_id: str) -> dict[str, Any]:
    steps = (f"{flow_id}.%_in.kafka_input", INTERNAL_STEP.format(flow_id=flow_id))
    return {
        f"{step}/{key}": state
        for pattern in steps
        for step, key, state in _committed_steps(files, pattern)
        if state is not None
    }


#: The flow's input steps as Bytewax keys their partitions' state: an input topic read
#: under its name (``requests``, ``feedback``, ``events``), and the internal topic.
INPUT_STEP = "{flow_id}.{name}_in.kafka_input"
INTERNAL_STEP = "{flow_id}.internal_in"


def input_seeds(
    offsets: dict[tuple[str, int], int],
    inputs: dict[str, str],
    internal: str | None,
    flow_id: str = "tsi",
) -> dict[str, Any]:
    """{"step id/partition": state} that starts the flow's input partitions at ``offsets``
    ({(topic, partition): next offset}): ``inputs`` maps each input's name to its topic,
    ``internal`` is the internal topic (its partitions start with no copy seen).

    >>> input_seeds({("r", 1): 7, ("i", 0): 3}, {"requests": "r"}, "i")
    {'tsi.requests_in.kafka_input/1-r': 7, 'tsi.internal_in/0-i': {'offset': 3, 'seen': {}}}
    """
    steps = {topic: INPUT_STEP.format(flow_id=flow_id, name=name) for name, topic in inputs.items()}
    seeds: dict[str, Any] = {}
    for (topic, partition), offset in offsets.items():
        if topic == internal:
            step = INTERNAL_STEP.format(flow_id=flow_id)
            seeds[f"{step}/{partition}-{topic}"] = {"offset": offset, "seen": {}}
        elif topic in steps:
            seeds[f"{steps[topic]}/{partition}-{topic}"] = offset
    return seeds


def store_offsets(
    recovery_dir: str | Path, flow_id: str = "tsi"
) -> dict[tuple[str, int], int] | None:
    """{(topic, partition): next offset} of the Kafka inputs whose committed state
    ``recovery_dir`` holds (a cluster's process: those in the partitions it writes): where
    a restart resumes reading them. None when it holds no commit yet."""
    here = _committed_here(recovery_dir)
    return input_offsets(_inputs_in(here, flow_id)) if here else None


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
    directory holding something but no partition (the shards' state alone: nothing Bytewax
    could resume); a partition sqlite cannot read (corrupt) or of another initialisation
    (a different partition count); with one process (``processes == 1``), a missing
    partition; partitions of a cluster of another number of processes (``tsi run`` and
    ``tsi state import`` make one partition per process). A cluster may spread its
    partitions over the processes' directories, so then each directory may hold some of
    them.
    """
    directory = Path(path)
    if not directory.exists():
        _check_creatable(directory)
        return []
    if not directory.is_dir():
        raise ConfigError(f"recovery directory {directory} exists but is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"recovery directory {directory} is not writable by this user")
    parts = _partition_files(directory)
    counts = {index: _partition_count(file, index) for index, file in parts.items()}
    if len(set(counts.values())) > 1:
        found = ", ".join(f"{parts[i].name} of {n}" for i, n in sorted(counts.items()))
        raise ConfigError(
            f"recovery directory {directory} mixes partitions of different initialisations "
            f"({found})"
        )
    if not parts and not is_empty(directory):
        held = ", ".join(sorted(p.name for p in directory.iterdir() if not is_lock_file(p)))
        raise ConfigError(
            f"recovery directory {directory} holds {held} but no Bytewax recovery partitions "
            "(part-N.sqlite3): import the state again into a new directory (`tsi state "
            f"import` makes both), or, if its partitions were deleted, see {REBUILD_HINT}"
        )
    count = next(iter(counts.values()), 0)
    missing = [f"part-{i}.sqlite3" for i in range(count) if i not in parts]
    if processes == 1 and missing:
        raise ConfigError(
            f"recovery directory {directory} lacks {', '.join(missing)} of its {count} "
            f"partitions (restore them from a backup, or move it aside and start with --rebuild: "
            f"{REBUILD_HINT})"
        )
    if parts and count != processes:
        raise ConfigError(
            f"recovery directory {directory} is of a cluster of {count} process"
            f"{'es' if count > 1 else ''} (its partitions) and this one has {processes}: "
            f"move the state with `tsi state export FILE --recovery-dir DIR...` (every "
            f"process's directory) and `tsi state import FILE --recovery-dir NEW_DIR...` "
            "(docs/guides/members.md, 'Another number of processes')"
        )
    return [parts[i] for i in sorted(parts)]


def _partition_files(directory: Path) -> dict[int, Path]:
    """{index: file} of the Bytewax partitions in ``directory``; `ConfigError` for an
    entry that is neither one (with its -wal/-shm files), the shards' folder nor a lock."""
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
    return parts


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

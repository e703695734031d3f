"""What ``tsi run`` does before the flow starts: check everything, then say where logs go.

Every check fails in one line naming what is missing (``StartupError``): the registry, the
Kafka settings, the brokers, the input and output topics, the recovery store. Once they
pass, the service's logs (Python's, librdkafka's, Bytewax's and Rust's own writes to
stderr) go to a log file when one is given, or when stderr is a terminal (``tsi-run.log``);
the terminal then only gets one line at start and one if the service stops.

>>> ServiceLog(None, terminal=False).path is None
True
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import IO

from bytewax.recovery import init_db_dir

from flows.service.connectors.kafka_admin import (
    BrokerUnavailableError,
    Deadline,
    DeadlineError,
    TopicError,
    ensure_changelog,
    group_offsets,
    holds_records,
    service_topics,
    topic_infos,
)
from flows.service.connectors.kafka_admin import check_topics as check_kafka_topics
from flows.service.connectors.kafka_config import (
    settings_lines,
    with_rate_limited_logs,
    with_reconnect_defaults,
)
from flows.service.connectors.kafka_sink import DeliveryCheckedKafkaSink
from flows.service.connectors.kafka_source import SOURCE_DEFAULTS
from flows.service.connectors.members import MembersError
from flows.service.instances.registry import RegistryError
from flows.service.observe.metrics import note_broker_contact
from flows.service.runtime.dir_lock import is_empty
from flows.service.runtime.process import Service, live_registry
from flows.service.runtime.recovery import (
    REBUILD_HINT,
    check_recovery_dir,
    input_offsets,
    keys_of_one_shard,
    last_layout,
    note_layout,
    seed_from_per_instance_snapshots,
    seeded_inputs,
    store_offsets,
    stored_shards,
)
from flows.service.runtime.settings import (
    ConfigError,
    Settings,
    client_config,
    dead_letter_bound,
    outputs_of,
)
from flows.service.runtime.shard_count import flow_shards

log = logging.getLogger("tsi")
DEFAULT_LOG_FILE = Path("tsi-run.log")


#: The names of the internal and changelog topics of every service before they were named
#: from the application id: a service of the default group keeps them.
LEGACY_INTERNAL = "tsi.events.internal"
LEGACY_CHANGELOG = "tsi.changelog"


class StartupError(Exception):
    """Something the service needs is missing or wrong: one line saying what."""


class BrokersAwayError(StartupError):
    """The brokers did not answer the start's questions within ``--connect-timeout``."""


def prepare(options: Settings) -> Service:
    """The service, once every check passed (``StartupError`` otherwise)."""
    check_recovery_options(options)
    try:  # the checks that need no broker first
        guards = options.guards()
        consumer, producer = map(with_reconnect_defaults, client_config(options.kafka_config))
        registry = live_registry(options, consumer)
        parts = None if options.recovery_dir is None else check_store(options)
        inputs, outputs = service_topics(options.topics)
        if options.outputs is not None:  # written elsewhere: the two output topics unused
            unused = (options.topics.selections, options.topics.dead_letters)
            outputs = [topic for topic in outputs if topic not in unused]
        deadline = Deadline(options.connect_timeout)  # one for every call to the brokers
        shards = ready_changelog(options, consumer, deadline)
        limits = check_kafka_topics(options.brokers, consumer, inputs, outputs, deadline)
        internal_partitions = check_members(options, consumer, deadline)
        check_internal_topic_kept(options, consumer, deadline)
        if parts is not None and options.group_id is not None:
            parts = check_no_silent_reset(options, consumer, inputs, parts, deadline)
        if options.recovery_dir is not None:
            note_member(options)
        if parts:
            seeded = seed_from_per_instance_snapshots(options.recovery_dir, shards)
            if seeded:
                log.warning("upgraded: %d instances moved into their shards' seeds", seeded)
        if options.outputs is None:  # the dead-letter topic bounds what a letter carries
            bound = dead_letter_bound(limits[options.topics.dead_letters], producer)
            guards = dataclasses.replace(guards, dead_letter_raw=bound)
    except (ConfigError, RegistryError, BrokerUnavailableError, TopicError, MembersError) as exc:
        away = isinstance(exc, BrokerUnavailableError) or _deadline_passed(exc)
        raise (BrokersAwayError if away else StartupError)(
            str(exc) + _slow_broker_hint(exc)
        ) from None
    note_broker_contact(True)
    effective = DeliveryCheckedKafkaSink(options.brokers, None, producer).producer_config()
    for line in settings_lines({**SOURCE_DEFAULTS, **consumer}, effective):
        log.info("Kafka %s", line)
    log.info(
        "dead letters carry up to %d original bytes (%s); skipping %s",
        guards.dead_letter_raw,
        f"{options.topics.dead_letters} accepts {limits[options.topics.dead_letters]}"
        if options.outputs is None
        else f"written to {options.outputs[0]}:{options.outputs[1]}",
        sorted(guards.skip) or "nothing",
    )
    log.info("serving with %d shards", shards)
    return Service(
        registry,
        options.brokers,
        options.topics,
        with_rate_limited_logs(consumer),
        with_rate_limited_logs(producer),
        options.group_id,
        guards,
        outputs_of(options),
        options.membership,
        internal_partitions,
        shards,
        options.connect_timeout,
    )


def _slow_broker_hint(exc: Exception) -> str:
    """What to do when the brokers kept failing until ``--connect-timeout`` passed."""
    if _deadline_passed(exc):
        return "; a slow broker may need a longer --connect-timeout"
    return ""


def _deadline_passed(exc: Exception) -> bool:
    return isinstance(exc, DeadlineError) or isinstance(exc.__cause__, DeadlineError)


def ready_changelog(options: Settings, consumer: dict, deadline: Deadline | None = None) -> int:
    """The flow's shard count (``resolve_shards``), its changelog topic (when it has one)
    created with as many partitions when missing (logged, once every partition has a
    leader), checked when not (``TopicError``); within ``deadline`` (default
    ``--connect-timeout``)."""
    deadline = deadline or Deadline(options.connect_timeout)
    shards = resolve_shards(options, consumer, deadline)
    if options.topics.changelog is not None:
        made = ensure_changelog(
            options.brokers, consumer, options.topics.changelog, shards, deadline
        )
        if made is not None:
            log.warning("changelog topic created: %s", made)
    return shards


def resolve_shards(options: Settings, consumer: dict, deadline: Deadline | None = None) -> int:
    """The flow's shard count (``shard_count.flow_shards``): its changelog topic's
    partitions, else its recovery store's, else ``--shards``, else the default."""
    stored = None if options.recovery_dir is None else stored_shards(options.recovery_dir)
    partitions = None
    if options.topics.changelog is not None:
        name = options.topics.changelog
        timeout = deadline or options.connect_timeout
        info = topic_infos(options.brokers, consumer, [name], timeout)[name]
        partitions = None if info is None else info.partitions
    return flow_shards(options.shards, stored, partitions)


def note_member(options: Settings) -> None:
    """Note in the recovery directory the member it serves as (``recovery.last_layout``),
    a new directory initialised first (Bytewax's partitions: ``run`` initialises only an
    empty one)."""
    if is_empty(options.recovery_dir):
        options.recovery_dir.mkdir(parents=True, exist_ok=True)
        init_db_dir(options.recovery_dir, options.processes)
    note_layout(options.recovery_dir, options.membership)


def check_members(options: Settings, consumer: dict, deadline: Deadline | None = None) -> int:
    """The internal topic's partition count (0 without one), once every topic the members
    share has a partition for each member (``MembersError`` naming the topic otherwise):
    each copy goes to its shard's internal partition (``_records.internal_copy``)."""
    inputs, _ = service_topics(options.topics)
    internal = [options.topics.internal] if options.topics.repartitioned else []
    timeout = deadline or options.connect_timeout
    infos = topic_infos(options.brokers, consumer, inputs + internal, timeout)
    counts = {name: info.partitions for name, info in infos.items() if info is not None}
    options.membership.check_partitions(counts)
    return counts[internal[0]] if internal else 0


def check_recovery_options(options: Settings) -> None:
    """Refuse recovery options that contradict each other (``StartupError``)."""
    if options.fresh and options.rebuild:
        raise StartupError(
            "--fresh (state starts empty, the input resumes from the group's offsets) and "
            "--rebuild (the state is rebuilt from the inputs' start) contradict each other"
        )
    if (options.recovery_dir is None) == (not options.no_recovery):
        raise StartupError(
            "give --recovery-dir DIR (state and offsets survive restarts) or --no-recovery "
            "(state starts empty at every start; input resumes from the consumer group's "
            "committed offsets, else the end of the topics)"
        )


def check_store(options: Settings) -> list[Path]:
    """The recovery directory's partitions, once it is fit to serve from (checks that
    need no broker; ``StartupError`` or ``ConfigError`` otherwise)."""
    if options.rebuild and not is_empty(options.recovery_dir):
        raise StartupError(
            f"--rebuild starts from an empty recovery directory, and "
            f"{options.recovery_dir} is not: move it aside first ({REBUILD_HINT})"
        )
    parts = check_recovery_dir(options.recovery_dir, options.processes)
    flow_shards(options.shards, stored_shards(options.recovery_dir), None)  # --shards agrees
    check_cluster_keys(options)
    seeded_inputs(options.recovery_dir)  # an imported store's positions can be read
    if parts:
        check_stored_inputs(options.recovery_dir, service_topics(options.topics)[0])
    return parts


def check_stored_inputs(recovery_dir: Path, inputs: list[str]) -> None:
    """Refuse (``StartupError``, one line) a recovery directory holding the positions of
    input topics this run does not read: Bytewax would stop the flow at every start (a key
    of its input step that no partition of the new topics routes).

    >>> import tempfile; check_stored_inputs(Path(tempfile.mkdtemp()), ["t.events"])
    """
    try:
        stored = store_offsets(recovery_dir)
    except (FileNotFoundError, sqlite3.DatabaseError):  # no partitions yet, or refused elsewhere
        stored = None
    others = sorted({topic for topic, _ in stored or {}} - set(inputs))
    if others:
        raise StartupError(
            f"recovery directory {recovery_dir} holds the input positions of "
            f"{', '.join(others)}, which this run does not read (it reads "
            f"{', '.join(inputs)}): run with the topics it was written for, or move the "
            f"instances to a new directory with `tsi state export FILE --recovery-dir "
            f"{recovery_dir}` and `tsi state import FILE --recovery-dir NEW_DIR`, then run "
            "from NEW_DIR"
        )


def check_cluster_keys(options: Settings) -> None:
    """Refuse (``StartupError``) a process of a Bytewax cluster whose directory holds one
    key a shard (a store from before key groups): a shard's old key and the key group now
    holding it may be placed in two processes, where the old key's state and log cannot
    reach the group. A process alone hands them over by itself."""
    if options.processes < 2:
        return
    old = sorted(keys_of_one_shard(options.recovery_dir))
    if old:
        raise StartupError(
            f"recovery directory {options.recovery_dir} holds {len(old)} Bytewax keys of one "
            f"shard each ({old[0]}, ...), written before key groups, and a cluster places "
            "key groups anew: move the state with `tsi state export FILE --recovery-dir DIR "
            "...` (every process's directory) and `tsi state import FILE --processes N "
            "--recovery-dir NEW ...`, then run from the new directories"
        )


def check_no_silent_reset(
    options: Settings,
    consumer: dict,
    inputs: list[str],
    parts: list[Path],
    deadline: Deadline | None = None,
) -> list[Path]:
    """Refuse a recovery store that would silently start over: empty (or missing) while
    the consumer group committed progress, or behind the group's commits (its latest
    snapshots are lost; for a store imported and not committed since, ``tsi state
    import``, the positions it was given: the same group goes on from them). A process of
    a cluster compares the inputs its directory holds, a member those it owns.
    ``--fresh`` accepts an empty store (state starts empty; the input resumes from the
    group's offsets), and so does a changelog topic (each shard is rebuilt from it, the
    inputs resume at the group's offsets: ``process.Service._at_commits``); with one, a
    store behind the group is moved aside (``set_aside``) and the start goes on as from
    an empty one. The partitions to start from (none once moved aside)."""
    group, timeout = options.group_id, deadline or options.connect_timeout
    committed = group_offsets(options.brokers, consumer, group, inputs, timeout)
    owns = options.membership.owns  # a member compares the partitions it reads
    committed = {tp: offset for tp, offset in committed.items() if owns(tp[1])}
    if not committed:
        return parts
    where = ", ".join(f"{t}[{p}]@{o}" for (t, p), o in sorted(committed.items())[:4])
    imported = input_offsets(seeded_inputs(options.recovery_dir))
    stored = store_offsets(options.recovery_dir) if parts else None  # None: no commit yet
    if stored is None and not imported:
        _accept_empty(options, consumer, where, timeout)
        return parts
    cache = stored is not None and options.topics.changelog is not None  # it stands in
    if stored is None:  # imported, nothing committed since: the positions it was given
        stored = imported
        why = "the state file is older than the service's last epochs: export and import again"
    else:
        why = (
            "its latest snapshots are lost (a deleted file or write-ahead log?); restore it "
            f"from its backup, or move it aside and start with --rebuild ({REBUILD_HINT})"
        )
    if options.processes > 1:  # a process's directory holds some of the cluster's inputs
        committed = {tp: o for tp, o in committed.items() if tp in stored}
    behind = [(tp, o, stored.get(tp, 0)) for tp, o in committed.items() if stored.get(tp, 0) < o]
    behind = [b for b in behind if b[0] in stored or options.topics.changelog is None]
    behind = _served_elsewhere(options, behind)
    if behind:
        (topic, partition), group_at, store_at = sorted(behind)[0]
        said = (
            f"recovery directory {options.recovery_dir} is behind consumer group {group!r} "
            f"on {topic}[{partition}] (offset {store_at} < {group_at})"
        )
        changelog = options.topics.changelog
        if cache and options.processes == 1 and _holds(options, consumer, changelog, timeout):
            set_aside(options.recovery_dir, said, changelog)
            return []
        raise StartupError(f"{said}: {why}")
    return parts


def _accept_empty(options: Settings, consumer: dict, where: str, timeout: float | Deadline) -> None:
    """An empty store where the consumer group committed progress (``where``): accepted
    with a changelog that holds records (each shard rebuilt from it), ``--rebuild`` or
    ``--fresh`` (logged), refused otherwise (``StartupError`` naming the ways out)."""
    group = options.group_id
    changelog = options.topics.changelog
    if changelog is not None and _holds(options, consumer, changelog, timeout):
        log.warning(
            "recovery directory %s is empty and consumer group %r was at %s: each shard "
            "is rebuilt from changelog %s, and the inputs resume at the group's offsets "
            "(what is read again of what the shards hold is dropped)",
            options.recovery_dir,
            group,
            where,
            options.topics.changelog,
        )
        return
    if options.rebuild:
        log.warning(
            "rebuilding (--rebuild) from the inputs' start: group %r was at %s", group, where
        )
        return
    if options.fresh:
        log.warning("starting afresh (--fresh): consumer group %r was at %s", group, where)
        return
    empty = "" if changelog is None else f" and changelog {changelog} holds nothing"
    raise StartupError(
        f"recovery directory {options.recovery_dir} is empty{empty} but consumer group "
        f"{group!r} has committed progress ({where}): restore the directory from its "
        "backup, give the changelog that holds its state (--changelog-topic; before "
        f"topics were named from the group: {LEGACY_CHANGELOG}), rebuild the state from "
        "what the topics still hold with --rebuild, or accept a reset with --fresh "
        "(state starts empty, the input resumes from the group's offsets)"
    )


def set_aside(directory: Path, why: str, changelog: str) -> Path:
    """Move a recovery directory the changelog can stand in for (behind the group: another
    member served its partitions since, or its latest snapshots are lost) aside, kept for a
    post-mortem, so that the start rebuilds every shard from ``changelog`` and resumes the
    inputs at the group's offsets, as after a lost directory. Where it went.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()) / "recovery"; d.mkdir()
    >>> moved = set_aside(d, "behind", "tsi.changelog")
    >>> d.exists(), moved.name.startswith("recovery.behind-"), moved.exists()
    (False, True, True)
    """
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    moved = directory.with_name(f"{directory.name}.behind-{stamp}-{os.getpid()}")
    directory.rename(moved)
    log.warning(
        "%s: moved aside to %s (delete it when no longer needed); every shard is rebuilt "
        "from changelog %s and the inputs resume at the group's offsets",
        why,
        moved,
        changelog,
    )
    return moved


def _holds(options: Settings, consumer: dict, topic: str, timeout: float | Deadline) -> bool:
    """Whether ``topic`` holds (or held) a record."""
    return holds_records(options.brokers, consumer, topic, timeout)


def check_internal_topic_kept(
    options: Settings, consumer: dict, deadline: Deadline | None = None
) -> None:
    """Refuse to leave behind the internal topic a service served from before topics
    were named from the application (``LEGACY_INTERNAL``): its group committed offsets
    there and none on the internal topic now named, so what was copied and not yet
    served would be lost. ``--fresh`` leaves it knowingly."""
    internal, group = options.topics.internal, options.group_id
    if not options.topics.repartitioned or group is None or internal == LEGACY_INTERNAL:
        return
    timeout = deadline or options.connect_timeout
    topics = [LEGACY_INTERNAL, internal]
    known = topic_infos(options.brokers, consumer, topics, timeout)
    if known[LEGACY_INTERNAL] is None or options.fresh:
        return
    committed = group_offsets(options.brokers, consumer, group, topics, timeout)
    if any(t == LEGACY_INTERNAL for t, _ in committed) and not any(
        t == internal for t, _ in committed
    ):
        raise StartupError(
            f"consumer group {group!r} served from internal topic {LEGACY_INTERNAL}, not "
            f"from {internal} (the internal topic is named from the group now): keep it "
            f"with --internal-topic {LEGACY_INTERNAL}, or leave what it holds unserved "
            "with --fresh"
        )


def _served_elsewhere(
    options: Settings, behind: list[tuple[tuple[str, int], int, int]]
) -> list[tuple[tuple[str, int], int, int]]:
    """Of the partitions a store is ``behind`` the group on, those it did own in its last
    layout (``last_layout``): the others another member served since (a rescale by
    restart). With a changelog their shards are rebuilt from it (another lineage marked
    them) and what the store re-reads of them is dropped by the shards' guards: logged;
    without one their state is elsewhere (``StartupError``)."""
    earlier = last_layout(options.recovery_dir)
    moved = sorted((topic, p) for (topic, p), _, _ in behind if not earlier.owns(p))
    if not moved:
        return behind
    was = f"member {earlier.index} of {earlier.count}"
    shown = ", ".join(f"{t}[{p}]" for t, p in moved[:4]) + (", ..." if len(moved) > 4 else "")
    if options.topics.changelog is None:
        raise StartupError(
            f"recovery directory {options.recovery_dir} last served as {was}: other members "
            f"served {shown} since, and their state is not here. Change the member count by "
            "a restart with --changelog-topic (each shard is rebuilt from it), or move the "
            "state with `tsi state export` and `tsi state import`"
        )
    log.warning(
        "recovery directory %s last served as %s: other members served %s since; their "
        "shards are rebuilt from changelog %s, what is read again of them is dropped",
        options.recovery_dir,
        was,
        shown,
        options.topics.changelog,
    )
    return [each for each in behind if earlier.owns(each[0][1])]


class ServiceLog:
    """Where the running service writes: ``path`` (file) or stderr, and ``say`` for the
    lines a person at the terminal reads."""

    def __init__(self, path: Path | None, terminal: bool | None = None) -> None:
        terminal = sys.stderr.isatty() if terminal is None else terminal
        self.path = path if path is not None or not terminal else DEFAULT_LOG_FILE
        self._terminal: IO[str] = sys.stderr

    def start(self) -> None:
        """Send fd 2 (and Python's logging) to the log file, keeping the terminal aside."""
        handler: logging.Handler
        if self.path is not None:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            except OSError as exc:
                message = f"cannot write the log file {self.path}: {exc.strerror}"
                raise StartupError(message) from None
            self._terminal = os.fdopen(os.dup(2), "w", buffering=1)
            sys.stderr.flush()
            os.dup2(fd, 2)
            os.close(fd)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)

    def say(self, line: str) -> None:
        """One line for the person who started the service (the terminal, not the log)."""
        print(line, file=self._terminal, flush=True)
        if self.path is not None:
            log.info(line)

    def stopped(self, exc: BaseException) -> None:
        """The service stopped on an error: the whole story to the log, one line to the
        terminal."""
        log.error("the service stopped", exc_info=exc)
        cause = root_cause(exc)[:300]
        where = f"; the full report is in {self.path}" if self.path else ""
        way_out = f" ({REBUILD_HINT})" if "resume" in cause else ""  # Bytewax's recovery
        self.say(f"tsi run: the service stopped: {cause}{way_out}{where}")


def root_cause(exc: BaseException) -> str:
    """The first line of the innermost error (Bytewax wraps the flow's in its own)."""
    while (exc.__cause__ or exc.__context__) is not None:
        exc = exc.__cause__ or exc.__context__
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0].strip() if lines else type(exc).__name__


def describe_start(options: Settings, log_path: Path | None) -> str:
    """The line ``tsi run`` prints when it starts serving."""
    store = options.recovery_dir or "no recovery store"
    where = f"; logs in {log_path}" if log_path else ""
    served = options.registry or f"the experiments topic of {options.application}"
    return f"tsi run: serving {served} from {','.join(options.brokers)} ({store}){where}"

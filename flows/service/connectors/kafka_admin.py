"""The service's Kafka topics: what exists, and creating what is missing (``tsi topics``).

Everything here talks to the brokers through one `AdminClient` built from the connection
settings of the client config (SASL, TLS, ...), and fails with `TopicError`: one line
saying what is wrong. ``check_topics`` (the start-up check of ``tsi run``) and the ``tsi
topics`` commands are built on it.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from flows.service.connectors.kafka_config import connection_settings, with_reconnect_defaults
from flows.service.connectors.topics import TOPIC_NAME

if TYPE_CHECKING:
    from confluent_kafka.admin import ClusterMetadata

    from flows.service.connectors.topics import Topics

DEFAULT_PARTITIONS = 3
DEFAULT_REPLICATION = 1
#: A new topic's replication factor meaning "the broker's default.replication.factor"
#: (KIP-464, brokers 2.4 and later).
BROKER_DEFAULT = -1
#: The changelog topic's settings (``tsi topics create``): compacted, and a record stays out
#: of the cleaner this long, so the values an epoch never committed overwrote are still
#: there when a restart repairs them (``flows.service.shards.changelog``): a process down
#: longer than this may find a key's committed value cleaned away.
CHANGELOG_CONFIG = {"cleanup.policy": "compact", "min.compaction.lag.ms": str(24 * 3600 * 1000)}
#: The broker's default ``message.max.bytes``, hence a topic's default max.message.bytes.
BROKER_DEFAULT_MAX_MESSAGE_BYTES = 1048588
#: The principal may not read topic configs: max.message.bytes is assumed to be the default.
_DENIED = (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED)
T = TypeVar("T")


#: A new group's coordinator is found (and loaded) on first use: asking again succeeds.
_COORDINATOR_MOVING = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
)


class TopicError(Exception):
    """No broker answers, or a topic is missing, different or cannot be created: one line."""


@dataclass(frozen=True)
class TopicInfo:
    """What the brokers say of one topic."""

    name: str
    partitions: int
    replication_factor: int
    max_message_bytes: int
    leaderless: int = 0  # partitions without a leader right now

    def summary(self) -> str:
        """``3 partitions, replication 1, max.message.bytes 1048588``."""
        text = (
            f"{self.partitions} partition{'' if self.partitions == 1 else 's'}, "
            f"replication {self.replication_factor}, max.message.bytes {self.max_message_bytes}"
        )
        return text + (f", {self.leaderless} without a leader" if self.leaderless else "")


def service_topics(topics: Topics) -> tuple[list[str], list[str]]:
    """(inputs, outputs) of the service: requests and feedback (or the combined events
    topic), then selections and dead letters (and the internal topic both stages share,
    which the service writes first)."""
    inputs = [topics.events] if topics.events is not None else [topics.requests, topics.feedback]
    internal = [topics.internal] if topics.repartitioned else []
    changelog = [topics.changelog] if topics.changelog is not None else []
    return inputs, [topics.selections, topics.dead_letters, *internal, *changelog]


# --------------------------------------------------------------------------- retrying
#: A partition's leader moving (a broker restarting, an election): the leader epochs of a
#: client's metadata and of the broker disagree for a moment, which the client marks as
#: not retriable although asking again passes (Kafka's Java client retries them).
LEADER_MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
    }
)
#: Errors a broker that is slow, just back or just given a new topic answers with: asked
#: again, they pass (partitions still electing leaders, a topic's metadata not spread yet,
#: a coordinator loading, a request or connection lost on the way).
RETRIABLE = frozenset(
    {
        *LEADER_MOVING,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_CONTROLLER,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._WAIT_COORD,
        KafkaError._UNKNOWN_PARTITION,
        *_COORDINATOR_MOVING,
    }
)
#: The first pause between two tries, doubled after each up to the last.
BACKOFF_FIRST_S = 0.1
BACKOFF_MOST_S = 2.0


class Deadline:
    """One end in time shared by several calls: each asks what is left of it.

    >>> Deadline(5.0).seconds
    5.0
    >>> Deadline.of(Deadline(2.0)).seconds  # a deadline passed on stays the same one
    2.0
    """

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not seconds > 0:
            raise ValueError(f"a deadline needs seconds > 0, got {seconds!r}")
        self.seconds = float(seconds)
        self._clock = clock
        self._end = clock() + self.seconds

    @classmethod
    def of(cls, timeout: float | Deadline) -> Deadline:
        """``timeout`` itself when it is a deadline, else a new one of that many seconds."""
        return timeout if isinstance(timeout, Deadline) else cls(timeout)

    def left(self) -> float:
        """Seconds until the end (0 once passed)."""
        return max(0.0, self._end - self._clock())


class DeadlineError(TopicError):
    """The brokers kept failing until the deadline passed: what, the last error, how long."""

    def __init__(self, what: str, reason: str, seconds: float) -> None:
        super().__init__(f"{what}: {reason} (retried for {seconds:g} s)")
        self.what, self.reason, self.seconds = what, reason, seconds


class NotReadyError(Exception):
    """A condition the brokers do not meet yet (partitions without a leader): try again."""


def retried(
    call: Callable[[float], T],
    what: str,
    timeout: float | Deadline,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call(seconds left)`` until it returns, retrying the errors of a slow or returning
    broker (``RETRIABLE``, client timeouts, `NotReadyError`) after a pause doubling from
    ``BACKOFF_FIRST_S`` to ``BACKOFF_MOST_S``; any other Kafka error is raised at once as
    `TopicError` (``what: reason``). Once the deadline passes, `DeadlineError`: ``what``,
    the last error and the timeout.

    >>> retried(lambda left: "ok", "reading", 1.0)
    'ok'
    """
    deadline = Deadline.of(timeout)
    pause = BACKOFF_FIRST_S
    while True:
        try:
            return call(max(deadline.left(), 0.01))
        except (KafkaException, concurrent.futures.TimeoutError, NotReadyError) as exc:
            reason = _retriable_reason(exc)
            if reason is None:
                raise TopicError(f"{what}: {_reason(exc)}") from None
        if deadline.left() <= 0:
            raise DeadlineError(what, reason, deadline.seconds)
        sleep(min(pause, deadline.left()))
        pause = min(pause * 2, BACKOFF_MOST_S)


def _retriable_reason(exc: Exception) -> str | None:
    """The text of ``exc`` when asking again may pass; None when it never will."""
    if isinstance(exc, concurrent.futures.TimeoutError):
        return "no answer"
    if isinstance(exc, NotReadyError):
        return str(exc)
    return exc.args[0].str() if transient(exc) else None


def transient(error: object) -> bool:
    """Whether a Kafka ``error`` (or the ``KafkaException`` holding it) goes away by itself
    (``RETRIABLE``, or flagged so).

    >>> transient(KafkaError(KafkaError.UNKNOWN_LEADER_EPOCH))
    True
    >>> transient(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
    False
    """
    if isinstance(error, KafkaException):
        error = error.args[0] if error.args else None
    return isinstance(error, KafkaError) and (error.retriable() or error.code() in RETRIABLE)


# --------------------------------------------------------------------------- the brokers
def admin_client(brokers: Sequence[str], config: Mapping[str, Any]) -> AdminClient:
    """An admin client for ``brokers`` with the connection settings of ``config``."""
    settings = {
        **with_reconnect_defaults(connection_settings(config)),
        "bootstrap.servers": ",".join(brokers),
        "log_level": 0,  # each failed connection would be a line on stderr: errors say it
    }
    try:
        return AdminClient(settings)
    except KafkaException as exc:
        raise TopicError(f"Kafka client settings refused: {_reason(exc)}") from None


def cluster_metadata(
    admin: AdminClient, brokers: Sequence[str], timeout: float | Deadline
) -> ClusterMetadata:
    """All topics the brokers show this client (asked again until ``timeout``), or
    `DeadlineError` if none answers in time."""
    where = ",".join(brokers)
    try:
        return retried(lambda left: admin.list_topics(timeout=left), where, timeout)
    except DeadlineError as exc:
        raise DeadlineError(
            f"no Kafka broker answers at {where} within {exc.seconds:g} s",
            f"{exc.reason}; start one (deploy/kafka/start.sh) or point --brokers / "
            "KAFKA_BOOTSTRAP_SERVERS at yours",
            exc.seconds,
        ) from None


def max_message_bytes(
    admin: AdminClient, names: Sequence[str], timeout: float | Deadline
) -> dict[str, int]:
    """Each topic's effective max.message.bytes (``BROKER_DEFAULT_MAX_MESSAGE_BYTES`` when
    this client may not describe topic configs)."""
    deadline = Deadline.of(timeout) if names else None
    limits = {name: topic_config(admin, name, "max.message.bytes", deadline) for name in names}
    return {
        name: BROKER_DEFAULT_MAX_MESSAGE_BYTES if value is None else int(value)
        for name, value in limits.items()
    }


def topic_config(admin: AdminClient, name: str, key: str, timeout: float | Deadline) -> str | None:
    """Topic ``name``'s setting ``key`` (None when this client may not describe topic
    configs); `TopicError` when the brokers do not say within ``timeout``."""
    resource = ConfigResource(ResourceType.TOPIC, name)

    def read(left: float) -> str | None:
        future = admin.describe_configs([resource], request_timeout=left)[resource]
        try:
            return future.result(left)[key].value
        except KafkaException as exc:
            if exc.args and exc.args[0].code() in _DENIED:
                return None
            raise

    return retried(read, f"cannot read the configuration of topic {name}", timeout)


def describe_topics(
    admin: AdminClient,
    metadata: ClusterMetadata,
    names: Sequence[str],
    timeout: float | Deadline,
) -> dict[str, TopicInfo | None]:
    """{name: what the brokers say of it, or None when it does not exist}."""
    present = [name for name in names if name in metadata.topics]
    limits = max_message_bytes(admin, present, timeout)
    infos: dict[str, TopicInfo | None] = {}
    for name in names:
        topic = metadata.topics.get(name)
        if topic is None:
            infos[name] = None
            continue
        parts = list(topic.partitions.values())
        infos[name] = TopicInfo(
            name,
            len(parts),
            min((len(p.replicas) for p in parts), default=0),
            limits[name],
            sum(p.leader < 0 for p in parts),
        )
    return infos


def topic_infos(
    brokers: Sequence[str],
    config: Mapping[str, Any],
    names: Sequence[str],
    timeout: float | Deadline = 10.0,
) -> dict[str, TopicInfo | None]:
    """`describe_topics` with its own admin client (``tsi topics check``)."""
    admin, deadline = admin_client(brokers, config), Deadline.of(timeout)
    return describe_topics(admin, cluster_metadata(admin, brokers, deadline), names, deadline)


# --------------------------------------------------------------------------- creating
def create_topics(
    brokers: Sequence[str],
    config: Mapping[str, Any],
    names: Sequence[str],
    *,
    partitions: int | None = None,
    replication_factor: int | None = None,
    max_bytes: Mapping[str, int] | None = None,
    timeout: float | Deadline = 30.0,
    changelog: tuple[str, int] | None = None,
    internal: tuple[str, int] | None = None,
) -> list[str]:
    """Create the topics of ``names`` that do not exist; one line per topic says what it is.

    New topics get ``partitions`` (default 3) and ``replication_factor`` (default 1), and
    ``max.message.bytes`` from ``max_bytes`` when it names them. An existing topic is left
    as it is; it is an error (`TopicError`, before anything is created) only when it
    differs from what was asked explicitly: a ``partitions`` or ``replication_factor``
    given (not None), or its ``max_bytes``. ``changelog``: (name, shards) of the changelog
    topic, made with one partition a shard and ``CHANGELOG_CONFIG`` (an existing one must
    match, ``check_changelog``). ``internal``: (name, shards) of the internal topic, made
    with one partition a shard (an existing one is left as it is: members check its
    partitions at start). Returns once every new topic has leaders. ``timeout`` bounds it
    all, retries of a slow broker's answers included.
    """
    wanted = list(dict.fromkeys(names))  # the same name twice is one topic
    for name in wanted:
        check_topic_name(name)
    limits = dict(max_bytes or {})
    admin, timeout = admin_client(brokers, config), Deadline.of(timeout)
    before = describe_topics(admin, cluster_metadata(admin, brokers, timeout), wanted, timeout)
    asked = (partitions, replication_factor)
    _refuse_differences(admin, before, asked, limits, internal, changelog, timeout)
    counts = dict(special for special in (internal, changelog) if special is not None)
    configs = {changelog[0]: dict(CHANGELOG_CONFIG)} if changelog is not None else {}
    missing = [name for name, info in before.items() if info is None]
    new = [
        _new_topic(name, counts.get(name) or partitions, replication_factor, limits, configs)
        for name in missing
    ]
    created = _create(admin, new, timeout)
    wait_for_leaders(admin, missing, timeout)  # created here or meanwhile by another
    after = describe_topics(admin, cluster_metadata(admin, brokers, timeout), wanted, timeout)
    return [
        f"{name}: {'created' if name in created else 'exists'}, {_summary(after[name])}"
        for name in wanted
    ]


def _refuse_differences(
    admin: AdminClient,
    before: Mapping[str, TopicInfo | None],
    asked: tuple[int | None, int | None],
    limits: Mapping[str, int],
    internal: tuple[str, int] | None,
    changelog: tuple[str, int] | None,
    timeout: Deadline,
) -> None:
    """`TopicError` naming every way an existing topic differs from what was ``asked``
    explicitly (partitions, replication factor) or its limit; the internal topic's
    partitions are not compared (members check them at start), the changelog is
    ``changelog_problems``."""
    partitions, replication_factor = asked
    loose = {internal[0]} if internal is not None else set()
    problems = [
        problem
        for name, info in before.items()
        if info is not None
        for problem in differences(
            info, None if name in loose else partitions, replication_factor, limits.get(name)
        )
    ]
    if changelog is not None and before.get(changelog[0]) is not None:
        problems += changelog_problems(admin, before[changelog[0]], changelog[1], timeout)
    if problems:
        raise TopicError(
            f"{'; '.join(problems)}: existing topics are never changed; give other names, "
            "or leave out the options they contradict"
        )


def _new_topic(
    name: str,
    partitions: int | None,
    replication_factor: int | None,
    limits: Mapping[str, int],
    configs: Mapping[str, dict[str, str]],
) -> NewTopic:
    """The topic ``name`` to create, the defaults standing in for what was not asked."""
    return NewTopic(
        name,
        partitions or DEFAULT_PARTITIONS,
        replication_factor or DEFAULT_REPLICATION,
        config={
            **({"max.message.bytes": str(limits[name])} if name in limits else {}),
            **configs.get(name, {}),
        },
    )


def changelog_problems(
    admin: AdminClient, info: TopicInfo, shards: int, timeout: float | Deadline
) -> list[str]:
    """What makes an existing topic unfit to be the changelog: not one partition a shard
    (a shard's records would not be in the partition read back for it), not compacted
    (`TopicError` when the brokers do not say)."""
    problems = []
    if info.partitions != shards:
        problems.append(
            f"changelog topic {info.name} has {info.partitions} partitions, not one a shard "
            f"({shards})"
        )
    cleanup = topic_config(admin, info.name, "cleanup.policy", timeout)
    if cleanup is None:
        return [*problems, f"this client may not read changelog topic {info.name}'s settings"]
    if "compact" not in cleanup.split(","):
        problems.append(
            f"changelog topic {info.name} has cleanup.policy={cleanup}, not compact (delete "
            "would drop instances' state with age)"
        )
    return problems


def ensure_changelog(
    brokers: Sequence[str],
    config: Mapping[str, Any],
    name: str,
    shards: int,
    timeout: float | Deadline,
) -> str | None:
    """The start-up check of the changelog topic (as Kafka Streams makes its own): a
    missing one is created (``create_topics``: one partition a shard, ``CHANGELOG_CONFIG``,
    the broker's ``default.replication.factor``, as Kafka Streams' ``replication.factor=-1``)
    and the line saying so returned; an existing one is checked (``TopicError`` saying
    what is wrong and how to fix it), and None returned. A topic created is returned
    once every partition has a leader; ``timeout`` bounds it all."""
    admin, timeout = admin_client(brokers, config), Deadline.of(timeout)
    [info] = describe_topics(
        admin, cluster_metadata(admin, brokers, timeout), [name], timeout
    ).values()
    if info is None:  # as many replicas as the broker gives a topic by default
        [line] = create_topics(
            brokers,
            config,
            [name],
            replication_factor=BROKER_DEFAULT,
            timeout=timeout,
            changelog=(name, shards),
        )
        return line
    problems = changelog_problems(admin, info, shards, timeout)
    if problems:
        raise TopicError(
            f"{'; '.join(problems)}: name another changelog topic with --changelog-topic "
            "(`tsi run` creates it), or delete this one if nothing else uses it"
        )
    return None


def check_topic_name(name: str) -> None:
    """Raise `TopicError` unless Kafka accepts ``name`` as a topic name."""
    if not TOPIC_NAME.fullmatch(name) or name in {".", ".."}:
        raise TopicError(
            f"{name!r} is not a valid topic name: 1 to 249 ASCII letters, digits, '.', '_' and '-'"
        )


def differences(
    info: TopicInfo, partitions: int | None, replication: int | None, max_bytes: int | None
) -> list[str]:
    """How an existing topic differs from the settings asked for (None: not asked;
    ``BROKER_DEFAULT`` replication: whatever the broker gave it)."""
    out = []
    if partitions is not None and info.partitions != partitions:
        out.append(f"{info.name} exists with {info.partitions} partitions, not {partitions}")
    asked = replication not in (None, BROKER_DEFAULT)
    if asked and info.replication_factor != replication:
        out.append(
            f"{info.name} exists with replication {info.replication_factor}, not {replication}"
        )
    if max_bytes is not None and info.max_message_bytes != max_bytes:
        out.append(
            f"{info.name} exists with max.message.bytes {info.max_message_bytes}, not {max_bytes}"
        )
    return out


def _create(admin: AdminClient, new: list[NewTopic], timeout: float | Deadline) -> list[str]:
    """Create ``new``; the names created (not those someone else created meanwhile)."""
    return [
        topic.topic
        for topic in new
        if retried(
            lambda left, topic=topic: _create_one(admin, topic, left),
            f"cannot create topic {topic.topic}",
            timeout,
        )
    ]


def _create_one(admin: AdminClient, topic: NewTopic, timeout: float) -> bool:
    """Create ``topic``: True, or False when it exists already."""
    futures = admin.create_topics([topic], operation_timeout=timeout, request_timeout=timeout)
    try:
        futures[topic.topic].result(timeout)
    except KafkaException as exc:
        if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise
    return True


def wait_for_leaders(admin: AdminClient, names: Sequence[str], timeout: float | Deadline) -> None:
    """Return once every partition of every topic of ``names`` has a leader
    (`DeadlineError` naming those still without one once ``timeout`` passes)."""

    def leaders(left: float) -> None:
        topics = admin.list_topics(timeout=left).topics
        waiting = [
            name
            for name in names
            if name not in topics
            or topics[name].error is not None
            or not topics[name].partitions
            or any(p.leader < 0 for p in topics[name].partitions.values())
        ]
        if waiting:
            raise NotReadyError(f"partitions without a leader in {', '.join(waiting)}")

    if names:
        retried(leaders, f"topic(s) {', '.join(names)} not ready", timeout)


def _summary(info: TopicInfo | None) -> str:
    return "missing" if info is None else info.summary()


def _reason(exc: KafkaException) -> str:
    """librdkafka's text of a KafkaException."""
    err = exc.args[0] if exc.args else None
    return err.str() if isinstance(err, KafkaError) else str(exc)


class BrokerUnavailableError(ConnectionError):
    """No broker answered, or a topic the service reads or writes is missing: one line."""


def check_topics(
    brokers: list[str],
    config: dict[str, Any],
    inputs: Iterable[str],
    outputs: Iterable[str] = (),
    timeout: float | Deadline = 10.0,
) -> dict[str, int]:
    """Fail fast, in one line, unless a broker answers and every topic exists; then return
    {output topic: its max.message.bytes} (to bound what is written to it).

    ``config`` is a client config (its connection settings are used: SASL, TLS, ...);
    settings librdkafka refuses together (SASL without a username, a missing CA file) fail
    here too. Without this check a source started against an absent broker waits forever,
    and a missing output topic fails the flow only at its first write. max.message.bytes
    is the topic's effective value (``BROKER_DEFAULT_MAX_MESSAGE_BYTES``, 1048588, when the
    client may not describe topic configs). ``timeout`` bounds it all.
    """
    inputs, outputs = list(dict.fromkeys(inputs)), list(dict.fromkeys(outputs))
    timeout = Deadline.of(timeout)
    try:
        admin = admin_client(brokers, config)
        known = cluster_metadata(admin, brokers, timeout).topics
        missing = [
            f"{kind} topic(s) {', '.join(gone)}"
            for kind, names in (("input", inputs), ("output", outputs))
            if (gone := [t for t in names if t not in known])
        ]
        if missing:
            raise BrokerUnavailableError(
                f"{' and '.join(missing)} do not exist on {','.join(brokers)}; create them "
                "with `tsi topics create` (same --brokers and topic options) or name others "
                "with the --*-topic options"
            )
        return max_message_bytes(admin, outputs, timeout)
    except TopicError as exc:  # the cause kept: a deadline passed, or a refusal
        raise BrokerUnavailableError(str(exc)) from exc


def group_offsets(
    brokers: list[str],
    config: dict[str, Any],
    group: str,
    topics: Iterable[str],
    timeout: float | Deadline = 10.0,
) -> dict[tuple[str, int], int]:
    """{(topic, partition): offset} the consumer ``group`` committed on ``topics`` (partitions
    without a commit are left out; a group that never committed gives {}); `TopicError`
    when the brokers do not say within ``timeout``."""
    consumer, deadline = _group_consumer(brokers, config, group), Deadline.of(timeout)
    what = f"cannot read consumer group {group!r}'s offsets"
    try:
        parts = _partitions(consumer, topics, what, deadline)
        committed = _committed(consumer, parts, what, deadline)
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): tp.offset for tp in committed if tp.offset >= 0}


def holds_records(
    brokers: Sequence[str],
    config: Mapping[str, Any],
    topic: str,
    timeout: float | Deadline = 10.0,
) -> bool:
    """Whether ``topic`` holds a record or ever held one (a partition's high watermark
    above 0); False when it does not exist. `TopicError` when the brokers do not say
    within ``timeout`` (a topic just created may not have its leaders known yet: asked
    again until then)."""
    consumer = _group_consumer(brokers, config, "tsi-watermarks")  # asks, never joins
    deadline, what = Deadline.of(timeout), f"cannot read topic {topic}'s offsets"
    try:
        parts = _partitions(consumer, [topic], what, deadline)
        return any(end > 0 for _, end in _watermarks(consumer, parts, what, deadline))
    finally:
        consumer.close()


@dataclass(frozen=True)
class PartitionLag:
    """A consumer group's position on one partition (``tsi topics check``)."""

    topic: str
    partition: int
    committed: int | None  # the next offset the group reads; None: it committed nothing here
    start: int  # the oldest offset the partition still holds
    end: int  # the high watermark: the offset the next message will get

    @property
    def lag(self) -> int | None:
        """Messages the group has yet to read (None when it committed nothing here)."""
        return None if self.committed is None else max(0, self.end - self.committed)

    def summary(self) -> str:
        """``tsi.requests[0]: committed 40, end 50, lag 10``."""
        where = f"{self.topic}[{self.partition}]"
        if self.committed is None:
            held = self.end - self.start
            return f"{where}: nothing committed, end {self.end} ({held} message(s) held)"
        return f"{where}: committed {self.committed}, end {self.end}, lag {self.lag}"


def group_lag(
    brokers: Sequence[str],
    config: Mapping[str, Any],
    group: str,
    topics: Iterable[str],
    timeout: float | Deadline = 10.0,
) -> list[PartitionLag]:
    """Per partition of ``topics`` (those that exist), the offset ``group`` committed, the
    partition's end and the lag between them; `TopicError` (one line) when the brokers do
    not say."""
    consumer, deadline = _group_consumer(brokers, config, group), Deadline.of(timeout)
    what = f"cannot read consumer group {group!r}'s lag"
    try:
        parts = _partitions(consumer, topics, what, deadline)
        committed = _committed(consumer, parts, what, deadline)
        marks = _watermarks(consumer, committed, what, deadline)
    finally:
        consumer.close()
    return [
        PartitionLag(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else None, start, end)
        for tp, (start, end) in zip(committed, marks, strict=True)
    ]


def _group_consumer(brokers: Sequence[str], config: Mapping[str, Any], group: str) -> Any:
    """A consumer of ``group`` that only asks (it never subscribes, so it never joins it)."""
    from confluent_kafka import Consumer

    settings = {
        **with_reconnect_defaults(connection_settings(config)),
        "bootstrap.servers": ",".join(brokers),
    }
    try:
        return Consumer(
            {**settings, "group.id": group, "enable.auto.commit": False, "log_level": 0}
        )
    except KafkaException as exc:
        raise TopicError(f"Kafka client settings refused: {_reason(exc)}") from None


def _partitions(
    consumer: Any, topics: Iterable[str], what: str, timeout: float | Deadline
) -> list[Any]:
    """Every partition of the ``topics`` that exist, in topic and partition order."""
    from confluent_kafka import TopicPartition

    known = retried(lambda left: consumer.list_topics(timeout=left).topics, what, timeout)
    return [
        TopicPartition(t, p)
        for t in dict.fromkeys(topics)
        if t in known
        for p in sorted(known[t].partitions)
    ]


def _committed(consumer: Any, parts: list[Any], what: str, timeout: float | Deadline) -> list[Any]:
    """The group's committed offsets of ``parts`` (negative where it committed nothing)."""
    if not parts:
        return []
    return retried(lambda left: consumer.committed(parts, timeout=left), what, timeout)


#: ListOffsets' special timestamps: the oldest offset, and the latest (the high watermark).
OLDEST, LATEST = -2, -1


def offsets_at(consumer: Any, parts: list[tuple[str, int]], spec: int, timeout: float) -> list[int]:
    """The offset at ``spec`` (``OLDEST`` or ``LATEST``) of each of ``parts`` (topic,
    partition), in one batched ListOffsets ask of their leaders: ``offsets_for_times``
    passes its timestamps to the broker as they are, and ListOffsets reads -2 and -1 so.
    ``KafkaException`` for a partition the broker answers with an error."""
    from confluent_kafka import TopicPartition

    if not parts:
        return []
    asked = [TopicPartition(topic, partition, spec) for topic, partition in parts]
    found = consumer.offsets_for_times(asked, timeout=timeout)
    for tp in found:
        if tp.error is not None:
            raise KafkaException(tp.error)
    return [tp.offset for tp in found]


def _watermarks(
    consumer: Any, parts: list[Any], what: str, timeout: float | Deadline
) -> list[tuple[int, int]]:
    """(oldest offset, high watermark) of each of ``parts``, asked of their leaders: two
    batched asks (``offsets_at``), whatever the number of partitions."""
    named = [(tp.topic, tp.partition) for tp in parts]

    def marks(left: float) -> list[tuple[int, int]]:
        oldest, latest = (offsets_at(consumer, named, spec, left) for spec in (OLDEST, LATEST))
        return list(zip(oldest, latest, strict=True))

    return retried(marks, what, timeout)

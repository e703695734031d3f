"""The experiments on Kafka: the compacted topic ``{app}.experiments`` (key: the name,
value: the resource's JSON) is the source of truth, and ``{app}.experiments.audit``
(kept, not compacted) holds every change's ``Audit`` record.

A change reads the topic to its end, applies a ``model`` operation to the experiment's
current resource and writes the new resource, then its audit record; ``expected_version``
guards against a concurrent writer.

>>> topic_names("shop")
('shop.experiments', 'shop.experiments.audit')
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import NewTopic

from flows.experiments.model import Audit, ExperimentError, NotFoundError, Resource
from flows.service.connectors.kafka_admin import TopicError, admin_client, wait_for_leaders
from flows.service.connectors.kafka_config import connection_settings

log = logging.getLogger("tsi")

Operation = Callable[[Resource | None], tuple[Resource, Audit | None]]
#: The compacted topic keeps the latest resource of each experiment.
COMPACTED = {"cleanup.policy": "compact"}
#: The audit topic keeps every record (no deletion by age).
KEPT = {"cleanup.policy": "delete", "retention.ms": "-1"}


class StoreError(TopicError):
    """Kafka did not answer or refused: one line saying what (a ``TopicError``, which
    the service's start-up checks report)."""


def topic_names(app: str) -> tuple[str, str]:
    """(the compacted topic, the audit topic) of application ``app``."""
    return f"{app}.experiments", f"{app}.experiments.audit"


def decode(message: Message) -> tuple[str, Resource | None]:
    """(the experiment's name, its resource or None for a tombstone) of a record of the
    compacted topic; ``ExperimentError`` naming what is wrong with a bad one."""
    key = message.key()
    name = key.decode("utf-8", "replace") if key else ""
    value = message.value()
    if value is None:
        return name, None
    try:
        resource = Resource.from_json(orjson.loads(value))
    except orjson.JSONDecodeError as exc:
        raise ExperimentError(f"record {name!r} is not JSON: {exc}") from None
    if resource.name != name:
        raise ExperimentError(f"record keyed {name!r} holds experiment {resource.name!r}")
    return name, resource


def client_settings(brokers: Sequence[str], config: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka settings for ``brokers`` with the connection settings of ``config``."""
    return {**connection_settings(config), "bootstrap.servers": ",".join(brokers)}


def read_to_end(settings: Mapping[str, Any], topic: str, timeout: float) -> list[Message]:
    """Every record of ``topic`` from its start to its end as it is now."""
    consumer = Consumer({**settings, "group.id": f"{topic}.reader", "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=timeout).topics[topic].partitions
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout)[1]
            for p in partitions
        }
        left = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records, deadline = [], time.monotonic() + timeout
        while left:
            if time.monotonic() > deadline:
                raise StoreError(f"topic {topic} was not read to its end within {timeout:g} s")
            message = consumer.poll(0.2)
            if message is None or message.error():
                continue
            records.append(message)
            if message.offset() + 1 >= ends[message.partition()]:
                left.discard(message.partition())
        return records
    except KafkaException as exc:
        raise StoreError(f"cannot read topic {topic}: {exc.args[0].str()}") from None
    finally:
        consumer.close()


class ExperimentStore:
    """The experiments of application ``app`` on ``brokers``."""

    def __init__(
        self,
        brokers: Sequence[str],
        app: str,
        config: Mapping[str, Any] | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.brokers, self.timeout = list(brokers), timeout
        self.topic, self.audit_topic = topic_names(app)
        self.settings = client_settings(self.brokers, config or {})

    def ensure_topics(self) -> None:
        """Create the two topics (one partition each) where they are missing."""
        admin = admin_client(self.brokers, self.settings)
        new = [
            NewTopic(self.topic, 1, config=COMPACTED),
            NewTopic(self.audit_topic, 1, config=KEPT),
        ]
        futures = admin.create_topics(new, operation_timeout=self.timeout)
        for name, future in futures.items():
            try:
                future.result(self.timeout)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in exc.args[0].name():
                    raise StoreError(f"cannot create topic {name}: {exc.args[0].str()}") from None
        try:
            wait_for_leaders(admin, [self.topic, self.audit_topic], self.timeout)
        except TopicError as exc:
            raise StoreError(str(exc)) from None

    def current(self) -> dict[str, Resource]:
        """Every experiment now (archived ones too), by name; a bad record is logged and
        skipped."""
        found: dict[str, Resource] = {}
        for message in read_to_end(self.settings, self.topic, self.timeout):
            try:
                name, resource = decode(message)
            except ExperimentError as exc:
                log.warning("experiments topic %s: record skipped: %s", self.topic, exc)
                continue
            if resource is None:
                found.pop(name, None)
            else:
                found[name] = resource
        return found

    def get(self, name: str) -> Resource:
        """The experiment ``name`` (``NotFoundError`` when there is none)."""
        found = self.current().get(name)
        if found is None:
            raise NotFoundError(f"no experiment {name!r}")
        return found

    def history(self, name: str) -> list[Audit]:
        """The audit records of ``name``, oldest first."""
        records = []
        for message in read_to_end(self.settings, self.audit_topic, self.timeout):
            if message.key() != name.encode():
                continue
            try:
                records.append(Audit(**orjson.loads(message.value())))
            except (orjson.JSONDecodeError, TypeError) as exc:
                log.warning("audit topic %s: record skipped: %s", self.audit_topic, exc)
        return records

    def change(self, name: str, operation: Operation) -> tuple[Resource, Audit | None]:
        """``operation`` applied to ``name``'s current resource (None: none yet); the new
        resource and its audit record written when it changed something."""
        try:
            resource, audit = operation(self.current().get(name))
        except NotFoundError:
            raise NotFoundError(f"no experiment {name!r}") from None
        if audit is not None:
            self._write(resource, audit)
        return resource, audit

    def _write(self, resource: Resource, audit: Audit) -> None:
        producer = Producer({**self.settings, "acks": "all", "enable.idempotence": True})
        failed: list[str] = []

        def delivered(error: Any, _message: Any) -> None:
            if error is not None:
                failed.append(error.str())

        key = resource.name.encode()
        producer.produce(self.topic, orjson.dumps(resource.to_json()), key, on_delivery=delivered)
        producer.produce(
            self.audit_topic, orjson.dumps(audit.to_json()), key, on_delivery=delivered
        )
        left = producer.flush(self.timeout)
        if failed or left:
            problem = failed[0] if failed else f"not acknowledged within {self.timeout:g} s"
            raise StoreError(f"experiment {resource.name!r} not written: {problem}")

"""Following the experiments topic in a running service: a background consumer that
replays the compacted topic into the current set and, each time it has caught up with a
change, hands the registry that set serves to ``on_change`` (the service makes it
pending, as a SIGHUP reload does). A bad record is a log line and a count
(``tsi_experiment_records_refused``), never the end of the service.
"""

from __future__ import annotations

import functools
import logging
import threading
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from prometheus_client import Counter

from flows.experiments.model import ExperimentError, Resource, apply, registry_of
from flows.experiments.store import ExperimentStore, client_settings, decode, topic_names
from flows.service.instances.registry import LiveRegistry, Registry, RegistryError

log = logging.getLogger("tsi")
#: The ``who`` of experiments created from ``tsi run --registry`` with the topic.
SEEDER = "tsi run --registry"

REFUSED = Counter(
    "tsi_experiment_records_refused", "Records of the experiments topic that were refused."
)


class Follower:
    """Reads ``topic`` from its start, for as long as the process runs."""

    def __init__(
        self,
        settings: Mapping[str, Any],
        topic: str,
        on_change: Callable[[Registry], None],
    ) -> None:
        self.topic, self.on_change = topic, on_change
        self.settings = {**settings, "group.id": f"{topic}.follower", "enable.auto.commit": False}
        self.current: dict[str, Resource] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="experiments", daemon=True)

    def start(self) -> Follower:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        consumer = Consumer(self.settings)
        consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        dirty = False
        try:
            while not self._stop.is_set():
                message = consumer.poll(0.2)
                if message is None:
                    if dirty:
                        self._hand_over()
                        dirty = False
                    continue
                if message.error():
                    continue
                dirty = self._read(message) or dirty
        finally:
            consumer.close()

    def _read(self, message: Any) -> bool:
        """Take one record into the current set; False (logged, counted) for a bad one."""
        try:
            name, resource = decode(message)
        except ExperimentError as exc:
            REFUSED.inc()
            log.warning("experiments topic %s: record refused: %s", self.topic, exc)
            return False
        if resource is None:
            self.current.pop(name, None)
        else:
            self.current[name] = resource
        return True

    def _hand_over(self) -> None:
        """The registry of the current set to ``on_change`` (a set the registry refuses
        is logged and counted)."""
        try:
            self.on_change(registry_of(self.current.values()))
        except RegistryError as exc:
            REFUSED.inc()
            log.warning("experiments topic %s: set refused: %s", self.topic, exc)


def follow(live: LiveRegistry, settings: Mapping[str, Any], topic: str) -> Follower:
    """A started ``Follower`` that offers each new set to ``live`` (applied when the next
    epoch closes), logging what changes."""

    def offered(registry: Registry) -> None:
        said = live.offer(registry, f"experiments topic {topic}")
        if said is not None:
            log.warning(said)

    return Follower(settings, topic, offered).start()


def topic_registry(
    brokers: Sequence[str],
    app: str,
    config: Mapping[str, Any],
    timeout: float,
    seed: Path | None = None,
) -> LiveRegistry:
    """The registry application ``app``'s experiments topic serves now (the topics
    created when missing; ``StoreError`` when Kafka does not answer); the experiments of
    registry file ``seed`` that the topic lacks are created in it first."""
    store = ExperimentStore(brokers, app, config, timeout)
    store.ensure_topics()
    if seed is not None:
        Registry.load(seed)  # checked whole first: a bad file writes nothing
        tables = tomllib.loads(seed.read_text(encoding="utf-8"))["experiments"]
        have = store.current()
        for name in sorted(tables.keys() - have.keys()):
            store.change(name, functools.partial(apply, name=name, spec=tables[name], who=SEEDER))
    return LiveRegistry(registry_of(store.current().values()))


def follow_topic(
    live: LiveRegistry, brokers: Sequence[str], app: str, config: Mapping[str, Any]
) -> Follower:
    """``follow`` application ``app``'s experiments topic."""
    return follow(live, client_settings(brokers, config), topic_names(app)[0])

"""``tsi replay``: a logged stream through the same dataflow, deterministically.

The log is read whole, put in one order — the combined events file as it is, or requests
and feedback merged by their ``ts`` (ties: file order, requests first) — and run through
``build_flow`` on event time: the clock is the events' own ``ts``, expiries happen when an
instance's next event (or the end of the log) passes a deadline. The same log, registry
and seed give the same selections, byte for byte.

>>> from flows.service.registry import Registry
>>> reg = Registry.from_toml('[experiments.home]\\narms = ["a", "b"]')
>>> raw = b'{"type":"request","experiment":"home","request_id":"r1","ts":1767225600}'
>>> log = [(raw, Origin("f", None, 1))]
>>> out = replay(log, reg)
>>> [s["arm_name"] in ("a", "b") for s in out.selections]
[True]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from bytewax.dataflow import Dataflow, Stream
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.testing import TestingSink, run_main

from flows.service.connectors.files import read_lines as read_jsonl
from flows.service.connectors.memory import one_per_batch, unbatched
from flows.service.dataflow import Message, Wiring, build_flow
from flows.service.events import Origin, parse_event, parse_feedback, parse_request
from flows.service.registry import Registry


class ReplayError(ValueError):
    """The log cannot be read (missing file, unreadable topic range)."""


@dataclass
class Replayed:
    selections: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    selection_lines: list[bytes] = field(default_factory=list)  # as the service writes them
    events: int = 0
    last_ts: float = 0.0


def _ts_or(raw: bytes, default: float) -> float:
    try:
        value = orjson.loads(raw).get("ts")
    except (orjson.JSONDecodeError, AttributeError):
        return default
    return (
        float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default
    )


def read_lines(path: Path) -> Iterator[Message]:
    """Non-empty lines of a JSONL file with their origin (file, line number)."""
    try:
        for message, _ in read_jsonl(path):
            yield message
    except OSError as exc:
        raise ReplayError(f"cannot read {path}: {exc.strerror}") from None


def merge_by_time(*streams: Iterable[Message]) -> list[Message]:
    """One order for several logs: by ``ts``; a line without a readable ``ts`` keeps the
    time of the line before it in its own log; ties keep log order (first log first)."""
    keyed = []
    for rank, stream in enumerate(streams):
        last = float("-inf")
        for index, (raw, origin) in enumerate(stream):
            last = _ts_or(raw, last)
            keyed.append(((last, rank, index), (raw, origin)))
    return [message for _, message in sorted(keyed, key=lambda kv: kv[0])]


def kafka_range(
    brokers: str,
    topic: str,
    start: int | None = None,
    end: int | None = None,
    config: dict[str, Any] | None = None,
    timeout: float = 10.0,
) -> list[Message]:
    """Messages of every partition of ``topic`` with ``start <= offset < end`` (default:
    all that are there now), partition by partition."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": "tsi-replay",
            "enable.auto.commit": False,
            **(config or {}),
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=timeout)
        info = meta.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            raise ReplayError(f"topic {topic!r} not found on {brokers}")
        out: list[Message] = []
        for p in sorted(info.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            first, stop = max(low, start or 0), high if end is None else min(high, end)
            if first >= stop:
                continue
            consumer.assign([TopicPartition(topic, p, first)])
            while True:
                msg = consumer.poll(timeout)
                if msg is None:
                    raise ReplayError(f"{topic}[{p}]: no message within {timeout:g} s")
                if msg.error():
                    raise ReplayError(f"{topic}[{p}]: {msg.error()}")
                if msg.offset() >= stop:
                    break
                out.append((msg.value() or b"", Origin(topic, p, msg.offset())))
                if msg.offset() + 1 >= stop:
                    break
        return out
    except KafkaException as exc:
        raise ReplayError(f"cannot read {topic} from {brokers}: {exc}") from None
    finally:
        consumer.close()


class _ListPartition(StatefulSourcePartition[Message, None]):
    def __init__(self, messages: list[Message], clock: Replayed, tick: Callable[[int], None]):
        self.messages, self.at, self.clock, self.tick = messages, 0, clock, tick

    def next_batch(self) -> list[Message]:
        if self.at >= len(self.messages):
            raise StopIteration
        batch = self.messages[self.at : self.at + 500]
        self.at += len(batch)
        for raw, _ in batch:
            self.clock.last_ts = max(self.clock.last_ts, _ts_or(raw, self.clock.last_ts))
        self.tick(len(batch))
        return batch

    def snapshot(self) -> None:
        return None


class _ListSource(FixedPartitionedSource[Message, None]):
    def __init__(self, messages: list[Message], clock: Replayed, tick: Callable[[int], None]):
        self.messages, self.clock, self.tick = messages, clock, tick

    def list_parts(self) -> list[str]:
        return ["log"]

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _ListPartition:
        return _ListPartition(self.messages, self.clock, self.tick)


def replay(
    messages: list[Message],
    registry: Registry,
    kinds: dict[str, str] | None = None,
    seed: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> Replayed:
    """Run ``messages`` through the serving dataflow on event time.

    ``kinds`` maps a message's origin source to ``request`` or ``feedback`` (logs without
    a ``type`` field); other messages are read as the combined stream. ``seed`` replaces
    every experiment's seed (the hashed draws).
    """
    if seed is not None:
        registry = Registry(
            {n: dataclasses.replace(e, seed=seed) for n, e in registry.experiments.items()}
        )
    parsers = {"request": parse_request, "feedback": parse_feedback}
    by_source = {source: parsers[kind] for source, kind in (kinds or {}).items()}

    def parse(raw: bytes, origin: Origin, **options: Any) -> Any:
        return by_source.get(origin.source, parse_event)(raw, origin, **options)

    result = Replayed(events=len(messages))
    selections: list[tuple[str, bytes]] = []
    letters: list[tuple[str, bytes]] = []

    def source(flow: Dataflow, step: str) -> tuple[Stream, None]:
        return one_per_batch(flow, step, _ListSource(messages, result, progress or _ignore)), None

    wiring = Wiring(
        inputs={"events": source},
        selections=lambda step, up: unbatched(step, up, TestingSink(selections)),
        dead_letters=lambda step, up: unbatched(step, up, TestingSink(letters)),
        parsers={"events": parse},
    )
    flow = build_flow(
        registry, wiring, clock=lambda: result.last_ts, flow_id="tsi-replay", event_time=True
    )
    run_main(flow)
    result.selection_lines = [raw for _, raw in selections]
    result.selections = [orjson.loads(raw) for raw in result.selection_lines]
    result.dead_letters = [orjson.loads(raw) for _, raw in letters]
    return result


def _ignore(_: int) -> None:
    return None

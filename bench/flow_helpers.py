"""Subprocess helpers of ``bench_flow.py`` (each runs in a fresh interpreter).

``python bench/flow_helpers.py serve EPOCH_MS [--no-snapshot] [--no-gc]``
    The Kafka service, configured by the same environment variables as
    ``python -m bytewax.run flows.service.main:flow`` (``TSI_REGISTRY``,
    ``KAFKA_BOOTSTRAP_SERVERS``, ``TSI_TOPIC_*``; see ``flows.service.runtime.settings``),
    one worker, no recovery, with an epoch interval
    in milliseconds (``bytewax.run -s`` only takes whole seconds). Every full (generation 2)
    garbage collection is logged to stderr as ``GC2 <ms> ms``. Diagnostics only, to find
    what delays answers: ``--no-snapshot`` replaces ``GroupLogic.snapshot`` (which Bytewax
    calls for every key group touched in an epoch, at the epoch's close, even without recovery)
    by one returning None; ``--no-gc`` disables the cyclic garbage collector.

``python bench/flow_helpers.py passthrough HOPS``
    The latency reference: raw confluent-kafka, no Bytewax, no service. Requests are read
    (``TSI_TOPIC_REQUESTS``; feedback, ``TSI_TOPIC_FEEDBACK``, read and dropped) and
    written back as they came to the selections topic, with the service's producer settings
    (idempotence, ``acks=all``, ``linger.ms=1``; ``poll(0)``, no flush: the service's sink
    waits for its acknowledgements at the epoch's close). With HOPS=2 they first cross
    ``TSI_TOPIC_INTERNAL``, as the default two-topic setup's events do. One thread, every
    read non-blocking.

``python bench/flow_helpers.py floor N``
    Bytewax's own memory per key: N keys through ``op.stateful`` with a logic that keeps
    nothing; prints ``{"keys": N, "bytes_per_key": ...}`` (RSS growth / N, read by the
    logic of a last probe key once every other key has its logic).
"""

from __future__ import annotations

import gc
import json
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import bytewax.operators as op
import psutil
from bytewax.dataflow import Dataflow
from bytewax.operators import StatefulLogic
from bytewax.run import cli_main
from bytewax.testing import TestingSink, TestingSource, run_main

PROBE = -1


def serve(epoch_ms: float, options: list[str]) -> None:
    import flows.service.shards.group_logic
    from flows.service.runtime.process import Service
    from flows.service.runtime.settings import Settings

    unknown = set(options) - {"--no-snapshot", "--no-gc"}
    if unknown:
        sys.exit(f"unknown options {sorted(unknown)}")
    if "--no-snapshot" in options:
        flows.service.shards.group_logic.GroupLogic.snapshot = lambda self: None  # type: ignore[method-assign]
    if "--no-gc" in options:
        gc.disable()
    started: list[float] = []

    def log_full_collections(phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started:
            ms = (time.perf_counter() - started[0]) * 1e3
            print(f"GC2 {ms:.1f} ms", file=sys.stderr, flush=True)

    gc.callbacks.append(log_full_collections)
    epoch = timedelta(milliseconds=epoch_ms)
    cli_main(
        Service.from_settings(Settings.from_env()).flow(recovery=False),
        workers_per_process=1,
        epoch_interval=epoch,
    )


def passthrough(hops: int) -> None:
    """See the module's docstring; runs until terminated."""
    import os

    from confluent_kafka import Consumer, Producer

    env = os.environ
    brokers = env["KAFKA_BOOTSTRAP_SERVERS"]
    producer = Producer(
        {"bootstrap.servers": brokers, "enable.idempotence": True, "acks": "all", "linger.ms": 1}
    )

    def reader(topics: list[str]) -> Consumer:
        consumer = Consumer(
            {
                "bootstrap.servers": brokers,
                "group.id": f"passthrough-{os.getpid()}-{topics[0]}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        consumer.subscribe(topics)
        return consumer

    inputs = [env["TSI_TOPIC_REQUESTS"], env["TSI_TOPIC_FEEDBACK"]]
    first = reader(inputs)
    second = reader([env["TSI_TOPIC_INTERNAL"]]) if hops == 2 else None
    to_first = env["TSI_TOPIC_INTERNAL"] if hops == 2 else env["TSI_TOPIC_SELECTIONS"]
    while True:
        idle = _copy(first, producer, to_first, hops == 2, inputs[0])
        if second is not None:
            idle = _copy(second, producer, env["TSI_TOPIC_SELECTIONS"], False, None) and idle
        if idle:
            time.sleep(0.001)  # as Bytewax polls an empty source again 1 ms later


def _copy(consumer: Any, producer: Any, to: str, copies: bool, requests: str | None) -> bool:
    """One non-blocking read written to ``to``; True when there was nothing to
    read. ``copies``: every message is written with a header naming its input (as the
    service's internal copies are); else only requests are (the answers): those of topic
    ``requests``, or copies whose header names a request."""
    messages = consumer.consume(1000, 0)
    for message in messages:
        if message.error() is not None:
            continue
        if copies:
            tag = b"r" if message.topic() == requests else b"f"
            producer.produce(to, message.value(), message.key(), headers=[("o", tag)])
        elif message.topic() == requests or (message.headers() or [("o", b"")])[0][1] == b"r":
            producer.produce(to, message.value(), message.key())
    producer.poll(0)
    return not messages


class _Empty(StatefulLogic[int, Any, None]):
    """Keeps nothing; the probe item records the RSS."""

    __slots__ = ()
    rss: int | None = None

    def on_item(self, value: int) -> tuple[list[Any], bool]:
        if value == PROBE:
            _Empty.rss = psutil.Process().memory_info().rss
        return [], StatefulLogic.RETAIN

    def snapshot(self) -> None:
        return None


def floor(n: int) -> dict[str, float]:
    def items() -> Iterator[tuple[str, int]]:
        for i in range(n):
            yield f"bench\x1fu{i}", i  # the same keys as the service's instances
        yield "probe", PROBE

    flow = Dataflow("floor")
    keyed = op.input("in", flow, TestingSource(items(), batch_size=1000))
    out = op.stateful("state", keyed, lambda _resume: _Empty())
    op.output("out", out, TestingSink([]))
    before = psutil.Process().memory_info().rss
    run_main(flow)
    if _Empty.rss is None:
        raise RuntimeError("the probe key was never processed")
    return {"keys": n, "bytes_per_key": (_Empty.rss - before) / n}


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in ("serve", "floor", "passthrough"):
        sys.exit(
            "usage: flow_helpers.py serve EPOCH_MS [--no-snapshot] [--no-gc] | floor N"
            " | passthrough HOPS"
        )
    if sys.argv[1] == "serve":
        serve(float(sys.argv[2]), sys.argv[3:])
    elif sys.argv[1] == "passthrough":
        passthrough(int(sys.argv[2]))
    else:
        print(json.dumps(floor(int(sys.argv[2]))))


if __name__ == "__main__":
    main()

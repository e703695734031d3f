"""The throughput references of ``bench_flow.py``: the service's work without the service.

Each reference does what the service does to a workload of N requests and their N
feedback events: it consumes all 2N input events, writes one answer per request (N) to an
answer topic, and drops the feedback. It runs pipelined, as the service does: consuming
and producing at once. The two-hop references also copy all 2N events to an internal
topic first and answer from there, the two stages running at the same time, as the
service's default two-topic setup does (its internal topic). A message is feedback when
its bytes hold ``"loss"`` (the workload's requests never do), so the references need no
JSON parsing.

* ``python``: confluent-kafka in one Python thread (the service's one worker): batched
  ``consume``, ``produce`` + ``poll(0)``, the service's producer settings (idempotence,
  ``acks=all``, ``linger.ms=1``). Two hops: both stages' consumers read in turn,
  non-blocking, by the same thread.
* ``kcat``: the C-level limit of the stack: ``kcat -C | grep -v '"loss"' | kcat -P``
  (librdkafka's own client, the Debian package ``kcat``), the same producer settings. Two
  hops: two such pipelines at once, the second reading the internal topic the first
  writes. What the broker and librdkafka carry on this machine, with no Python.

Every reference is timed as the service is: from its first answer to its last (their
Kafka timestamps), by the caller.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer

FEEDBACK_MARK = b'"loss"'
#: the producer settings of the service's sinks (flows/service/connectors/kafka_sink.py)
PRODUCER = {"enable.idempotence": True, "acks": "all", "linger.ms": 1}
KINDS = ("python", "kcat")
INSTALL_KCAT = "apt-get install -y kcat (Debian/Ubuntu; `make bench-flow` installs it)"


def is_answered(value: bytes) -> bool:
    """Whether the references answer this message: requests yes, feedback no.

    >>> is_answered(b'{"unit":"u1","request_id":"r1"}')
    True
    >>> is_answered(b'{"unit":"u1","request_id":"r1","loss":0.5}')
    False
    """
    return FEEDBACK_MARK not in value


def run(
    kind: str, bootstrap: str, inputs: list[str], out: str, events: int, internal: str | None = None
) -> None:
    """One reference run: ``events`` input events of ``inputs`` consumed, their requests
    answered to ``out`` (through ``internal`` first when given: two hops)."""
    if kind == "python":
        if internal is None:
            python_one_hop(bootstrap, inputs, out, events)
        else:
            python_two_hops(bootstrap, inputs, internal, out, events)
    elif kind == "kcat":
        kcat_pipelines(bootstrap, inputs, out, events, internal)
    else:
        raise ValueError(f"unknown reference {kind!r}, not one of {KINDS}")


# ------------------------------------------------------------------------------ Python


def _consumer(bootstrap: str, topics: list[str]) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reference-{uuid.uuid4().hex[:12]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(topics)
    return consumer


def _producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, **PRODUCER})


def _produce(producer: Producer, topic: str, value: bytes, key: bytes | None) -> None:
    while True:
        try:
            producer.produce(topic, value, key)
            return
        except BufferError:  # the local queue is full: let deliveries drain it
            producer.poll(0.01)


def python_one_hop(bootstrap: str, inputs: list[str], out: str, events: int) -> None:
    consumer, producer = _consumer(bootstrap, inputs), _producer(bootstrap)
    seen = 0
    try:
        while seen < events:
            for message in consumer.consume(num_messages=1000, timeout=1.0):
                if message.error() is not None:
                    continue
                seen += 1
                value = message.value()
                if is_answered(value):
                    _produce(producer, out, value, message.key())
            producer.poll(0)
        _flush(producer)
    finally:
        consumer.close()


def python_two_hops(
    bootstrap: str, inputs: list[str], internal: str, out: str, events: int
) -> None:
    """Both stages in one thread, as the service's worker reads its inputs and its internal
    topic in turn; it waits 1 ms when neither had anything (Bytewax polls an empty source
    again 1 ms later)."""
    first, second = _consumer(bootstrap, inputs), _consumer(bootstrap, [internal])
    producer = _producer(bootstrap)
    copied = seen = 0
    try:
        while seen < events:
            batch = first.consume(1000, 0) if copied < events else []
            for message in batch:
                if message.error() is None:
                    copied += 1
                    _produce(producer, internal, message.value(), message.key())
            answers = second.consume(1000, 0)
            for message in answers:
                if message.error() is not None:
                    continue
                seen += 1
                value = message.value()
                if is_answered(value):
                    _produce(producer, out, value, message.key())
            producer.poll(0)
            if not batch and not answers:
                time.sleep(0.001)
        _flush(producer)
    finally:
        first.close()
        second.close()


def _flush(producer: Producer) -> None:
    left = producer.flush(60)
    if left:
        raise RuntimeError(f"the reference left {left} messages unacknowledged")


# ------------------------------------------------------------------------------ kcat


def kcat_path() -> str:
    """kcat's path, or RuntimeError saying how to install it."""
    path = shutil.which("kcat")
    if path is None:
        raise RuntimeError(f"the C-level reference needs kcat: {INSTALL_KCAT}")
    return path


def kcat_version() -> str:
    """kcat's version line (with its librdkafka's), or what is missing."""
    try:
        out = subprocess.run([kcat_path(), "-V"], capture_output=True, text=True, check=False)
    except RuntimeError as err:
        return str(err)
    return next((line for line in out.stdout.splitlines() if line.startswith("Version")), "?")


def kcat_stage(bootstrap: str, inputs: list[str], out: str, events: int, answers: bool) -> str:
    """The shell pipeline of one stage: ``events`` messages of ``inputs`` read from their
    start (a fresh group), written to ``out`` key and value alike; only the requests when
    ``answers``."""
    kcat = shlex.quote(kcat_path())
    consume = [
        kcat, "-q", "-b", bootstrap, "-C", "-G", f"reference-{uuid.uuid4().hex[:12]}",
        "-X", "auto.offset.reset=earliest", "-X", "enable.auto.commit=false",
        "-c", str(events), "-f", shlex.quote("%k\\t%s\\n"), *inputs,
    ]  # fmt: skip
    settings = [
        x for name, value in PRODUCER.items() for x in ("-X", f"{name}={str(value).lower()}")
    ]
    produce = [kcat, "-q", "-b", bootstrap, "-P", "-t", out, "-K", shlex.quote("\\t"), *settings]
    middle = [f"grep -v -F {shlex.quote(FEEDBACK_MARK.decode())}"] if answers else []
    return " | ".join([" ".join(consume), *middle, " ".join(produce)])


def kcat_pipelines(
    bootstrap: str, inputs: list[str], out: str, events: int, internal: str | None
) -> None:
    """One stage (one hop), or two at once (through ``internal``); each ends once it has
    read ``events`` messages and written them."""
    if internal is None:
        stages = [kcat_stage(bootstrap, inputs, out, events, answers=True)]
    else:
        stages = [
            kcat_stage(bootstrap, inputs, internal, events, answers=False),
            kcat_stage(bootstrap, [internal], out, events, answers=True),
        ]
    env = dict(os.environ, LC_ALL="C")  # grep on bytes, fast
    procs = [
        subprocess.Popen(["bash", "-o", "pipefail", "-c", stage], env=env, stderr=subprocess.PIPE)
        for stage in stages
    ]
    errors: list[Any] = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode:
            errors.append(err.decode(errors="replace").strip())
    if errors:
        raise RuntimeError("kcat reference failed: " + "; ".join(errors))

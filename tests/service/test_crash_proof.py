"""No input stops the service: messages up to the broker's limit, kill -9, restarts.

The service runs as a real process (``python -m bytewax.run flows.service.main:flow``) on the
project's broker, reading the combined events topic, with recovery.
"""

import base64
import hashlib
import random
import signal
import subprocess
import sys
import threading
import time

import orjson
from confluent_kafka import KafkaError, KafkaException, Producer

from flows.service.wire.events import MAX_MESSAGE_BYTES
from flows.testing.kafka_broker import consume_all, create_topic, unique_topic
from tests.service.streams import REGISTRY_TOML, REQUESTS, event_stream, service_env, start_service
from tests.waiting import wait_for

BIG_SIZES = (MAX_MESSAGE_BYTES + 1, 500_000, 900_000)  # and the broker's limit, probed


def sized_request(rid: str, size: int) -> bytes:
    """A request of exactly ``size`` bytes (a long padding field)."""
    head = {"type": "request", "experiment": "shop", "unit": "u0", "request_id": rid, "pad": ""}
    empty = len(orjson.dumps(head))
    return orjson.dumps({**head, "pad": "x" * (size - empty)})


def largest_accepted(bootstrap: str, topic: str, key: bytes) -> int:
    """The largest value (with ``key``) the broker accepts on ``topic``: its limit, probed."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "message.max.bytes": 4_000_000,  # let the broker, not the client, decide
            "linger.ms": 0,
        }
    )

    def accepted(size: int) -> bool:
        result = []
        try:
            producer.produce(
                topic,
                sized_request("probe", size),
                key=key,
                on_delivery=lambda err, _msg: result.append(err),
            )
        except KafkaException as exc:
            assert exc.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
            return False
        assert producer.flush(30) == 0
        if result[0] is None:
            return True
        assert result[0].code() == KafkaError.MSG_SIZE_TOO_LARGE, result[0]
        return False

    low, high = 900_000, 1_100_000  # the broker default is 1048588 bytes a record batch
    assert accepted(low) and not accepted(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if accepted(mid) else (low, mid)
    return low


def oversize_letters(bootstrap: str, topic: str) -> int:
    """How many distinct input offsets ``topic`` holds an oversize dead letter for."""
    letters = [orjson.loads(v) for _, v, _ in consume_all(bootstrap, topic)[0]]
    return len({(d["partition"], d["offset"]) for d in letters if d["reason"] == "oversize"})


def test_messages_up_to_the_broker_limit_are_dead_lettered_once_across_kill_9(
    kafka_bootstrap, tmp_path
):
    rng = random.Random(99)
    events_topic = create_topic(kafka_bootstrap, unique_topic("ev"), 3)
    sel_topic = create_topic(kafka_bootstrap, unique_topic("sel"), 3)
    dlq_topic = create_topic(kafka_bootstrap, unique_topic("dlq"), 1)
    probe_topic = create_topic(kafka_bootstrap, unique_topic("probe"), 1)
    limit = largest_accepted(kafka_bootstrap, probe_topic, b"shop\x1fu0")
    sizes = [*BIG_SIZES, limit]
    good = event_stream(rng)
    stream = list(good)
    for n, size in enumerate(sizes):  # interleaved with the good traffic
        stream.insert(150 * (n + 1), ("shop\x1fu0", sized_request(f"big{n}", size)))
    stream.insert(100, ("shop\x1fu0", sized_request("at-limit", MAX_MESSAGE_BYTES)))
    registry_path = tmp_path / "registry.toml"
    registry_path.write_text(REGISTRY_TOML)
    recovery = tmp_path / "recovery"
    recovery.mkdir()
    subprocess.run([sys.executable, "-m", "bytewax.recovery", str(recovery), "1"], check=True)
    env = service_env(kafka_bootstrap, registry_path, events_topic, sel_topic, dlq_topic)

    stop = threading.Event()

    def produce_slowly():
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "message.max.bytes": 4_000_000})
        for start_at in range(0, len(stream), 40):
            for key, value in stream[start_at : start_at + 40]:
                producer.produce(events_topic, key=key, value=value)
            if producer.flush(30) or stop.is_set():
                return
            time.sleep(0.2)  # pacing the stream while the service is killed, not a wait

    producer = threading.Thread(target=produce_slowly, daemon=True)
    producer.start()
    kills = 0
    try:
        while producer.is_alive() or kills < 3:
            proc = start_service(env, recovery)
            time.sleep(rng.uniform(2.0, 4.0))  # deliberate: a kill at a random point
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]  # alive, killed
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
    finally:
        stop.set()
    producer.join()

    proc = start_service(env, recovery)  # the last run catches up and stays alive
    try:
        deadline = time.monotonic() + 120
        answered: set[str] = set()
        while time.monotonic() < deadline and len(answered) < REQUESTS + 1:
            time.sleep(1.0)  # the poll's interval, within the deadline above
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            answered = {
                orjson.loads(v)["request_id"]
                for part in consume_all(kafka_bootstrap, sel_topic).values()
                for _, v, _ in part
            }
        wait_for(
            lambda: oversize_letters(kafka_bootstrap, dlq_topic) >= len(sizes),
            proc,
            120,
            "a dead letter for each oversize request",
        )
        assert proc.poll() is None  # alive after every big message
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # all good traffic served, the request of exactly the size limit too
    assert answered == {f"r{i}" for i in range(REQUESTS)} | {"at-limit"}
    letters = [orjson.loads(v) for _, v, _ in consume_all(kafka_bootstrap, dlq_topic)[0]]
    assert all(len(orjson.dumps(d)) < 100_000 for d in letters)  # each fits comfortably
    oversize = {}
    for letter in letters:  # re-emitted after a kill: identical, deduplicated by origin
        if letter["reason"] == "oversize":
            where = (letter["partition"], letter["offset"])
            assert oversize.setdefault(where, letter) == letter
    assert sorted(d["raw_size"] for d in oversize.values()) == sorted(sizes)
    big = {size: sized_request(f"big{n}", size) for n, size in enumerate(sizes)}
    for letter in oversize.values():
        raw = big[letter["raw_size"]]
        assert (
            letter["truncated"] is True and letter["raw_sha256"] == hashlib.sha256(raw).hexdigest()
        )
        assert base64.b64decode(letter["raw_b64"]) == raw[: 64 * 1024]
    assert {d["reason"] for d in letters} == {"oversize", "malformed_json"}
    assert kills >= 3

"""A hostile run on the real broker: every kind of bad input, messages up to the broker's
limit, kill -9 and a registry change between restarts. The service stays alive and every
message is accounted for: a selection, an applied feedback, or a dead letter naming it."""

import random
import signal
import time

import orjson
from confluent_kafka import Producer

from flows.service.runtime.recovery import read_states
from flows.testing.kafka_broker import consume_all, create_topic, unique_topic
from tests.service.test_crash_proof import largest_accepted, sized_request
from tests.service.test_operating import TSI
from tests.waiting import wait_for

REGISTRY = """
[experiments.shop]
arms = [{arms}]
per_unit = true
feedback_ttl = 3600
[experiments.ctx]
arms = ["x", "y"]
competition = {{ kind = "contextual", n_contexts = 3 }}
feedback_ttl = 3600
"""
NOW = time.time()


def request(rid, unit="u1", **extra):
    return {"type": "request", "experiment": "shop", "unit": unit, "request_id": rid, **extra}


def feedback(rid, unit="u1", **extra):
    return {"type": "feedback", "experiment": "shop", "unit": unit, "request_id": rid, **extra}


def hostile(limit):
    """(key, bytes, expected) triples: expected is 'selection', 'applied' or a reason."""
    bad = [
        (b"{not json", "malformed_json"),
        (b"", "malformed_json"),
        (b"\xff\xfe\x00", "malformed_json"),
        (b"[" * 5000 + b"]" * 5000, "malformed_json"),  # nesting deeper than the parser allows
        (
            b'{"type": "request", "experiment": "shop", "unit": "u1", "request_id": NaN}',
            "malformed_json",
        ),
        (b"[1, 2, 3]", "not_an_object"),
        (b"null", "not_an_object"),
        (None, "wrong_type"),  # a tombstone: no value at all
        (orjson.dumps({"experiment": "shop", "request_id": "t1"}), "missing_field"),
        (orjson.dumps({"type": "click", "experiment": "shop", "request_id": "t2"}), "bad_value"),
        (orjson.dumps(request(5)), "wrong_type"),
        (orjson.dumps(request(["a", "list"])), "wrong_type"),
        (orjson.dumps(request({"an": "object"})), "wrong_type"),
        (orjson.dumps(request("x" * 300)), "bad_value"),
        (orjson.dumps(request("t3", unit="")), "bad_value"),
        (orjson.dumps(request("t4", ts=1e308)), "bad_value"),
        (orjson.dumps(request("t5", ts=-5.0)), "bad_value"),
        (orjson.dumps(request("t6", ts="yesterday")), "wrong_type"),
        (orjson.dumps(request("t7", context=0)), "context_out_of_range"),
        (orjson.dumps({**request("t8"), "experiment": "nope"}), "unknown_experiment"),
        (orjson.dumps({**request("t9"), "unit": None}), "missing_field"),
        (orjson.dumps(feedback("good0", loss=1, reward=1)), "bad_value"),
        (orjson.dumps(feedback("good0")), "missing_field"),
        (orjson.dumps(feedback("good0", loss="1")), "wrong_type"),
        (orjson.dumps(feedback("good0", loss=1e301)), "loss_out_of_range"),
        (orjson.dumps(feedback("good0", loss=1)).replace(b":1", b":1e400"), "malformed_json"),
        (orjson.dumps(feedback("good0", loss=1, arm=-1)), "bad_value"),
        (orjson.dumps(feedback("good0", loss=1, arm=True)), "wrong_type"),
        (orjson.dumps(feedback("open1", loss=1, arm="no-such-arm")), "arm_mismatch"),
        (orjson.dumps(feedback("never-asked", loss=1)), "early"),  # waits, then unknown_ticket
        (
            orjson.dumps({"type": "request", "experiment": "ctx", "request_id": "c1"}),
            "missing_field",
        ),
        (
            orjson.dumps(
                {"type": "request", "experiment": "ctx", "request_id": "c2", "context": 3}
            ),
            "context_out_of_range",
        ),
        (sized_request("big1", 200_000), "oversize"),
        (sized_request("big2", limit), "oversize"),
    ]
    good = [
        (orjson.dumps(request("good0", ts=NOW)), "selection"),
        (orjson.dumps(feedback("good0", loss=2.5, ts=NOW)), "applied"),
        (orjson.dumps(request("open1")), "selection"),  # its feedback names a wrong arm
        (orjson.dumps(feedback("good0", loss=2.5)), "duplicate_feedback"),
        (orjson.dumps(request("good0", context=1)), "context_mismatch"),  # settled: its context
        (
            orjson.dumps(
                {"type": "request", "experiment": "ctx", "request_id": "c3", "context": 2}
            ),
            "selection",
        ),
    ]
    return [("shop\x1fu1", raw, expected) for raw, expected in good + bad]


def traffic(rng, n):
    """Good requests and their feedback for a few users, in order per user."""
    out = []
    for i in range(n):
        unit = f"u{i % 5}"
        out.append((f"shop\x1f{unit}", orjson.dumps(request(f"g{i}", unit)), "selection"))
        loss = rng.choice([0.0, 1.0, 1e6])
        out.append((f"shop\x1f{unit}", orjson.dumps(feedback(f"g{i}", unit, loss=loss)), "applied"))
    return out


def test_a_hostile_run_leaves_the_service_alive_and_every_message_accounted_for(
    kafka_bootstrap, tmp_path
):
    rng = random.Random(7)
    names = {n: unique_topic(n) for n in ("ev", "sel", "dlq")}
    for name, parts in (("ev", 1), ("sel", 2), ("dlq", 1)):
        create_topic(kafka_bootstrap, names[name], parts)
    limit = largest_accepted(
        kafka_bootstrap, create_topic(kafka_bootstrap, unique_topic("p")), b"shop\x1fu1"
    )
    stream = traffic(rng, 150)
    corpus = hostile(limit)
    for n, item in enumerate(corpus):  # spread through the good traffic
        stream.insert(5 + 9 * n, item)
    registry = tmp_path / "registry.toml"
    registry.write_text(REGISTRY.format(arms='"a", "b", "c"'))
    recovery = tmp_path / "recovery"
    args = [
        "run",
        "--registry",
        registry,
        "--brokers",
        kafka_bootstrap,
        "--events-topic",
        names["ev"],
        "--selections-topic",
        names["sel"],
        "--dlq-topic",
        names["dlq"],
        "--recovery-dir",
        recovery,
        "--snapshot-every",
        "0.5",
    ]
    import subprocess

    def start():
        return subprocess.Popen([TSI, *map(str, args)], stderr=subprocess.PIPE, text=True)

    producer = Producer({"bootstrap.servers": kafka_bootstrap, "message.max.bytes": 4_000_000})
    half = len(stream) // 2
    for key, raw, _ in stream[:half]:
        producer.produce(names["ev"], raw, key=key)
    assert producer.flush(30) == 0
    proc = start()
    time.sleep(rng.uniform(3.0, 5.0))  # deliberate: a kill at a random point of the run
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    proc.send_signal(signal.SIGKILL)  # mid-run
    proc.wait()
    registry.write_text(REGISTRY.format(arms='"a", "b", "c", "d"'))  # an arm added meanwhile
    for key, raw, _ in stream[half:]:
        producer.produce(names["ev"], raw, key=key)
    assert producer.flush(30) == 0
    proc = start()
    try:

        def served():
            return {
                orjson.loads(v)["request_id"]
                for p in consume_all(kafka_bootstrap, names["sel"]).values()
                for _, v, _ in p
            }

        wanted = {orjson.loads(raw)["request_id"] for _, raw, e in stream if e == "selection"}
        wait_for(lambda: wanted <= served(), proc)
        applied = sum(1 for _, _, e in stream if e == "applied")
        n_updates = lambda: sum(s["bandit"]["n_updates"] for s in read_states(recovery).values())  # noqa: E731
        wait_for(lambda: n_updates() == applied, proc, 120, "every feedback in the snapshot")
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert served() == wanted
    letters = [orjson.loads(v) for _, v, _ in consume_all(kafka_bootstrap, names["dlq"])[0]]
    by_offset = {}
    for letter in letters:  # re-emitted after the kill: the same letter for the same offset
        assert by_offset.setdefault(letter["offset"], letter["reason"]) == letter["reason"]
    for offset, (_, _, expected) in enumerate(stream):
        if expected in ("selection", "applied", "early"):
            assert offset not in by_offset, (offset, by_offset.get(offset))
        else:
            assert by_offset.get(offset) == expected, (offset, stream[offset][1][:120])
    assert set(by_offset) <= {
        o for o, (_, _, e) in enumerate(stream) if e not in ("selection", "applied", "early")
    }
    states = read_states(recovery)
    assert sum(s["bandit"]["n_updates"] for s in states.values()) == applied
    assert all(s["arms"] in (["a", "b", "c", "d"], ["x", "y"]) for s in states.values())
    [waiting] = [s for s in states.values() if s["early"]]  # the feedback without a request
    assert [e[0] for e in waiting["early"]] == ["never-asked"]

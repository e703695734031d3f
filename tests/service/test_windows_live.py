"""Attribution windows and the serving settings on the real broker: kill -9 with windows
open and aggregates half collected loses and doubles nothing, and a live registry edit
(SIGHUP) of each serving setting takes effect at once."""

import base64
import random
import signal
import subprocess
import sys
import time
import urllib.request

import orjson
from confluent_kafka import Producer

from flows.service.instances.instance import Instance
from flows.service.instances.registry import Registry
from flows.service.runtime.recovery import read_states
from flows.service.wire.events import Origin, Request, parse_event
from flows.testing.kafka_broker import consume_all, create_topic, free_port, unique_topic
from tests.service.streams import service_env, start_service
from tests.service.test_operating import (
    messages,
    produce,
    run_args,
    service_topics,
    start,
)
from tests.waiting import wait_for

WINDOWED = """
[experiments.conv]
arms = ["a", "b", "c"]
per_unit = true
seed = 4
feedback_ttl = 25
aggregate = "sum"
default_loss = 2.0
"""
UNITS = [f"u{i}" for i in range(8)]


def send(bootstrap, topic, events):
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for event in events:
        producer.produce(topic, key=f"conv\x1f{event['unit']}", value=orjson.dumps(event))
    assert producer.flush(30) == 0


def event(kind, unit, rid, loss=None):
    out = {"type": kind, "experiment": "conv", "unit": unit, "request_id": rid}
    if loss is not None:
        out["loss"] = loss
    return out


def test_kill_9_with_windows_open_and_aggregates_half_collected_loses_and_doubles_nothing(
    kafka_bootstrap, tmp_path
):
    rng = random.Random(41)
    topics = {n: unique_topic(n) for n in ("ev", "sel", "dlq")}
    for name, parts in (("ev", 3), ("sel", 3), ("dlq", 1)):
        create_topic(kafka_bootstrap, topics[name], parts)
    registry_path = tmp_path / "registry.toml"
    registry_path.write_text(WINDOWED)
    recovery = tmp_path / "recovery"
    recovery.mkdir()
    subprocess.run([sys.executable, "-m", "bytewax.recovery", str(recovery), "1"], check=True)
    env = service_env(kafka_bootstrap, registry_path, topics["ev"], topics["sel"], topics["dlq"])
    requests = [event("request", u, f"{u}-r{i}") for u in UNITS for i in range(3)]
    first = [  # a first feedback for two requests in three: half of what their windows get
        event("feedback", r["unit"], r["request_id"], rng.choice([0.0, 1.0, 5.5]))
        for k, r in enumerate(requests)
        if k % 3
    ]
    second = [  # a second feedback for every other one of those, after the kill
        event("feedback", f["unit"], f["request_id"], rng.choice([0.5, 3.0])) for f in first[::2]
    ]

    def answered():
        return {
            orjson.loads(v)["request_id"]
            for part in consume_all(kafka_bootstrap, topics["sel"]).values()
            for _, v, _ in part
        }

    def snapshotted():
        windows = [o for s in read_states(recovery).values() for o in s["open"]]
        collected = sum(1 for o in windows if "collected" in o)
        return len(windows) == len(requests) and collected == len(first)

    send(kafka_bootstrap, topics["ev"], requests + first)
    proc = start_service(env, recovery)
    try:
        wait_for(lambda: len(answered()) == len(requests), None, what="the answers")
        # the half-collected windows are in the snapshot
        wait_for(snapshotted, proc, what="the open windows in the snapshot")
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    held = read_states(recovery)
    open_windows = [o for s in held.values() for o in s["open"]]
    assert len(open_windows) == len(requests)  # every window open at the kill
    assert sum(1 for o in open_windows if "collected" in o) == len(first)
    send(kafka_bootstrap, topics["ev"], second)
    proc = start_service(env, recovery)  # killed again while it applies the second half
    time.sleep(4.0)  # deliberate: a kill at some point of the run; nothing checked on timing
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    expected = reference(requests + first + second)
    proc = start_service(env, recovery)
    try:
        wait_for(  # the windows end (25 s of stream time) and their aggregates are stored
            lambda: settled(read_states(recovery), expected),
            proc,
            120,
            "every window closed with its full aggregate in the snapshot",
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    states = read_states(recovery)
    assert set(states) == set(expected)
    for key, bandit in expected.items():  # every window closed once, with its full aggregate
        assert states[key]["open"] == []
        assert states[key]["bandit"]["n_updates"] == 3, key
        assert states[key]["bandit"] == bandit, key
    dead = [orjson.loads(v)["reason"] for _, v, _ in consume_all(kafka_bootstrap, topics["dlq"])[0]]
    assert dead == []  # no ticket_expired (the default applies), nothing late or doubled
    answers = {}
    for part in consume_all(kafka_bootstrap, topics["sel"]).values():
        for _, value, _ in part:
            answers.setdefault(orjson.loads(value)["request_id"], set()).add(value)
    assert len(answers) == len(requests) and all(len(v) == 1 for v in answers.values())


def reference(events):
    """Each instance's bandit after its events and the end of every window, uninterrupted."""
    experiment = Registry.from_toml(WINDOWED)["conv"]
    instances = {}
    for e in events:
        parsed = parse_event(orjson.dumps(e), Origin("ref"))
        key = f"conv\x1f{e['unit']}"
        inst = instances.setdefault(key, Instance(experiment, key))
        (inst.on_request if isinstance(parsed, Request) else inst.on_feedback)(parsed, 0.0)
    for inst in instances.values():
        assert inst.expire(1e9) == []
    return {key: inst.bandit.to_dict() for key, inst in instances.items()}


# ---------------------------------------------------------------- live edits (SIGHUP)
SHOP = """
[experiments.shop]
arms = ["a", "b", "c"]
feedback_ttl = {ttl}
{extra}
"""


def settled(states, expected):
    """Whether every window of ``expected`` is closed in ``states`` with its aggregate."""
    return set(states) == set(expected) and all(
        states[key]["open"] == [] and states[key]["bandit"] == bandit
        for key, bandit in expected.items()
    )


def metric(port, name, **labels):
    """The value of a sample of ``name`` with ``labels`` on /metrics (0 if absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_live_edit_of_each_serving_setting_takes_effect(kafka_bootstrap, tmp_path):
    registry = tmp_path / "registry.toml"
    registry.write_text(SHOP.format(ttl=600, extra=""))
    names = service_topics(kafka_bootstrap, partitions=1)
    port = free_port()
    args = run_args(
        kafka_bootstrap, names, registry, "--recovery-dir", tmp_path / "rec", "--metrics-port", port
    )
    log = tmp_path / "run.log"
    proc = start(*args, log_file=log)

    def ask(prefix, n, feedback=()):
        rids = [f"{prefix}{i}" for i in range(n)]
        produce(
            kafka_bootstrap,
            names["ev"],
            [{"type": "request", "experiment": "shop", "request_id": r} for r in rids],
        )
        wait_for(lambda: len(answers(prefix)) == n, proc)
        got = answers(prefix)
        for loss in feedback:
            produce(
                kafka_bootstrap,
                names["ev"],
                [
                    {"type": "feedback", "experiment": "shop", "request_id": r, "loss": loss}
                    for r in rids
                ],
            )
        return got

    def answers(prefix):
        return {
            s["request_id"]: s
            for s in messages(kafka_bootstrap, names["sel"])
            if s["request_id"].startswith(prefix)
        }

    def edit(ttl, extra):
        seen = log.read_text().count("the reloaded registry is now in force")
        registry.write_text(SHOP.format(ttl=ttl, extra=extra))
        proc.send_signal(signal.SIGHUP)
        in_force = "the reloaded registry is now in force"
        wait_for(lambda: log.read_text().count(in_force) > seen, proc, what="the reload in force")

    try:
        plain = ask("p-", 20, feedback=[1.0])
        assert {s["why"] for s in plain.values()} == {"bandit"}
        # force_arm: everyone gets it, prob 1
        edit(600, 'force_arm = "c"')
        forced = ask("f-", 20)
        assert {(s["arm_name"], s["why"], s["prob"]) for s in forced.values()} == {
            ("c", "forced", 1.0)
        }
        # holdout and min_share: half the requests held out on "a", every prob floored
        edit(600, 'holdout = { arm = "a", share = 0.5 }\nmin_share = 0.1')
        held = ask("h-", 60)
        assert {s["why"] for s in held.values()} == {"holdout", "bandit"}
        assert all(s["arm_name"] == "a" for s in held.values() if s["why"] == "holdout")
        assert min(s["prob"] for s in held.values()) >= 0.5 * 0.1
        # burn_in: the shared instance has served 100, a burn-in of 1000 serves uniformly
        edit(600, "burn_in = 1000")
        burnt = ask("b-", 20)
        assert {s["why"] for s in burnt.values()} == {"burn_in"}
        assert {round(s["prob"], 12) for s in burnt.values()} == {round(1 / 3, 12)}
        # default_loss with a short window: no feedback, the windows end defaulted
        edit(2, "default_loss = 1.0")
        defaulted = metric(port, "tsi_feedback_total", experiment="shop", outcome="defaulted")
        ask("d-", 10)
        wait_for(
            lambda: (
                metric(port, "tsi_feedback_total", experiment="shop", outcome="defaulted")
                >= defaulted + 10
            ),
            proc,
            seconds=30,
        )
        # aggregate: two feedback events a window, collected, applied once at its end
        edit(2, 'default_loss = 1.0\naggregate = "max"')
        collected = metric(port, "tsi_feedback_total", experiment="shop", outcome="collected")
        applied = metric(port, "tsi_feedback_total", experiment="shop", outcome="applied")
        ask("g-", 10, feedback=[0.0, 2.0])
        wait_for(
            lambda: (
                metric(port, "tsi_feedback_total", experiment="shop", outcome="collected")
                >= collected + 20
                and metric(port, "tsi_feedback_total", experiment="shop", outcome="applied")
                >= applied + 10
            ),
            proc,
            seconds=30,
        )
        assert metric(port, "tsi_served_total", experiment="shop", why="forced") == 20
        reasons = [d["reason"] for d in messages(kafka_bootstrap, names["dlq"])]
        assert reasons == [], reasons  # the defaulted windows are no dead letters
        # contexts (a definition edit: migrated; the open tickets without a context retire)
        # and requests restricted to eligible arms
        edit(2, 'contexts = { device = ["ios", "android"] }')
        asked = [
            ("c-1", {"context": {"device": "tv"}}),
            ("c-2", {"context": {"device": "ios"}, "eligible": ["b"]}),
            ("c-3", {"context": {"device": "ios", "os": "x"}}),
            ("c-4", {"context": {"device": "ios"}, "eligible": ["b", "zz"]}),
            ("c-5", {"context": 2, "eligible": [0, 2]}),
        ]
        produce(
            kafka_bootstrap,
            names["ev"],
            [{"type": "request", "experiment": "shop", "request_id": r, **f} for r, f in asked],
        )
        wait_for(lambda: len(answers("c-")) == 3, proc)
        served = answers("c-")
        assert served["c-2"]["arm_name"] == "b" and served["c-5"]["arm_name"] in ("a", "c")
        wait_for(
            lambda: (
                metric(port, "tsi_context_other_total", experiment="shop", attribute="device") == 1
            ),
            proc,
            seconds=10,
        )
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    letters = messages(kafka_bootstrap, names["dlq"])
    by_request = {
        orjson.loads(base64.b64decode(d["raw_b64"]))["request_id"]: d["reason"] for d in letters
    }
    assert (by_request.pop("c-3"), by_request.pop("c-4")) == (
        "unknown_context_attribute",
        "unknown_arm",
    )
    assert set(by_request.values()) == {"context_retired"}  # the open f-, h- and b- tickets
    assert set(by_request) == set(forced) | set(held) | set(burnt)

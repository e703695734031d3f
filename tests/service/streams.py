"""A deterministic event stream for the service tests, and what an uninterrupted run makes of it."""

import os
import subprocess
import sys
from pathlib import Path

import orjson

from flows.service.instances.instance import Instance
from flows.service.wire.events import Origin, Request, parse_event
from flows.testing.kafka_broker import consume_all

REGISTRY_TOML = """
[experiments.shop]
arms = ["a", "b", "c", "d"]
per_unit = true
seed = 9
competition = { kind = "switching", rate = 0.01 }
"""
UNITS = 12
REQUESTS = 360


def event_stream(rng):
    """(key, bytes) events: each request's feedback a few events later, some feedback early."""
    events = []
    for i in range(REQUESTS):
        unit = f"u{i % UNITS}"
        key = f"shop\x1f{unit}"
        req = {"type": "request", "experiment": "shop", "unit": unit, "request_id": f"r{i}"}
        fb = {
            "type": "feedback",
            "experiment": "shop",
            "unit": unit,
            "request_id": f"r{i}",
            "loss": rng.choice([0.0, 1.0, 5.0]) + (i % 4 == 0),
        }
        pair = [fb, req] if i % 25 == 0 else [req, fb]  # a few feedback before the request
        events += [(key, orjson.dumps(e)) for e in pair]
    events.insert(100, ("shop\x1fu1", b"{broken"))
    return events


def reference_states(registry, events):
    """The uninterrupted run: each instance fed its events in stream order."""
    instances = {}
    for key, raw in events:
        event = parse_event(raw, Origin("ref"))
        if not hasattr(event, "request_id"):
            continue
        inst = instances.setdefault(key, Instance(registry["shop"], key))
        (inst.on_request if isinstance(event, Request) else inst.on_feedback)(event, 0.0)
    return {k: v.to_dict() for k, v in instances.items()}


def comparable(state):
    """What must match exactly (deadlines are wall-clock times and may differ)."""
    return (
        state["bandit"],
        sorted(o["request_id"] for o in state["open"]),
        sorted(s[0] for s in state["settled"]),
        sorted(e[0] for e in state["early"]),
    )


def service_env(bootstrap, registry_path, events, selections, dlq, **extra):
    """Environment for `python -m bytewax.run flows.service.main:flow` on the combined topic."""
    return {
        **os.environ,
        "TSI_REGISTRY": str(registry_path),
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "TSI_TOPIC_EVENTS": events,
        "TSI_TOPIC_SELECTIONS": selections,
        "TSI_TOPIC_DLQ": dlq,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        **extra,
    }


def start_service(env, recovery, *args):
    """The service as a real process, snapshotting every second into `recovery`."""
    cmd = [
        sys.executable,
        "-m",
        "bytewax.run",
        "flows.service.main:flow",
        "-r",
        str(recovery),
        "-s",
        "1",
        "-b",
        "0",
        *args,
    ]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def assert_served_once_each(bootstrap, selections, dead_letters):
    """Every request answered, every re-emitted answer identical, and no dead letter but
    the stream's one malformed message: no feedback was lost, refused or applied twice."""
    answers = {}
    for part in consume_all(bootstrap, selections).values():
        for _key, value, _ in part:
            answers.setdefault(orjson.loads(value)["request_id"], set()).add(value)
    assert len(answers) == REQUESTS
    assert all(len(v) == 1 for v in answers.values())  # re-emitted selections are identical
    dead = [orjson.loads(v)["reason"] for _, v, _ in consume_all(bootstrap, dead_letters)[0]]
    assert set(dead) == {"malformed_json"}

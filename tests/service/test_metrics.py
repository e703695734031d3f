"""Prometheus metrics: exact counts from in-memory dataflows and the operator, and a scrape.

The metrics are process-wide, so every test reads deltas of the samples around what it runs.
"""

import collections
import logging
import threading
import time
import urllib.request
from collections import Counter

import orjson
import pytest
from bytewax.testing import cluster_main, run_main
from prometheus_client import REGISTRY
from typer.testing import CliRunner

import flows.service.main
import flows.service.runtime.process
from flows.cli import app
from flows.service.connectors.memory import memory_wiring
from flows.service.dataflow import build_flow
from flows.service.instances.registry import Registry
from flows.service.observe import metrics
from flows.service.runtime.settings import ConfigError, Settings
from flows.service.shards.logic import logic_builder
from flows.service.wire.events import DeadLetter, Origin, Selection, parse_feedback, parse_request

REGISTRY_TOML = """
[experiments.m]
arms = ["a", "b"]
feedback_ttl = 5
early_feedback_limit = 2

[experiments.per]
arms = ["x", "y"]
per_unit = true
"""
EXPERIMENTS = Registry.from_toml(REGISTRY_TOML)


def item(logic, key, event):
    """What the dataflow routes to a shard's logic: a batch of one (instance key, the
    event's experiment, the event)."""
    return [(key, logic.store.context.registry.current[event.experiment], event)]


def snapshot() -> dict:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in REGISTRY.collect()
        if family.name.startswith("tsi_")
        for s in family.samples
    }


class Delta:
    """Changes of the tsi_* samples since it was made."""

    def __init__(self) -> None:
        self.before = snapshot()

    def __call__(self, name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        return snapshot().get(key, 0.0) - self.before.get(key, 0.0)

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """Non-zero changes of one metric, by the value of one label."""
        after, out = snapshot(), {}
        for key in set(after) | set(self.before):
            if key[0] == name:
                change = after.get(key, 0.0) - self.before.get(key, 0.0)
                if change:
                    out[dict(key[1])[label]] = change
        return out


def msg(topic, i, **fields):
    return (orjson.dumps(fields), Origin(topic, 0, i))


def run_events(events, clock=lambda: 1000.0, registry=EXPERIMENTS):
    selections, dead = [], []
    run_main(build_flow(registry, memory_wiring([], [], selections, dead, events=events), clock))
    return [orjson.loads(v) for _, v in selections], [orjson.loads(v) for _, v in dead]


def request(rid, experiment="m", **extra):
    raw = orjson.dumps({"experiment": experiment, "request_id": rid, **extra})
    return parse_request(raw, Origin("t", 0, 1))


def feedback(rid, experiment="m", **extra):
    raw = orjson.dumps({"experiment": experiment, "request_id": rid, "loss": 1.0, **extra})
    return parse_feedback(raw, Origin("t", 0, 2))


def test_decisions_retries_and_feedback_outcomes_are_counted_exactly():
    def rq(i, rid):
        return msg("ev", i, type="request", experiment="m", request_id=rid)

    def fb(i, rid, **extra):
        return msg("ev", i, type="feedback", experiment="m", request_id=rid, loss=1.0, **extra)

    events = [rq(i, f"r{i}") for i in range(10)]
    events += [rq(10, "r0"), rq(11, "r1")]  # retries of open tickets
    events += [fb(20 + i, f"r{i}") for i in range(5)]  # applied
    events += [rq(30, "r2")]  # retry of a settled request
    events += [fb(31, "r0")]  # duplicate
    events += [fb(32, "e1"), fb(33, "e1"), rq(34, "e1")]  # early, duplicate, then applied
    events += [fb(35, "r5", arm=7)]  # arm_mismatch
    events += [fb(36, "x1"), fb(37, "x2"), fb(38, "x3")]  # early, early, buffer full
    delta = Delta()
    selections, dead = run_events(events)
    assert len(selections) == 14
    assert delta("tsi_decisions_total", experiment="m") == 14
    assert delta("tsi_retries_total", experiment="m") == 3
    assert delta.by_label("tsi_feedback_total", "outcome") == {
        "applied": 6,
        "early": 3,
        "duplicate": 2,
        "arm_mismatch": 1,
        "early_buffer_full": 1,
    }
    assert delta("tsi_pending_tickets", experiment="m") == 5  # r5 .. r9
    assert delta("tsi_early_feedback", experiment="m") == 2  # x1, x2
    assert delta("tsi_instances", experiment="m") == 1
    reasons = Counter(d["reason"] for d in dead)
    assert reasons == {"duplicate_feedback": 2, "arm_mismatch": 1, "early_buffer_full": 1}
    assert delta.by_label("tsi_dead_letters_total", "reason") == reasons


def per_unit(i):
    return {"experiment": "per", "unit": f"u{i % 3}"}


def test_pending_tickets_count_open_tickets_and_return_to_zero_after_all_feedback():
    requests = [msg("ev", i, type="request", **per_unit(i), request_id=f"p{i}") for i in range(12)]
    answers = [
        msg("ev", 100 + i, type="feedback", **per_unit(i), request_id=f"p{i}", reward=1.0)
        for i in range(12)
    ]
    delta = Delta()
    run_events(requests)
    assert delta("tsi_pending_tickets", experiment="per") == 12
    assert delta("tsi_instances", experiment="per") == 3  # one per unit

    delta = Delta()
    selections, dead = run_events(requests + answers)
    assert len(selections) == 12 and dead == []
    assert delta("tsi_pending_tickets", experiment="per") == 0
    assert delta("tsi_feedback_total", experiment="per", outcome="applied") == 12
    assert delta("tsi_decisions_total", experiment="per") == 12


def test_workers_of_a_cluster_add_up_and_keep_one_tally_each():
    requests = [msg("rq", i, **per_unit(i % 50), request_id=f"w{i}") for i in range(1000)]
    answers = [msg("fb", i, **per_unit(i % 50), request_id=f"w{i}", loss=1.0) for i in range(600)]
    tallies, delta, selections, dead = len(metrics._tallies), Delta(), [], []
    wiring = memory_wiring(requests, answers, selections, dead)
    cluster_main(build_flow(EXPERIMENTS, wiring, lambda: 1000.0), [], 0, worker_count_per_proc=2)
    assert len(selections) == 1000 and dead == []
    assert delta("tsi_decisions_total", experiment="per") == 1000
    assert delta("tsi_feedback_total", experiment="per", outcome="applied") == 600
    assert delta("tsi_pending_tickets", experiment="per") == 400
    assert delta("tsi_instances", experiment="per") == 3
    assert len(metrics._tallies) - tallies <= 2  # one per worker thread, not per GIL entry


def test_every_dead_letter_is_counted_once_by_reason_upstream_refusals_included():
    requests = [
        (b"{broken", Origin("rq", 0, 0)),
        (b"[1, 2]", Origin("rq", 0, 1)),
        (b"x" * 70_000, Origin("rq", 0, 2)),
        msg("rq", 3, experiment="m"),  # no request_id
        msg("rq", 4, experiment="m", request_id=7),
        msg("rq", 5, experiment="m", request_id=""),
        msg("rq", 6, experiment="nope", request_id="z"),
        msg("rq", 7, experiment="per", request_id="no-unit"),
        msg("rq", 8, experiment="m", request_id="c", context=1),
        msg("rq", 9, experiment="m", request_id="ok"),
    ]
    feedback_in = [
        msg("fb", 0, experiment="m", request_id="ok", loss=1.0),
        msg("fb", 1, experiment="m", request_id="ok", loss=1.0),
        msg("fb", 2, experiment="m", request_id="ok", loss=1e301),
        msg("fb", 3, experiment="nope", request_id="ok", loss=1.0),
    ]
    delta = Delta()
    selections, dead = [], []
    run_main(build_flow(EXPERIMENTS, memory_wiring(requests, feedback_in, selections, dead)))
    reasons = Counter(orjson.loads(v)["reason"] for _, v in dead)
    assert len(reasons) >= 9 and reasons["unknown_experiment"] == 2
    assert delta.by_label("tsi_dead_letters_total", "reason") == reasons
    assert sum(delta.by_label("tsi_dead_letters_total", "reason").values()) == len(dead)


def test_expired_tickets_and_unknown_feedback_are_counted_and_lower_the_gauges():
    now = [100.0]
    logic = logic_builder(EXPERIMENTS, clock=lambda: now[0])(None)
    delta = Delta()
    for rid in ("a", "b", "c"):
        logic.handle(item(logic, "m", request(rid)))
    logic.handle(item(logic, "m", feedback("c")))
    logic.handle(item(logic, "m", feedback("lost")))  # never requested
    assert delta("tsi_pending_tickets", experiment="m") == 2
    assert delta("tsi_early_feedback", experiment="m") == 1
    now[0] = 200.0
    out = logic.wake()
    assert sorted(d.reason for d in out) == ["ticket_expired", "ticket_expired", "unknown_ticket"]
    assert delta("tsi_pending_tickets", experiment="m") == 0
    assert delta("tsi_early_feedback", experiment="m") == 0
    assert delta.by_label("tsi_feedback_total", "outcome") == {
        "applied": 1,
        "early": 1,
        "expired_ticket": 2,
        "unknown": 1,
    }


def test_a_restored_instance_brings_its_open_tickets_and_waiting_feedback():
    logic = logic_builder(EXPERIMENTS, clock=lambda: 0.0)(None)
    logic.handle(item(logic, "m", request("r1")))
    logic.handle(item(logic, "m", request("r2")))
    logic.handle(item(logic, "m", feedback("r2")))
    logic.handle(item(logic, "m", feedback("early")))
    delta = Delta()
    resumed = logic_builder(EXPERIMENTS, clock=lambda: 0.0)(logic.snapshot())
    assert "m" in resumed.store.instances
    assert delta("tsi_instances", experiment="m") == 1
    assert delta("tsi_pending_tickets", experiment="m") == 1
    assert delta("tsi_early_feedback", experiment="m") == 1


def test_an_instance_restored_to_rest_on_its_ticket_counts_the_ticket():
    logic = logic_builder(EXPERIMENTS, clock=lambda: 0.0)(None)
    logic.handle(item(logic, "m", request("r1")))
    delta = Delta()
    resumed = logic_builder(EXPERIMENTS, clock=lambda: 0.0)(logic.snapshot())
    assert "m" in resumed.store.resting and "m" not in resumed.store.instances  # not built
    assert delta("tsi_instances", experiment="m") == 1
    assert delta("tsi_pending_tickets", experiment="m") == 1
    resumed.handle(item(resumed, "m", feedback("r1")))  # built, applied: counted once
    assert delta("tsi_pending_tickets", experiment="m") == 0


def test_processing_time_and_event_age_histograms():
    now = float(int(time.time()))  # a ts must lie near the wall clock (events.ts_window)
    logic = logic_builder(EXPERIMENTS, clock=lambda: now)(None)
    delta = Delta()
    for rid in ("h1", "h2", "h3"):
        logic.handle(item(logic, "m", request(rid, ts=now - 2.0)))
    logic.handle(item(logic, "m", feedback("h1")))  # no ts: no age
    assert delta("tsi_processing_seconds_count", kind="request") == 3
    assert delta("tsi_processing_seconds_count", kind="feedback") == 1
    assert 0 < delta("tsi_processing_seconds_sum", kind="request") < 1.0
    assert delta("tsi_processing_seconds_bucket", kind="request", le="+Inf") == 3
    assert delta("tsi_event_age_seconds_count", kind="request") == 3
    assert delta("tsi_event_age_seconds_sum", kind="request") == 6.0
    assert delta("tsi_event_age_seconds_bucket", kind="request", le="1.0") == 0
    assert delta("tsi_event_age_seconds_bucket", kind="request", le="5.0") == 3
    assert delta("tsi_event_age_seconds_count", kind="feedback") == 0


def test_the_last_event_gauges_take_the_wall_clock_and_the_ts_of_the_event(monkeypatch):
    now = float(int(time.time()))
    logic = logic_builder(EXPERIMENTS, clock=lambda: now - 3600.0)(None)  # a clock far off
    before = time.time()
    logic.handle(item(logic, "m", request("g1", ts=now - 5.0)))
    logic.handle(item(logic, "m", feedback("g1")))  # no ts: the last ts stays
    after = time.time()
    mine = metrics._tallies[threading.get_ident()]
    assert before <= mine.last_event <= after  # the wall clock, not the flow's
    assert mine.last_ts == now - 5.0
    assert REGISTRY.get_sample_value("tsi_last_event_timestamp_seconds") >= mine.last_event
    # over the worker threads: the latest of each
    other = metrics._Tally()
    other.last_event, other.last_ts = after + 100.0, now - 50.0
    monkeypatch.setattr(metrics, "_tallies", {1: mine, 2: other})
    assert REGISTRY.get_sample_value("tsi_last_event_timestamp_seconds") == after + 100.0
    assert REGISTRY.get_sample_value("tsi_last_event_ts_seconds") == now - 5.0


def test_a_failing_metric_update_never_breaks_the_flow(monkeypatch, caplog):
    def broken(*_args):
        raise RuntimeError("metrics down")

    class BrokenDict(dict):
        get = broken

    monkeypatch.setattr(metrics, "_by_reason", BrokenDict())
    logic = logic_builder(EXPERIMENTS, clock=lambda: 0.0)(None)
    with caplog.at_level(logging.WARNING, logger="flows.service.observe.metrics"):
        out = logic.handle(item(logic, "m", request("r1")))
        [selection] = out
        assert isinstance(selection, Selection)
        bad = msg("ev", 0, type="request", experiment="nope", request_id="z")
        _, dead = run_events([bad])
    assert [d["reason"] for d in dead] == ["unknown_experiment"]
    assert "count_dead_letter failed" in caplog.text
    letter = DeadLetter("x", "y", b"", Origin("t"))
    assert metrics.count_dead_letter(letter) is letter


def test_metrics_are_served_over_http():
    logic = logic_builder(EXPERIMENTS, clock=lambda: 0.0)(None)
    logic.handle(item(logic, "m", request("served")))
    server, _ = metrics.serve_metrics(0, "127.0.0.1")
    try:
        port = server.server_port
        assert metrics.serve_metrics(port, "127.0.0.1")[0] is server  # already served
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            body = reply.read().decode()
        decisions = REGISTRY.get_sample_value("tsi_decisions_total", {"experiment": "m"})
        assert f'tsi_decisions_total{{experiment="m"}} {decisions}' in body
        assert "# TYPE tsi_processing_seconds histogram" in body
        assert "# TYPE tsi_dead_letters_total counter" in body
    finally:
        server.shutdown()
        server.server_close()


def test_run_starts_the_metrics_server_before_the_flow(monkeypatch):
    calls = []
    monkeypatch.setattr(
        flows.service.runtime.process,
        "serve_metrics",
        lambda port, **kw: calls.append(("serve", port)),
    )
    monkeypatch.setattr(
        flows.service.runtime.process, "cli_main", lambda flow, **kw: calls.append(("run", flow))
    )
    monkeypatch.setattr(flows.service.runtime.process, "freeze_long_lived", lambda: None)
    flows.service.runtime.process.run("FLOW", metrics_port=9464)
    assert calls == [("serve", 9464), ("run", "FLOW")]
    calls.clear()
    flows.service.runtime.process.run("FLOW")
    assert calls == [("run", "FLOW")]


@pytest.mark.parametrize(
    ("args", "env", "port"),
    [
        ([], {}, None),
        (["--metrics-port", "9464"], {}, 9464),
        ([], {"TSI_METRICS_PORT": "9465"}, 9465),
    ],
)
def test_tsi_run_passes_the_metrics_port(monkeypatch, tmp_path, args, env, port):
    (tmp_path / "r.toml").write_text(REGISTRY_TOML)
    seen = {}
    monkeypatch.setattr("flows.cli.run.run_flow", lambda *a, **kw: seen.update(kw))
    limits = collections.defaultdict(lambda: 1_048_588)  # every topic there, no broker needed
    monkeypatch.setattr("flows.service.runtime.startup.check_kafka_topics", lambda *a: limits)
    monkeypatch.setattr("flows.service.runtime.startup.check_members", lambda *a: 0)
    monkeypatch.delenv("TSI_METRICS_PORT", raising=False)
    result = CliRunner().invoke(
        app, ["run", "--registry", str(tmp_path / "r.toml"), "--no-recovery", *args], env=env
    )
    assert result.exit_code == 0, result.output
    assert seen["metrics_port"] == port


def test_bytewax_run_entry_point_serves_metrics_when_the_port_is_set(monkeypatch, tmp_path):
    (tmp_path / "r.toml").write_text(REGISTRY_TOML)
    served = []
    monkeypatch.setattr(
        flows.service.runtime.process, "serve_metrics", lambda port, **kw: served.append(port)
    )
    monkeypatch.setattr(flows.service.runtime.process, "freeze_long_lived", lambda: None)
    monkeypatch.setenv("TSI_REGISTRY", str(tmp_path / "r.toml"))
    monkeypatch.delenv("TSI_METRICS_PORT", raising=False)
    assert flows.service.main.flow is not None and served == []
    monkeypatch.setenv("TSI_METRICS_PORT", "9466")
    assert flows.service.main.flow is not None and served == [9466]


@pytest.mark.parametrize("value", ["http", "0", "70000", "-1"])
def test_a_bad_metrics_port_is_a_config_error(value):
    with pytest.raises(ConfigError, match="TSI_METRICS_PORT"):
        Settings.from_env({"TSI_REGISTRY": "r.toml", "TSI_METRICS_PORT": value})
    assert (
        Settings.from_env({"TSI_REGISTRY": "r.toml", "TSI_METRICS_PORT": " "}).metrics_port is None
    )


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], {}, 0),
        (["-i", "2"], {}, 2),
        (["--process-id=3"], {"BYTEWAX_PROCESS_ID": "1"}, 3),
        ([], {"BYTEWAX_PROCESS_ID": "1"}, 1),
        ([], {"BYTEWAX_POD_NAME": "tsi-4", "BYTEWAX_STATEFULSET_NAME": "tsi"}, 4),
    ],
)
def test_the_bytewax_run_entry_point_reads_its_process_id_as_bytewax_run_does(
    monkeypatch, argv, env, expected
):
    """Its sinks write through the partition of that process (none crosses processes)."""
    for name in ("BYTEWAX_PROCESS_ID", "BYTEWAX_POD_NAME", "BYTEWAX_STATEFULSET_NAME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("sys.argv", ["bytewax.run", "flows.service.main:flow", *argv])
    assert flows.service.main._process_id() == expected

"""Guardrails end to end on the real broker: ``tsi run`` and ``tsi serve`` on one registry
file; feedback sends a much worse latency for the bandit's selections than for the
holdout's, the gateway finds the breach, writes ``force_arm`` into the file, and once the
service reloads it (SIGHUP) every new decision gets the holdout's arm."""

from __future__ import annotations

import signal
import urllib.request

from flows.testing.kafka_broker import free_port
from tests.client.service import get, post
from tests.client.test_gateway import serve
from tests.service.test_first_hour import scrape
from tests.service.test_operating import service_topics, start
from tests.waiting import wait_for

REGISTRY = """
[experiments.guarded]
arms = ["control", "fast", "slow"]
feedback_ttl = 600
holdout = { arm = "control", share = 0.3 }
guardrails = [{ metric = "latency_ms", min_samples = 20 }]
"""


def _decide(port: int, unit: str) -> dict:
    status, decision = post(port, "/v1/decide", {"experiment": "guarded", "unit": unit})
    assert status == 200, decision
    return decision


def _gateway_metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return answer.read().decode()


def test_a_breached_guardrail_pauses_the_experiment_to_the_control_arm(kafka_bootstrap, tmp_path):
    names = service_topics(kafka_bootstrap, partitions=2)
    registry = tmp_path / "registry.toml"
    registry.write_text(REGISTRY)
    metrics_port = free_port()
    options = [
        *("--brokers", kafka_bootstrap, "--events-topic", names["ev"]),
        *("--selections-topic", names["sel"], "--dlq-topic", names["dlq"]),
    ]
    run = start(
        "--registry", registry, *options, "--snapshot-every", "0.5",
        "--recovery-dir", tmp_path / "rec", "--metrics-port", metrics_port,
        log_file=tmp_path / "run.log",
    )  # fmt: skip
    gateway = None
    try:
        wait_for(lambda: scrape(metrics_port, "/ready")[0] == 200, run, what="ready")
        gateway, port = serve(
            *options, "--decide-timeout", "20", "--live-every", "0.5", "--registry", registry,
            "--metrics-url", f"http://127.0.0.1:{metrics_port}/metrics",
        )  # fmt: skip
        for i in range(160):
            decision = _decide(port, f"u{i}")
            latency = (100.0 if decision["why"] == "holdout" else 400.0) + i % 7
            fed = {
                "experiment": "guarded",
                "request_id": decision["request_id"],
                "loss": 0.5,
                "guardrails": {"latency_ms": latency, "not_guarded": 1},
            }
            assert post(port, "/v1/feedback", fed)[0] == 202
        wait_for(lambda: 'force_arm = "control"' in registry.read_text(), gateway, 60, "pause")
        _, data = get(port, "/experiments.json")
        [experiment] = data["experiments"]
        [latency] = experiment["guardrails"]
        assert latency["metric"] == "latency_ms" and latency["state"] == "breached"
        assert latency["low"] > 0 and latency["n_holdout"] >= 20
        breaches = 'tsi_guardrail_breaches_total{experiment="guarded",metric="latency_ms"} 1.0'
        assert breaches in _gateway_metrics(port)
        service_text = scrape(metrics_port)[1]
        assert 'tsi_guardrail_samples_total{experiment="guarded",group="holdout"' in service_text
        assert "not_guarded" not in service_text  # only what the registry guards is counted
        run.send_signal(signal.SIGHUP)  # the service applies the paused registry
        wait_for(lambda: _decide(port, "after")["why"] == "forced", run, 60, "the reload")
        for i in range(10):
            decision = _decide(port, f"paused-{i}")
            assert (decision["arm_name"], decision["why"]) == ("control", "forced")
    finally:
        for proc in (gateway, run):
            if proc is not None:
                proc.kill()
                proc.wait()

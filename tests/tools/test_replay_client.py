"""``tsi replay`` of what the Python client sent a real ``tsi run``: no ``ts`` in the
messages, windows closed by ``default_loss`` on the service's stream time (the Kafka
timestamps), and the replay gives every selection the service served, byte for byte."""

from __future__ import annotations

import time

import orjson
from typer.testing import CliRunner

from flows.cli import app
from flows.client import ClientSettings, Decider
from flows.service.connectors.topics import Topics
from flows.testing.kafka_broker import consume_all, free_port
from tests.service.test_first_hour import metric, scrape
from tests.service.test_operating import service_topics, start, wait_for

TTL = 4
REGISTRY = f"""
[experiments.shop]
arms = ["a", "b", "c"]
seed = 11
feedback_ttl = {TTL}
retry_window = 1
default_loss = 1.0
"""
# a wave's windows close once it is over, none while it is asked: the service's stream time
# runs on the wall clock, and a window closing while a message is on its way would close
# before it there and after it in a replay (which sees only the Kafka timestamps)
WAVES, PER_WAVE = 5, 8


def test_a_client_run_with_default_losses_replays_to_every_selection_served(
    kafka_bootstrap, tmp_path
):
    names = service_topics(kafka_bootstrap, partitions=3)
    registry, port = tmp_path / "registry.toml", free_port()
    registry.write_text(REGISTRY)
    options = [
        *("--brokers", kafka_bootstrap, "--events-topic", names["ev"]),
        *("--selections-topic", names["sel"], "--dlq-topic", names["dlq"]),
    ]
    proc = start(
        "--registry",
        registry,
        *options,
        "--recovery-dir",
        tmp_path / "rec",
        "--snapshot-every",
        "0.5",
        "--metrics-port",
        port,
        log_file=tmp_path / "run.log",
    )
    defaulted = 'tsi_feedback_total{experiment="shop",outcome="defaulted"}'
    topics = Topics(events=names["ev"], selections=names["sel"], dead_letters=names["dlq"])
    settings = ClientSettings(brokers=kafka_bootstrap, topics=topics, timeout=30)
    unanswered = 0
    try:
        wait_for(lambda: scrape(port, "/ready")[0] == 200, proc, what="ready")
        with Decider(settings) as decider:
            for wave in range(WAVES):  # each wave's windows close before the next is asked
                began = time.monotonic()
                for i in range(PER_WAVE):
                    decision = decider.decide("shop", request_id=f"w{wave}-{i}")
                    if decision.arm_name == "a":  # "a" is good, the others never answer
                        decider.feedback("shop", decision.request_id, loss=0.0)
                    else:
                        unanswered += 1
                assert time.monotonic() - began < TTL, "windows closed while a wave was asked"

                def closed(count: int = unanswered) -> bool:
                    return metric(scrape(port)[1], defaulted) == count

                wait_for(closed, proc, 60, "the windows without feedback")
    finally:
        proc.kill()
        proc.wait()
    served = [v for part in consume_all(kafka_bootstrap, names["sel"]).values() for _, v, _ in part]
    assert len(served) == WAVES * PER_WAVE
    assert unanswered < WAVES * PER_WAVE * 2 / 3  # it learned: "a" came more than its third

    out = tmp_path / "replay"
    done = CliRunner().invoke(
        app,
        ["replay", "--registry", str(registry), "--topic", names["ev"],
         "--brokers", kafka_bootstrap, "--out", str(out), "--no-report"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    replayed = (out / "selections.jsonl").read_bytes().splitlines()

    def by_id(lines: list[bytes]) -> dict[str, bytes]:
        return {orjson.loads(line)["request_id"]: line for line in lines}

    assert by_id(replayed) == by_id(served)

"""The `tsi` tools a team uses around the service: demo, replay, inspect, evaluate, errors."""

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import orjson
import pytest
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import run_main
from typer.testing import CliRunner

from arena.lab.environments import bernoulli
from flows.cli import app
from flows.service.connectors.memory import memory_wiring
from flows.service.dataflow import build_flow
from flows.service.instances.registry import Registry
from flows.service.wire.events import Origin
from flows.tools.demo import run_demo
from flows.tools.replay import replay
from flows.tools.replay_input import merge_by_time, read_lines
from flows.tools.traffic import generate, registry_toml

RUNNER = CliRunner()


def cli(*args: str):
    return RUNNER.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    result = cli("demo", "--requests", 3000, "--out", out, "--seed", 4)
    assert result.exit_code == 0, result.output
    return out


def test_demo_writes_a_report_with_its_plots_and_learns(demo_dir):
    report = (demo_dir / "REPORT.md").read_text()
    for name in ("regret", "allocation", "feedback_delays", "dead_letters"):
        png = demo_dir / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert f"({name}.png)" in report
    for reason in ("malformed_json", "unknown_experiment", "duplicate_feedback", "ticket_expired"):
        assert f"| {reason} |" in report
    rows = {
        line.split("|")[1].strip(): line.split("|")
        for line in report.splitlines()
        if line.startswith("| ")
    }
    # every experiment does better than uniform play; push (contextual) by far already
    # (3,000 requests are ~25 per homepage user: the per-user bandits are still learning)
    for name, factor in (("push", 0.8), ("homepage", 1.0), ("checkout", 1.0)):
        regret, uniform = (float(rows[name][i].replace(",", "")) for i in (5, 6))
        assert regret < factor * uniform, (name, regret, uniform)


def test_replaying_the_demo_stream_reproduces_every_selection(demo_dir, tmp_path):
    served = [orjson.loads(line) for line in (demo_dir / "selections.jsonl").open("rb")]
    result = cli(
        "replay",
        "--registry",
        demo_dir / "registry.toml",
        "--events",
        demo_dir / "events.jsonl",
        "--out",
        tmp_path,
    )
    assert result.exit_code == 0, result.output
    again = [orjson.loads(line) for line in (tmp_path / "selections.jsonl").open("rb")]
    key = lambda s: (s["experiment"], s["request_id"])  # noqa: E731
    assert sorted(again, key=key) == sorted(served, key=key)
    assert (tmp_path / "REPORT.md").exists()


def test_replay_is_byte_for_byte_deterministic_and_the_seed_matters(demo_dir, tmp_path):
    outputs = []
    for run, seed in (("a", "7"), ("b", "7"), ("c", "8")):
        result = cli(
            "replay",
            "--registry",
            demo_dir / "registry.toml",
            "--events",
            demo_dir / "events.jsonl",
            "--seed",
            seed,
            "--out",
            tmp_path / run,
        )
        assert result.exit_code == 0, result.output
        outputs.append((tmp_path / run / "selections.jsonl").read_bytes())
    assert outputs[0] == outputs[1]
    assert outputs[0] != outputs[2]


def test_separate_request_and_feedback_logs_merge_by_time_to_the_same_result(demo_dir, tmp_path):
    requests, feedback = tmp_path / "requests.jsonl", tmp_path / "feedback.jsonl"
    with requests.open("wb") as r, feedback.open("wb") as f:
        for line in (demo_dir / "events.jsonl").open("rb"):
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                event = {}  # a broken line: it stays with the requests
            target = f if event.get("type") == "feedback" else r
            target.write(line)
    registry = Registry.load(demo_dir / "registry.toml")
    merged = merge_by_time(read_lines(requests), read_lines(feedback))
    kinds = {str(requests): "request", str(feedback): "feedback"}
    split = replay(merged, registry, kinds)
    whole = replay(list(read_lines(demo_dir / "events.jsonl")), registry)
    key = lambda s: (s["experiment"], s["request_id"])  # noqa: E731
    assert sorted(split.selections, key=key) == sorted(whole.selections, key=key)


def test_on_event_time_a_ticket_expires_when_the_stream_passes_its_deadline():
    registry = Registry.from_toml('[experiments.e]\narms = ["a", "b"]\nfeedback_ttl = 10')
    t0 = 1_767_225_600  # event times are Unix seconds within the ts window of the clock

    def event(kind, rid, ts, **extra):
        return orjson.dumps(
            {"type": kind, "experiment": "e", "request_id": rid, "ts": t0 + ts, **extra}
        )

    log = [
        (event("request", "r1", 0), Origin("l", None, 1)),
        (event("request", "r2", 5), Origin("l", None, 2)),
        (event("feedback", "r1", 11, loss=1), Origin("l", None, 3)),
        (event("request", "r3", 30), Origin("l", None, 4)),
    ]
    out = replay(log, registry)
    reasons = [(d["reason"], orjson.loads(d.get("raw") or b"{}")) for d in out.dead_letters]
    expired = [d for d in out.dead_letters if d["reason"] == "ticket_expired"]
    late = [d for d in out.dead_letters if d["reason"] == "late_feedback"]
    # r1 expired at 10 (its feedback at 11 came too late, and says so), r2 at 15; r3 is
    # open at the end
    assert len(expired) == 2 and len(late) == 1, reasons
    assert len(out.selections) == 3


def _recovery_dir(tmp_path: Path) -> Path:
    registry = Registry.from_toml(
        '[experiments.home]\narms = ["a", "b", "c"]\nper_unit = true\n'
        '[experiments.ctx]\narms = ["x", "y"]\n'
        'competition = { kind = "contextual", n_contexts = 2 }'
    )
    requests, feedback = [], []
    for i in range(30):
        unit = f"u{i % 3}"
        raw = orjson.dumps({"experiment": "home", "unit": unit, "request_id": f"r{i}"})
        requests.append((raw, Origin("req", 0, i)))
        if i < 20:
            fb = {"experiment": "home", "unit": unit, "request_id": f"r{i}", "loss": i % 4}
            feedback.append((orjson.dumps(fb), Origin("fb", 0, i)))
    requests.append((b'{"experiment":"ctx","request_id":"c1","context":1}', Origin("req", 0, 99)))
    directory = tmp_path / "recovery"
    directory.mkdir()
    init_db_dir(directory, 1)
    flow = build_flow(registry, memory_wiring(requests, feedback, [], []))
    run_main(
        flow, epoch_interval=timedelta(seconds=0), recovery_config=RecoveryConfig(str(directory))
    )
    return directory


def test_inspect_reads_allocations_and_counters_from_a_recovery_directory(tmp_path):
    directory = _recovery_dir(tmp_path)
    result = cli("inspect", "--recovery-dir", directory, "--json", "home/*")
    assert result.exit_code == 0, result.output
    views = [orjson.loads(line) for line in result.output.splitlines()]
    assert [v["unit"] for v in views] == ["u0", "u1", "u2"]
    assert sum(v["rounds"] for v in views) == 30
    assert sum(v["updates"] for v in views) + sum(v["open_tickets"] for v in views) == 30
    for v in views:
        assert len(v["q"]) == 1 and abs(sum(v["q"][0]) - 1.0) < 1e-12
    table = cli("inspect", "--recovery-dir", directory, "ctx")
    assert table.exit_code == 0 and "q[context 1]" in table.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["inspect", "--recovery-dir", "{dir}", "nothing*"], "no instance matches"),
        (["inspect", "--recovery-dir", "/nonexistent/dir"], "does not exist"),
        (["replay", "--registry", "/nonexistent.toml", "--events", "x"], "cannot read registry"),
        (["replay", "--registry", "{reg}", "--events", "/nonexistent.jsonl"], "cannot read"),
        (["replay", "--registry", "{reg}"], "give --events"),
        (["evaluate", "/nonexistent.jsonl", "--registry", "{reg}"], "cannot read log"),
        (
            [
                *("run", "--registry", "{reg}", "--brokers", "127.0.0.1:1"),
                *("--connect-timeout", "1", "--no-recovery"),
            ],
            "no Kafka broker answers",
        ),
    ],
)
def test_a_user_mistake_is_one_line_and_a_non_zero_exit(tmp_path, args, message):
    registry = tmp_path / "r.toml"
    registry.write_text('[experiments.a]\narms = ["x", "y"]')
    directory = _recovery_dir(tmp_path) if "{dir}" in args else tmp_path
    argv = [a.replace("{dir}", str(directory)).replace("{reg}", str(registry)) for a in args]
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("tsi "), done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_evaluate_gives_the_regret_of_a_configuration_on_a_full_information_log(tmp_path):
    env = bernoulli(400, 3, seed=2)
    log = tmp_path / "log.jsonl"
    log.write_bytes(
        b"".join(
            orjson.dumps({"experiment": "a", "losses": row.tolist()}) + b"\n" for row in env.losses
        )
    )
    registry = tmp_path / "r.toml"
    registry.write_text('[experiments.a]\narms = ["x", "y", "z"]')
    result = cli("evaluate", log, "--registry", registry, "--out", tmp_path / "ev")
    assert result.exit_code == 0, result.output
    data = orjson.loads((tmp_path / "ev" / "evaluation.json").read_bytes())
    figures = data["configurations"][str(registry)]["experiments"]["a"]
    assert figures["best_fixed_loss"] == pytest.approx(env.best_fixed_loss())
    assert 0 < figures["regret_fixed"] < (env.losses.mean(axis=1).sum() - env.best_fixed_loss())
    assert (tmp_path / "ev" / "evaluation.png").stat().st_size > 10_000


def test_the_demo_loop_answers_every_request_before_time_moves_past_it():
    demo = generate(n_requests=400, seed=9)
    loop = run_demo(demo, Registry.from_toml(registry_toml(seed=9)))
    assert not loop.unanswered and not loop.waiting
    times = [
        orjson.loads(raw)["ts"]
        for raw in loop.sent
        if raw.startswith(b"{") and b"NaN" not in raw and raw.endswith(b"}")
    ]
    assert times == sorted(times)
    assert len({s["request_id"] for s in loop.selections}) == len(demo.truth)
    assert np.isfinite([s["prob"] for s in loop.selections]).all()


def test_replay_reads_a_kafka_topic_range_from_the_real_broker(kafka_bootstrap, tmp_path):
    from confluent_kafka import Producer

    from flows.testing.kafka_broker import create_topic, unique_topic

    topic = unique_topic("replay")
    create_topic(kafka_bootstrap, topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(40):
        event = {"type": "request", "experiment": "a", "request_id": f"r{i}", "ts": 1.8e9 + i}
        producer.produce(topic, orjson.dumps(event), key=b"a")
    producer.produce(topic, b"{broken", key=b"a")
    assert producer.flush(30) == 0
    registry = tmp_path / "r.toml"
    registry.write_text('[experiments.a]\narms = ["x", "y"]')
    runs = []
    for name, extra in (("all", []), ("again", []), ("tail", ["--from-offset", "30"])):
        result = cli(
            "replay",
            "--registry",
            registry,
            "--topic",
            topic,
            "--brokers",
            kafka_bootstrap,
            *extra,
            "--out",
            tmp_path / name,
        )
        assert result.exit_code == 0, result.output
        runs.append((tmp_path / name / "selections.jsonl").read_bytes())
    assert runs[0] == runs[1] and len(runs[0].splitlines()) == 40
    assert len(runs[2].splitlines()) == 10
    letters = (tmp_path / "all" / "dead_letters.jsonl").read_bytes().splitlines()
    assert [orjson.loads(x)["reason"] for x in letters] == ["malformed_json"]
    missing = cli(
        "replay",
        "--registry",
        registry,
        "--topic",
        "no-such-topic-here",
        "--brokers",
        kafka_bootstrap,
        "--out",
        tmp_path / "none",
    )
    assert missing.exit_code == 2


def test_the_leaderboard_sums_the_instances_of_each_experiment(tmp_path):
    directory = _recovery_dir(tmp_path)
    result = cli("inspect", "--recovery-dir", directory, "--json", "--leaderboard")
    assert result.exit_code == 0, result.output
    boards = {b["experiment"]: b for b in map(orjson.loads, result.output.splitlines())}
    views = [
        orjson.loads(line)
        for line in cli("inspect", "--recovery-dir", directory, "--json").output.splitlines()
    ]
    home = boards["home"]
    assert home["instances"] == 3 and home["decisions"] == 30
    assert home["feedback"] + home["open_tickets"] == 30
    assert home["basis"].startswith("mean q over 3 instances")
    mean = np.mean([v["q"][0] for v in views if v["experiment"] == "home"], axis=0)
    assert home["share"] == pytest.approx(mean.tolist(), abs=1e-12)
    ctx = boards["ctx"]
    assert ctx["basis"] == "current q of the shared instance, averaged over contexts"
    assert ctx["decisions"] == 1 and abs(sum(ctx["share"]) - 1.0) < 1e-12
    table = cli("inspect", "--recovery-dir", directory, "--leaderboard", "home/*")
    assert table.exit_code == 0, table.output
    assert table.output.startswith("home  decisions 30  feedback")
    assert "no per-arm loss sums" in table.output and "ctx" not in table.output

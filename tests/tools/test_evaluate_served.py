"""``tsi evaluate`` on what the product writes: a demo directory, the service's output
files, its Kafka topics; several configurations side by side; clear errors otherwise."""

import math
from pathlib import Path

import numpy as np
import orjson
import pytest
from confluent_kafka import Producer
from typer.testing import CliRunner

from flows.cli import app
from flows.service.instances.registry import Registry
from flows.testing.kafka_broker import create_topic, unique_topic
from flows.tools.evaluation import EvaluationError, evaluate, load_log
from flows.tools.evaluation.compare import compare, configurations
from flows.tools.evaluation.inputs import Inputs
from flows.tools.evaluation.served import join_served, served_directory


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "tsi-demo"
    result = CliRunner().invoke(app, ["demo", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def rows(path: Path) -> list[dict]:
    """The JSON objects of a file's lines (the demo's broken lines as empty objects)."""
    out = []
    for line in path.read_bytes().splitlines():
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            value = {}
        out.append(value if isinstance(value, dict) else {})
    return out


def expected_join(directory: Path) -> list[tuple]:
    """The join computed independently: each request's first selection (in file order) with
    its first numeric feedback stamped less than its experiment's feedback_ttl after its
    request (the demo's experiments apply the first feedback), and its request's context,
    as (line, arm, prob, loss, ctx). In an experiment with a ``default_loss`` a request
    whose window had ended by the newest time of the stream gets its feedback's loss or
    the default, and one whose window was still open is left out."""
    registry = Registry.load(directory / "registry.toml")
    ttl = {n: e.feedback_ttl for n, e in registry.experiments.items()}
    default = {n: e.default_loss for n, e in registry.experiments.items()}
    first_loss, requests, end = {}, {}, -math.inf
    for event in rows(directory / "events.jsonl"):
        key = (event.get("experiment"), event.get("unit"), event.get("request_id"))
        loss = event.get("loss")
        if event.get("reward") is not None and loss is None:
            loss = -event["reward"]
        if event.get("type") == "request":
            requests.setdefault(key, (event.get("context"), event["ts"]))
            end = max(end, event["ts"])
        elif (
            event.get("type") == "feedback"
            and type(loss) in (int, float)
            and event["ts"] - requests[key][1] < ttl[key[0]]
        ):
            first_loss.setdefault(key, float(loss))
        if event.get("type") == "feedback" and type(loss) in (int, float):
            end = max(end, event["ts"])
    out, seen = [], set()
    for line, s in enumerate(rows(directory / "selections.jsonl"), start=1):
        key = (s["experiment"], s["unit"], s["request_id"])
        if key in seen:
            continue
        seen.add(key)
        context, at = requests[key]
        if default[key[0]] is not None:
            if at + ttl[key[0]] <= end:
                loss = first_loss.get(key, default[key[0]])
                out.append((line, s["arm"], s["prob"], loss, context))
        elif key in first_loss:
            out.append((line, s["arm"], s["prob"], first_loss[key], context))
    return out


def test_a_demo_directory_is_joined_without_a_hand_written_join(demo_dir):
    served = served_directory(demo_dir)
    got = [(r.line, r.arm, r.prob, r.loss, r.context) for r in served.log.records]
    want = expected_join(demo_dir)
    assert len(got) > 10_000 and got == want
    assert any(r.context is not None for r in served.log.records)  # the contextual experiment
    assert served.unmatched_selections == served.selections - len(want) > 0
    assert served.refused > 0  # the demo injects broken feedback


def test_the_command_reports_the_served_value_and_each_configuration(demo_dir, tmp_path):
    result = CliRunner().invoke(
        app, ["evaluate", str(demo_dir), "--variant", "paper", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    figures = orjson.loads((tmp_path / "evaluation.json").read_bytes())
    labels = list(figures["configurations"])
    assert labels == [
        str(demo_dir / "registry.toml"),
        f"{demo_dir / 'registry.toml'}, variant paper",
    ]
    served = served_directory(demo_dir)
    for name, stats in figures["configurations"][labels[0]]["experiments"].items():
        losses = [r.loss for r in served.log.records if r.experiment == name]
        assert stats["logged"]["value"] == pytest.approx(np.mean(losses), rel=1e-12)
        assert stats["logged"]["n"] == len(losses)
        assert f"## {name}: per-round loss" in result.output
    assert "served policy (what it got)" in result.output
    assert "have none (expired or lost)" in result.output


def test_each_configuration_is_what_evaluating_it_alone_gives(demo_dir):
    served = served_directory(demo_dir)
    base = Registry.load(demo_dir / "registry.toml")
    chosen = configurations([("base", base)], ["paper", "robust"])
    assert [c.label for c in chosen] == ["base", "base, variant paper", "base, variant robust"]
    assert {e.variant for e in chosen[1].registry.experiments.values()} == {"paper"}
    both = compare(served.log, chosen, experiment="checkout")
    for config, (label, evaluation) in zip(chosen, both.evaluations, strict=True):
        alone = evaluate(served.log, config.registry, "checkout")["checkout"]
        assert label == config.label
        assert evaluation["checkout"].to_dict() == alone.to_dict()
    paper, robust = (e["checkout"].policy.value for _, e in both.evaluations[1:])
    assert paper != robust  # the variants are different policies


def test_service_files_and_topics_give_the_same_evaluation(demo_dir, kafka_bootstrap, tmp_path):
    topics = {kind: unique_topic(kind) for kind in ("selections", "events")}
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    for kind, topic in topics.items():
        create_topic(kafka_bootstrap, topic, 1)
        for raw in (demo_dir / f"{kind}.jsonl").read_bytes().splitlines():
            producer.produce(topic, raw)
    assert producer.flush(30) == 0
    by_files = CliRunner().invoke(
        app,
        ["evaluate", "--selections", str(demo_dir / "selections.jsonl"),
         "--events", str(demo_dir / "events.jsonl"), "--registry", str(demo_dir / "registry.toml"),
         "--out", str(tmp_path / "files")],
    )  # fmt: skip
    by_topics = CliRunner().invoke(
        app,
        ["evaluate", "--brokers", kafka_bootstrap, "--selections-topic", topics["selections"],
         "--events-topic", topics["events"], "--registry", str(demo_dir / "registry.toml"),
         "--out", str(tmp_path / "topics")],
    )  # fmt: skip
    # the same topics named as tsi run is told them: its environment variables
    run_env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "TSI_TOPIC_EVENTS": topics["events"]}
    by_env = CliRunner(env={**run_env, "TSI_TOPIC_SELECTIONS": topics["selections"]}).invoke(
        app,
        ["evaluate", "--registry", str(demo_dir / "registry.toml"), "--out", str(tmp_path / "env")],
    )
    assert by_files.exit_code == 0 and by_topics.exit_code == 0, by_topics.output
    assert by_env.exit_code == 0, by_env.output
    files = orjson.loads((tmp_path / "files" / "evaluation.json").read_bytes())
    kafka = orjson.loads((tmp_path / "topics" / "evaluation.json").read_bytes())
    [(label, from_files)] = files["configurations"].items()
    assert from_files["experiments"] == kafka["configurations"][label]["experiments"]
    assert files["served"] == kafka["served"]
    by_name = (tmp_path / "env" / "evaluation.json").read_bytes()
    assert by_name == (tmp_path / "topics" / "evaluation.json").read_bytes()


SELECTION = (
    b'{"experiment":"e","unit":null,"request_id":"r1","arm":1,"arm_name":"b","prob":0.5,"round":1}'
)


@pytest.mark.parametrize(
    ("selections", "feedback", "message"),
    [
        ([b"{not json"], [], "<served>:1: not valid JSON"),
        ([b"[1]"], [], "<served>:1: expected a JSON object, got"),
        ([SELECTION.replace(b'"prob":0.5', b'"prob":0')], [], "prob must be in (0, 1], got 0"),
        ([SELECTION.replace(b'"arm":1', b'"arm":-1')], [], "arm must be an integer >= 0, got -1"),
        ([SELECTION], [b'{"experiment":"e","request_id":"r2","loss":1}'], "no served request has"),
    ],
)
def test_bad_served_lines_are_refused_naming_the_line_and_value(selections, feedback, message):
    with pytest.raises(EvaluationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        join_served(selections, feedback)


def test_duplicates_and_refused_feedback_are_counted_not_evaluated():
    duplicate = b'{"experiment":"e","request_id":"r1","loss":9}'
    served = join_served(
        [SELECTION, SELECTION],
        [b'{"experiment":"e","request_id":"r1","loss":2}', duplicate, b'{"experiment":"e"}'],
    )
    assert [r.loss for r in served.log.records] == [2.0]
    assert (served.retries, served.refused, served.selections) == (1, 1, 1)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("selections.jsonl", SELECTION, "a selection written by the service, without its loss"),
        ("events.jsonl", b'{"type":"feedback","experiment":"e","request_id":"r","loss":1}',
         "a feedback sent to the service, without the arm it was served"),
    ],
)  # fmt: skip
def test_one_half_of_a_served_log_says_what_to_add(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content + b"\n")
    with pytest.raises(EvaluationError, match=message):
        load_log(path)
    result = CliRunner().invoke(app, ["evaluate", str(path), "--registry", str(path)])
    assert result.exit_code == 2 and "tsi evaluate:" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--selections", "s.jsonl"], "--selections needs --events or --feedback"),
        (["x.jsonl", "--selections", "s.jsonl"], "give one source"),
        (["DIR", "--selections-topic", "t"], "give one source"),
        (["--variant", "fast", "DIR"], "variant must be one of"),
    ],
)
def test_contradicting_sources_get_one_clear_line(demo_dir, args, message):
    args = [str(demo_dir) if a == "DIR" else a for a in args]
    result = CliRunner(env={"KAFKA_BOOTSTRAP_SERVERS": ""}).invoke(app, ["evaluate", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_the_selections_topic_variable_is_a_source_as_its_flag_is(demo_dir):
    """TSI_TOPIC_SELECTIONS is --selections-topic (as for tsi run): with a LOG, two sources."""
    env = {"TSI_TOPIC_SELECTIONS": "tsi.selections"}
    result = CliRunner(env=env).invoke(app, ["evaluate", str(demo_dir)])
    assert result.exit_code == 2, result.output
    assert "give one source" in result.output and "TSI_TOPIC_SELECTIONS" in result.output


def test_topics_without_brokers_are_refused_by_the_library():
    """The command always has brokers (tsi run's default); the library still says so."""
    given = Inputs(selections_topic="t", events_topic="e")
    assert given.problem() == "--selections-topic needs --brokers (or KAFKA_BOOTSTRAP_SERVERS)"


def test_a_replay_directory_is_evaluated_from_the_logs_it_names(demo_dir, tmp_path):
    """tsi replay writes inputs.json (what it replayed); tsi evaluate OUT joins the replay's
    selections with those logs: the same figures as the demo directory it replayed."""
    out = tmp_path / "replay"
    args = ["replay", "--events", str(demo_dir / "events.jsonl"), "--out", str(out)]
    done = CliRunner().invoke(app, [*args, "--registry", str(demo_dir / "registry.toml")])
    assert done.exit_code == 0, done.output
    replayed, served = served_directory(out), served_directory(demo_dir)
    assert replayed.log.records == served.log.records
    result = CliRunner().invoke(app, ["evaluate", str(out), "--out", str(tmp_path / "ev")])
    assert result.exit_code == 0, result.output
    figures = orjson.loads((tmp_path / "ev" / "evaluation.json").read_bytes())
    assert list(figures["configurations"]) == [str((demo_dir / "registry.toml").resolve())]


def test_an_estimate_on_too_few_events_says_insufficient_data_with_its_ess(tmp_path):
    """A served log of 12 requests: the replay accepts about 6, IPS weighs 12 events. None
    of the configuration's estimates is shown as a figure beside the served value; each
    shows its effective sample size; below a lower --min-ess the figures come back."""
    selections, feedback, registry = (tmp_path / n for n in ("s.jsonl", "f.jsonl", "r.toml"))
    selections.write_bytes(
        b"".join(
            orjson.dumps({"experiment": "e", "unit": None, "request_id": f"r{i}", "arm": i % 2,
                          "arm_name": "ab"[i % 2], "prob": 0.5, "round": i}) + b"\n"
            for i in range(12)
        )
    )  # fmt: skip
    feedback.write_bytes(
        b"".join(
            orjson.dumps({"experiment": "e", "request_id": f"r{i}", "loss": float(i % 2 + i % 3)})
            + b"\n"
            for i in range(12)
        )
    )
    registry.write_text('[experiments.e]\narms = ["a", "b"]\n')
    args = ["evaluate", "--selections", selections, "--feedback", feedback, "--registry", registry]

    def run(*extra: object) -> tuple[str, dict]:
        out = tmp_path / f"out{len(extra)}"
        result = CliRunner().invoke(app, [str(a) for a in (*args, *extra, "--out", out)])
        assert result.exit_code == 0, result.output
        figures = orjson.loads((out / "evaluation.json").read_bytes())
        return result.output, figures["configurations"][str(registry)]["experiments"]["e"]

    text, figures = run()
    accepted = figures["policy"]["n"]
    assert 0 < accepted < 12 and figures["policy"]["ess"] == accepted
    weights_ess = figures["ips"]["ess"]
    assert weights_ess == figures["snips"]["ess"] == figures["effective_sample_size"]
    assert 0 < weights_ess <= 12
    assert figures["min_ess"] == 100
    assert [figures[e]["sufficient"] for e in ("policy", "ips", "snips")] == [False] * 3
    [row] = [line for line in text.splitlines() if line.startswith(f"| {registry} |")]
    ess = f"{weights_ess:.1f}".removesuffix(".0")
    assert row == (
        f"| {registry} | insufficient data | ESS {accepted} < 100 | {accepted} | {accepted} | "
        f"insufficient data | insufficient data | {ess} |"
    )
    served = f"{np.mean([float(i % 2 + i % 3) for i in range(12)]):.6g}"
    assert f"| served policy (what it got) | {served} | [" in text  # the served value stays
    assert "Kish's effective sample size (Σw)²/Σw²" in text and "--min-ess 100" in text
    assert f"| IPS | insufficient data | ESS {ess} < 100 | 12 | {ess} |" in text

    text, figures = run("--min-ess", 1)
    assert "| insufficient data |" not in text and figures["policy"]["sufficient"]
    assert f"| {figures['policy']['value']:.6g} | [" in text
    result = CliRunner().invoke(app, [str(a) for a in (*args, "--min-ess", -1)])
    assert result.exit_code == 2
    assert result.output == "tsi evaluate: min_ess (--min-ess) must be a number >= 0, got -1.0\n"

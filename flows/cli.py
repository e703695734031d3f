"""The ``tsi`` command line.

``tsi simulate`` is the embedded default job: no Kafka, no files, a few seconds.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import NoReturn

import orjson
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from flows.registry import Registry, RegistryError
from flows.service import DEFAULT_BROKERS, DEFAULT_GROUP, ConfigError, client_config
from flows.service import run as run_flow
from flows.wiring import Topics
from tsi_core.environments import bernoulli
from tsi_core.simulate import run

app = typer.Typer(no_args_is_help=True, help="Translation- and scale-invariant bandits.")

TRANSFORMS = [
    ("l", 1.0, 0.0),
    ("1000·l + 1e6", 1000.0, 1e6),
    ("1e-6·l - 4.2", 1e-6, -4.2),
    ("-reward units: 2^20·l - 2^40", 2.0**20, -(2.0**40)),
]


@app.callback()
def main() -> None:
    """Translation- and scale-invariant bandits on streams."""


@app.command()
def simulate(
    arms: int = typer.Option(5, min=2, help="Number of arms M."),
    rounds: int = typer.Option(20_000, min=1, help="Rounds T."),
    seeds: int = typer.Option(20, min=1, help="Independent runs averaged."),
    seed: int = typer.Option(0, min=0, help="Seed of the loss table and the draws."),
) -> None:
    """Regret against the best arm, under shifted and rescaled losses (Bernoulli arms)."""
    means = [0.3 + 0.4 * m / (arms - 1) for m in range(arms)]  # arm 0 is best
    table = bernoulli(rounds, arms, seed, means=means).losses
    typer.echo(
        f"{arms} Bernoulli arms, means {[round(m, 2) for m in means]}, T = {rounds}, {seeds} seeds"
    )
    bound = 5 + 4 * math.sqrt(math.log(arms))
    typer.echo(f"{'losses':<32}{'mean regret':>16}{'range D':>12}{'regret/(D·sqrt(MT))':>22}")
    for name, scale, shift in TRANSFORMS:
        result = run(table, seeds, scale=scale, shift=shift, seed=seed)
        typer.echo(
            f"{name:<32}{result.regret.mean():>16.6g}{result.range:>12.6g}"
            f"{result.normalised.mean():>22.6f}"
        )
    typer.echo(
        f"paper's bound on the normalised regret: 5 + 4·sqrt(log M) = {bound:.3f}; "
        "the last column is the same in every row: the algorithm is invariant."
    )


@app.command("run")
def run_service(
    registry: Path = typer.Option(
        ..., envvar="TSI_REGISTRY", help="Experiments registry (TOML); SIGHUP reloads it."
    ),
    brokers: str = typer.Option(
        DEFAULT_BROKERS,
        envvar="KAFKA_BOOTSTRAP_SERVERS",
        help="Kafka bootstrap servers, comma-separated.",
    ),
    kafka_config: Path | None = typer.Option(
        None,
        envvar="TSI_KAFKA_CONFIG",
        help="TOML of librdkafka client settings (SASL, TLS, ...): [kafka] for both clients, "
        "[kafka.consumer] and [kafka.producer] for one; names as in librdkafka, quoted or "
        'not (security.protocol = "SASL_SSL"). Unknown names are refused; secrets are '
        "masked when the effective settings are logged.",
    ),
    requests_topic: str = typer.Option(
        Topics.requests, envvar="TSI_TOPIC_REQUESTS", help="Decision requests topic."
    ),
    feedback_topic: str = typer.Option(
        Topics.feedback, envvar="TSI_TOPIC_FEEDBACK", help="Feedback topic."
    ),
    events_topic: str | None = typer.Option(
        None,
        envvar="TSI_TOPIC_EVENTS",
        help="One topic for requests and feedback (field 'type'); replaces the two.",
    ),
    selections_topic: str = typer.Option(
        Topics.selections, envvar="TSI_TOPIC_SELECTIONS", help="Selections topic."
    ),
    dlq_topic: str = typer.Option(
        Topics.dead_letters, envvar="TSI_TOPIC_DLQ", help="Dead-letter topic."
    ),
    recovery_dir: Path | None = typer.Option(
        None, envvar="TSI_RECOVERY_DIR", help="Recovery directory (state survives restarts)."
    ),
    no_recovery: bool = typer.Option(
        False,
        "--no-recovery",
        envvar="TSI_NO_RECOVERY",
        help="Run without a recovery directory: state starts empty at every start and the "
        "input resumes from the consumer group's committed offsets (else the topics' end).",
    ),
    snapshot_every: float = typer.Option(
        10.0, min=0.01, envvar="TSI_SNAPSHOT_EVERY", help="Seconds between snapshots."
    ),
    backup_every: float = typer.Option(
        0.0,
        min=0.0,
        help="Seconds old snapshots are kept after a newer one is committed "
        "(raise it when the recovery directory is copied to durable storage).",
    ),
    workers: int = typer.Option(
        1, min=1, envvar="TSI_WORKERS", help="Worker threads in this process."
    ),
    process_id: int | None = typer.Option(
        None, min=0, envvar="TSI_PROCESS_ID", help="This process's index in a cluster."
    ),
    addresses: str | None = typer.Option(
        None, envvar="TSI_ADDRESSES", help="Cluster addresses 'host:port;host:port'."
    ),
    connect_timeout: float = typer.Option(
        10.0, min=0.1, help="Seconds to wait for a broker to answer at start."
    ),
    stop_at_end: bool = typer.Option(
        False,
        envvar="TSI_STOP_AT_END",
        help="Stop at the end of the input topics instead of waiting for more.",
    ),
    metrics_port: int | None = typer.Option(
        None,
        min=1,
        max=65535,
        envvar="TSI_METRICS_PORT",
        help="Serve Prometheus metrics (/metrics), readiness (/ready) and liveness "
        "(/healthz) on this port; off by default.",
    ),
    ready_timeout: float | None = typer.Option(
        None,
        min=1.0,
        envvar="TSI_READY_TIMEOUT",
        help="/ready fails after this many seconds without a finished epoch or a broker "
        "reached (default: 60, or 3 snapshot intervals if longer).",
    ),
    group_id: str = typer.Option(
        DEFAULT_GROUP,
        envvar="TSI_GROUP_ID",
        help="Consumer group the offsets of finished epochs are committed to (lag for "
        "standard tools; recovery uses the recovery directory).",
    ),
    skip_offset: list[str] = typer.Option(
        [],
        envvar="TSI_SKIP_OFFSETS",
        help="TOPIC:PARTITION:OFFSET of a message to skip: it becomes a 'skipped' dead "
        "letter (with its bytes) and changes nothing. Repeat, or comma-separate.",
    ),
    ts_window: float | None = typer.Option(
        None,
        envvar="TSI_TS_WINDOW",
        help="Seconds an event's ts may differ from the wall clock (default 10 years).",
    ),
    log_file: Path | None = typer.Option(
        None,
        envvar="TSI_LOG_FILE",
        help="Write logs here (default: tsi-run.log when stderr is a terminal, else stderr).",
    ),
) -> None:
    """Serve decisions from Kafka: requests and feedback in, selections and dead letters out.

    Everything is checked first (registry, Kafka settings, brokers, every topic read or
    written, the recovery directory); a problem is one line and exit status 2.
    """
    from flows.metrics import MetricsPortError
    from flows.startup import RunOptions, ServiceLog, StartupError, describe_start, prepare

    if (process_id is None) != (addresses is None):
        fail("run", "--process-id and --addresses go together")
    cluster = None if addresses is None else addresses.split(";")
    options = RunOptions(
        registry,
        brokers.split(","),
        kafka_config,
        Topics(requests_topic, feedback_topic, selections_topic, dlq_topic, events_topic),
        recovery_dir,
        no_recovery,
        len(cluster or [None]),
        connect_timeout,
        group_id or None,
        [part for item in skip_offset for part in item.split(",")],
        ts_window,
    )
    service_log = ServiceLog(log_file)
    try:
        service_log.start()
        service = prepare(options)
    except StartupError as exc:
        service_log.say(f"tsi run: {exc}")
        raise typer.Exit(2) from None
    service_log.say(describe_start(options, service_log.path))
    try:
        run_flow(
            service.flow(tail=not stop_at_end, recovery=recovery_dir is not None),
            workers,
            process_id,
            cluster,
            recovery_dir,
            snapshot_every,
            backup_every,
            metrics_port=metrics_port,
            ready_timeout=ready_timeout,
            on_reload=service.reload_registry,
        )
    except MetricsPortError as exc:
        service_log.say(f"tsi run: {exc}")
        raise typer.Exit(2) from None
    except Exception as exc:
        service_log.stopped(exc)
        raise typer.Exit(1) from None


# ---------------------------------------------------------------------------- user errors
class UserError(Exception):
    """A mistake a person can fix: printed as one line, exit status 2, no traceback."""


def fail(command: str, message: str) -> NoReturn:
    typer.echo(f"tsi {command}: {message}", err=True)
    raise typer.Exit(2)


def progress_bar(description: str) -> Progress:
    """A progress bar on stderr (quiet when stderr is not a terminal)."""
    return Progress(
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )


@app.command()
def demo(
    out: Path = typer.Option(Path("tsi-demo"), help="Directory for the report and the logs."),
    requests: int = typer.Option(20_000, min=100, help="Decision requests to generate."),
    seed: int = typer.Option(0, min=0, help="Seed of the traffic and of the bandits' draws."),
) -> None:
    """Generated traffic through the real dataflow (no Kafka), and a report with plots.

    Three experiments, delayed, lost and duplicated feedback, a change of the best arm,
    a few broken messages.
    """
    from flows.demo import generate, run_demo
    from flows.events import Origin
    from flows.report import Stream, log_events, write_report
    from flows.traffic import SCENARIOS, registry_toml

    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "registry.toml").write_text(registry_toml(SCENARIOS, seed))
    except OSError as exc:
        fail("demo", f"cannot write to {out}: {exc.strerror}")
    traffic = generate(requests, seed)
    with progress_bar("serving") as bar:
        task = bar.add_task("serving", total=len(traffic.events))
        loop = run_demo(traffic, progress=lambda n: bar.advance(task, n))
    (out / "events.jsonl").write_bytes(b"".join(raw + b"\n" for raw in loop.sent))
    _write_jsonl(out / "selections.jsonl", loop.selections)
    _write_jsonl(out / "dead_letters.jsonl", loop.dead_letters)
    request_ts, feedback_sent = log_events((raw, Origin("demo")) for raw in loop.sent)
    _write_jsonl(out / "feedback.jsonl", feedback_sent)
    stream = Stream(
        loop.selections,
        feedback_sent,
        loop.dead_letters,
        request_ts,
        {rid: truth[2] for rid, truth in traffic.truth.items()},
    )
    notes = [
        f"{requests:,} requests over {traffic.span / 3600:g} h of simulated time, seed {seed}; "
        "registry in `registry.toml`; the stream as served in `events.jsonl` (`tsi replay "
        "--events` reproduces the selections from it); outputs in `selections.jsonl`, "
        "`feedback.jsonl`, `dead_letters.jsonl`.",
        "checkout: shared bandit, revenue as reward, best arm changes at 60% of the stream "
        "(competes with switching sequences); homepage: one bandit per user, loss = seconds "
        "to first click; push: contextual (3 parts of the day, a different best arm each).",
        "Regret uses each arm's true expected loss at the time of the request.",
    ]
    report = write_report(stream, out, "tsi demo report", notes)
    typer.echo(
        f"{len(loop.selections):,} selections, {len(feedback_sent):,} feedback events, "
        f"{len(loop.dead_letters):,} dead letters; report: {report}"
    )


@app.command("inspect")
def inspect_command(
    recovery_dir: Path = typer.Option(..., help="The service's recovery directory."),
    instance: list[str] = typer.Argument(
        None, help="Instances: 'experiment' or 'experiment/unit', shell wildcards allowed."
    ),
    registry: Path | None = typer.Option(None, help="Registry, for arm names."),
    as_json: bool = typer.Option(False, "--json", help="JSON lines instead of a table."),
    limit: int = typer.Option(50, min=1, help="Show at most this many instances."),
) -> None:
    """The current allocation (q) and counters of instances, from a recovery directory."""
    from flows.inspection import InspectError, describe, render, select_instances
    from flows.recovery_store import read_states

    try:
        reg = Registry.load(registry) if registry is not None else None
        if not recovery_dir.is_dir():
            raise UserError(f"recovery directory {recovery_dir} does not exist")
        states = read_states(recovery_dir)
        keys = select_instances(states, instance or ["*"])
        views = [describe(k, states[k], reg) for k in keys[:limit]]
    except (RegistryError, InspectError, UserError, FileNotFoundError) as exc:
        fail("inspect", str(exc))
    except sqlite3.Error as exc:
        fail("inspect", f"{recovery_dir} is not a readable recovery directory: {exc}")
    if as_json:
        for v in views:
            typer.echo(orjson.dumps(v.to_dict()).decode())
    else:
        typer.echo(render(views))
    if len(keys) > limit:
        typer.echo(f"... {len(keys) - limit} more (raise --limit)", err=True)


def _write_jsonl(path: Path, items: list[dict]) -> None:
    with path.open("wb") as f:
        for item in items:
            f.write(orjson.dumps(item) + b"\n")


@app.command()
def evaluate(
    log: Path = typer.Argument(..., help="JSONL log: full-information or bandit with 'prob'."),
    registry: Path = typer.Option(..., help="The configuration to evaluate (registry TOML)."),
    experiment: str | None = typer.Option(None, help="Only this experiment of the log."),
    switches: int | None = typer.Option(None, min=0, help="Switches of the competitor."),
    level: float = typer.Option(0.95, min=0.5, max=0.999, help="Confidence level."),
    seed: int = typer.Option(0, min=0, help="Evaluation seed (the policy's draws)."),
    out: Path | None = typer.Option(None, help="Also write REPORT.md, a plot and JSON here."),
) -> None:
    """Counterfactual evaluation of a registry configuration on logged data."""
    from flows.evaluation import EvaluationError, load_log
    from flows.evaluation import evaluate as run_evaluation

    try:
        reg = Registry.load(registry)
        result = run_evaluation(load_log(log), reg, experiment, switches, level, seed)
    except (RegistryError, EvaluationError) as exc:
        fail("evaluate", str(exc))
    text = result.to_markdown()
    typer.echo(text)
    if out is not None:
        from flows.report import plot_evaluation

        try:
            out.mkdir(parents=True, exist_ok=True)
            plot = plot_evaluation(result, out / "evaluation.png")
            (out / "REPORT.md").write_text(text + f"\n![evaluation]({plot.name})\n")
            (out / "evaluation.json").write_bytes(
                orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2)
            )
        except OSError as exc:
            fail("evaluate", f"cannot write to {out}: {exc.strerror}")


@app.command()
def replay(
    registry: Path = typer.Option(..., help="Experiments registry (TOML)."),
    events: Path | None = typer.Option(None, help="Combined log (field 'type'), in order."),
    requests: Path | None = typer.Option(None, help="Requests log (merged by 'ts')."),
    feedback: Path | None = typer.Option(None, help="Feedback log (merged by 'ts')."),
    topic: str | None = typer.Option(None, help="Kafka topic of combined events to replay."),
    brokers: str = typer.Option(
        "127.0.0.1:9092", envvar="KAFKA_BOOTSTRAP_SERVERS", help="Kafka brokers (with --topic)."
    ),
    from_offset: int | None = typer.Option(None, min=0, help="First offset (each partition)."),
    to_offset: int | None = typer.Option(None, min=0, help="Stop before this offset."),
    seed: int | None = typer.Option(None, min=0, help="Replace every experiment's seed."),
    out: Path = typer.Option(Path("tsi-replay"), help="Directory for outputs and the report."),
) -> None:
    """A logged stream through the same dataflow, deterministically, and a report.

    The same log and seed give the same selections, byte for byte.
    """
    from flows.replay import ReplayError, kafka_range, merge_by_time, read_lines
    from flows.replay import replay as run_replay
    from flows.report import Stream, log_events, write_report

    sources = [events is not None, requests is not None or feedback is not None, topic is not None]
    if sum(sources) != 1 or (sources[1] and (requests is None or feedback is None)):
        fail("replay", "give --events, or --requests with --feedback, or --topic")
    try:
        reg = Registry.load(registry)
        kinds: dict[str, str] = {}
        if events is not None:
            messages = list(read_lines(events))
        elif topic is not None:
            messages = kafka_range(brokers, topic, from_offset, to_offset)
        else:
            messages = merge_by_time(read_lines(requests), read_lines(feedback))
            kinds = {str(requests): "request", str(feedback): "feedback"}
        out.mkdir(parents=True, exist_ok=True)
    except (RegistryError, ReplayError) as exc:
        fail("replay", str(exc))
    except OSError as exc:
        fail("replay", f"cannot write to {out}: {exc.strerror}")
    if not messages:
        fail("replay", "the log is empty")
    with progress_bar("replaying") as bar:
        task = bar.add_task("replaying", total=len(messages))
        result = run_replay(messages, reg, kinds, seed, lambda n: bar.advance(task, n))
    (out / "selections.jsonl").write_bytes(
        b"".join(line + b"\n" for line in result.selection_lines)
    )
    _write_jsonl(out / "dead_letters.jsonl", result.dead_letters)
    feedback_logs = [source for source, kind in kinds.items() if kind == "feedback"]
    request_ts, feedback_sent = log_events(messages, feedback_logs)
    stream = Stream(result.selections, feedback_sent, result.dead_letters, request_ts)
    report = write_report(
        stream,
        out,
        "tsi replay report",
        [f"{len(messages):,} messages replayed from {events or topic or requests}."],
    )
    typer.echo(
        f"{len(result.selections):,} selections, {len(result.dead_letters):,} dead letters "
        f"from {len(messages):,} messages; {out / 'selections.jsonl'}; report: {report}"
    )


# ---------------------------------------------------------------------------- tsi topics
topics_app = typer.Typer(no_args_is_help=True, help="Create and check the service's Kafka topics.")
app.add_typer(topics_app, name="topics")

_BROKERS = typer.Option(
    "127.0.0.1:9092", envvar="KAFKA_BOOTSTRAP_SERVERS", help="Kafka bootstrap servers."
)
_KAFKA_CONFIG = typer.Option(
    None, envvar="TSI_KAFKA_CONFIG", help="TOML client settings (SASL, TLS), as for tsi run."
)
_REQUESTS = typer.Option(Topics.requests, envvar="TSI_TOPIC_REQUESTS", help="Requests topic.")
_FEEDBACK = typer.Option(Topics.feedback, envvar="TSI_TOPIC_FEEDBACK", help="Feedback topic.")
_EVENTS = typer.Option(
    None, envvar="TSI_TOPIC_EVENTS", help="One topic for requests and feedback; replaces the two."
)
_SELECTIONS = typer.Option(
    Topics.selections, envvar="TSI_TOPIC_SELECTIONS", help="Selections topic."
)
_DLQ = typer.Option(Topics.dead_letters, envvar="TSI_TOPIC_DLQ", help="Dead-letter topic.")
_TIMEOUT = typer.Option(30.0, min=0.1, help="Seconds to wait for the brokers.")


def _service_topic_names(
    requests: str, feedback: str, events: str | None, selections: str, dlq: str
) -> list[str]:
    from flows.topics import service_topics

    inputs, outputs = service_topics(Topics(requests, feedback, selections, dlq, events or None))
    return inputs + outputs


@topics_app.command("create")
def topics_create(
    brokers: str = _BROKERS,
    kafka_config: Path | None = _KAFKA_CONFIG,
    requests_topic: str = _REQUESTS,
    feedback_topic: str = _FEEDBACK,
    events_topic: str | None = _EVENTS,
    selections_topic: str = _SELECTIONS,
    dlq_topic: str = _DLQ,
    partitions: int | None = typer.Option(
        None, min=1, help="Partitions of new topics (default 3); if given, existing must match."
    ),
    replication_factor: int | None = typer.Option(
        None, min=1, help="Replicas of new topics (default 1); if given, existing must match."
    ),
    dlq_max_message_bytes: int | None = typer.Option(
        None, min=1, help="max.message.bytes of a new dead-letter topic; if given, existing too."
    ),
    timeout: float = _TIMEOUT,
) -> None:
    """Create the service's topics: requests, feedback (or --events-topic), selections, DLQ.

    Idempotent: an existing topic is reported ("exists, 3 partitions, ...") and left as is.
    It is an error (exit status 2, nothing created) only if it contradicts an option given:
    --partitions, --replication-factor or --dlq-max-message-bytes.
    Existing topics are never changed (more partitions would move keys to other partitions).
    Returns once every new topic has leaders.
    """
    from flows.topics import TopicError, create_topics

    names = _service_topic_names(
        requests_topic, feedback_topic, events_topic, selections_topic, dlq_topic
    )
    limits = {} if dlq_max_message_bytes is None else {dlq_topic: dlq_max_message_bytes}
    try:
        consumer, _ = client_config(kafka_config)
        lines = create_topics(
            brokers.split(","),
            consumer,
            names,
            partitions=partitions,
            replication_factor=replication_factor,
            max_bytes=limits,
            timeout=timeout,
        )
    except (ConfigError, TopicError) as exc:
        fail("topics", str(exc))
    for line in lines:
        typer.echo(line)


@topics_app.command("check")
def topics_check(
    brokers: str = _BROKERS,
    kafka_config: Path | None = _KAFKA_CONFIG,
    requests_topic: str = _REQUESTS,
    feedback_topic: str = _FEEDBACK,
    events_topic: str | None = _EVENTS,
    selections_topic: str = _SELECTIONS,
    dlq_topic: str = _DLQ,
    timeout: float = _TIMEOUT,
) -> None:
    """Each of the service's topics: partitions, replication, max.message.bytes or missing.

    Exit status 2 when a topic is missing.
    """
    from flows.topics import TopicError, topic_infos

    names = _service_topic_names(
        requests_topic, feedback_topic, events_topic, selections_topic, dlq_topic
    )
    try:
        consumer, _ = client_config(kafka_config)
        infos = topic_infos(brokers.split(","), consumer, names, timeout)
    except (ConfigError, TopicError) as exc:
        fail("topics", str(exc))
    for name, info in infos.items():
        typer.echo(f"{name}: {'missing' if info is None else info.summary()}")
    missing = [name for name, info in infos.items() if info is None]
    if missing:
        fail("topics", f"missing topic(s) {', '.join(missing)}; create them: tsi topics create")


if __name__ == "__main__":
    app()

"""The ``tsi`` command line.

``tsi simulate`` is the embedded default job: no Kafka, no files, a few seconds.
"""

from __future__ import annotations

import math
from pathlib import Path

import typer

from flows.registry import Registry, RegistryError
from flows.service import ConfigError, Service, client_config
from flows.service import run as run_flow
from flows.wiring import Topics
from tsi_core.simulate import bernoulli_table, run

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
    table = bernoulli_table(rounds, means, seed)
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
    registry: Path = typer.Option(..., envvar="TSI_REGISTRY", help="Experiments registry (TOML)."),
    brokers: str = typer.Option(
        "127.0.0.1:9092",
        envvar="KAFKA_BOOTSTRAP_SERVERS",
        help="Kafka bootstrap servers, comma-separated.",
    ),
    kafka_config: Path | None = typer.Option(
        None,
        envvar="TSI_KAFKA_CONFIG",
        help="TOML with [kafka], [kafka.consumer], [kafka.producer] client settings "
        "(SASL, TLS, ...), passed to librdkafka untouched.",
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
        None, envvar="TSI_RECOVERY_DIR", help="Recovery directory (enables recovery)."
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
    stop_at_end: bool = typer.Option(
        False,
        envvar="TSI_STOP_AT_END",
        help="Stop at the end of the input topics instead of waiting for more.",
    ),
) -> None:
    """Serve decisions from Kafka: requests and feedback in, selections and dead letters out."""
    try:
        consumer, producer = client_config(kafka_config)
        topics = Topics(requests_topic, feedback_topic, selections_topic, dlq_topic, events_topic)
        service = Service(Registry.load(registry), brokers.split(","), topics, consumer, producer)
    except (ConfigError, RegistryError) as exc:
        typer.echo(f"tsi run: {exc}", err=True)
        raise typer.Exit(2) from None
    if (process_id is None) != (addresses is None):
        typer.echo("tsi run: --process-id and --addresses go together", err=True)
        raise typer.Exit(2)
    run_flow(
        service.flow(tail=not stop_at_end, recovery=recovery_dir is not None),
        workers,
        process_id,
        None if addresses is None else addresses.split(";"),
        recovery_dir,
        snapshot_every,
        backup_every,
    )

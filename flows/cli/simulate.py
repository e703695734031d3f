"""``tsi simulate``: regret under shifted and rescaled losses, on one screen."""

from __future__ import annotations

import math

import typer

from flows.cli.base import app
from flows.tools.simulate import bernoulli_table, run

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

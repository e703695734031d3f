"""``tsi simulate``: regret under shifted and rescaled losses, on one screen.

The four maps are played in one batch (``flows.tools.simulate.run_maps``): the defaults
(5 arms, T = 20,000, 20 seeds) take about 1.5 s in all (1 s of play; measured on one
core), with a progress bar on a terminal. The sentence under the table is computed from the runs:
whether every map made the same selections, and how far the normalised regrets agree.
"""

from __future__ import annotations

import math

import typer

from flows.cli.base import app, progress_bar
from flows.tools.simulate import agreement_text, bernoulli_table, run_maps
from tsi_core.variant import DEFAULT_VARIANT, VARIANTS

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
    variant: str = typer.Option(
        DEFAULT_VARIANT, help=f"The algorithm: one of {', '.join(sorted(VARIANTS))}."
    ),
) -> None:
    """Regret against the best arm, under shifted and rescaled losses (Bernoulli arms)."""
    if variant not in VARIANTS:
        raise typer.BadParameter(f"one of {', '.join(sorted(VARIANTS))}", param_hint="--variant")
    means = [0.3 + 0.4 * m / (arms - 1) for m in range(arms)]  # arm 0 is best
    table = bernoulli_table(rounds, means, seed)
    typer.echo(
        f"{arms} Bernoulli arms, means {[round(m, 2) for m in means]}, T = {rounds}, "
        f"{seeds} seeds, variant {variant!r}"
    )
    maps = [(scale, shift) for _, scale, shift in TRANSFORMS]
    with progress_bar("simulating") as bar:
        task = bar.add_task("simulating", total=rounds)
        results = run_maps(
            table, seeds, maps, seed=seed, variant=variant, progress=lambda n: bar.advance(task, n)
        )
    typer.echo(
        f"{'losses':<32}{'mean regret':>16}{'range D':>12}{'selections ≠ row 1':>20}"
        f"{'regret/(D·sqrt(MT))':>22}"
    )
    for (name, _, _), result in zip(TRANSFORMS, results, strict=True):
        differ = int((result.arms != results[0].arms).sum())
        typer.echo(
            f"{name:<32}{result.regret.mean():>16.6g}{result.range:>12.6g}{differ:>20,}"
            f"{result.normalised.mean():>22.6f}"
        )
    bound = 5 + 4 * math.sqrt(math.log(arms))
    typer.echo(f"paper's bound on the normalised regret: 5 + 4·sqrt(log M) = {bound:.3f}.")
    typer.echo(agreement_text(results, [name for name, _, _ in TRANSFORMS]))

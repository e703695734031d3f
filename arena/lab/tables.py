"""Which tables chose constants or the default, which were scored before, and the held-out
draws the arena scores on.

A table is a family (an arena constructor at the arena's shape: 10 arms, 4 contexts or
switches where it has them; ``ftl_breaker`` 2 arms) and the seed it is drawn with.
``CHOSE`` names the tables that chose a preset's constants or the default variant, with
what each chose and where that is recorded; ``SEEN`` the tables scored before this split
that chose nothing. ``held_out`` draws fresh seeds of every family and refuses a draw that
is in either list.

>>> Table("bernoulli", 1).build(100).shape
(100, 10)
>>> draws = held_out(10)
>>> sorted({t.family for t in draws}) == sorted(set(FAMILIES) - set(NOT_HELD_OUT))
True
>>> set(draws).isdisjoint(t.table for t in CHOSE)
True
>>> Table("coin", 1)
Traceback (most recent call last):
...
ValueError: family must be one of [...], got 'coin'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from arena.lab.datasets import diabetes, digits, wine
from arena.lab.environments import (
    bernoulli,
    contextual,
    delayed_switch,
    ftl_breaker,
    gaussian,
    heavy_tailed,
    outlier,
    piecewise_stationary,
    spiky,
    suite_seeds,
)
from flows.tools.loss_table import LossTable
from tsi_core.validate import check_int

__all__ = [
    "CHOSE",
    "FAMILIES",
    "FIRST_HELD_OUT_SEED",
    "NOT_HELD_OUT",
    "SEEN",
    "STATIONARY",
    "SUITE_ORDER",
    "Chose",
    "Table",
    "held_out",
]

#: every family the arena plays, at the arena's shape: (rounds, seed) -> table
FAMILIES: dict[str, Callable[[int, int], LossTable]] = {
    "bernoulli": lambda t, s: bernoulli(t, 10, s),
    "gaussian": lambda t, s: gaussian(t, 10, s),
    "heavy_tailed": lambda t, s: heavy_tailed(t, 10, s),
    "piecewise_stationary": lambda t, s: piecewise_stationary(t, 10, min(4, t - 1), s),
    "ftl_breaker": lambda t, s: ftl_breaker(t, 2, s),
    "contextual": lambda t, s: contextual(t, 10, 4, s),
    "outlier": lambda t, s: outlier(t, 10, s),
    "delayed_switch": lambda t, s: delayed_switch(t, 10, s),
    "spiky": lambda t, s: spiky(t, 10, s),
    "digits": lambda t, s: digits(t, s),
    "wine": lambda t, s: wine(t, s),
    "diabetes": lambda t, s: diabetes(t, s),
}

#: families with no held-out draw: every seed of ``ftl_breaker`` is the same table up to
#: the labels of its two arms, so each draw is the table that chose ``bobw``'s constants
NOT_HELD_OUT = ("ftl_breaker",)

#: the held-out draws use seeds from here on (no seed the project used before)
FIRST_HELD_OUT_SEED = 100


@dataclass(frozen=True)
class Table:
    """A family of ``FAMILIES`` and the seed it is drawn with."""

    family: str
    seed: int

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {sorted(FAMILIES)}, got {self.family!r}")
        check_int("seed", self.seed, 0)

    def build(self, n_rounds: int) -> LossTable:
        """The table with ``n_rounds`` rounds."""
        return FAMILIES[self.family](check_int("n_rounds", n_rounds, 1), self.seed)


@dataclass(frozen=True)
class Chose:
    """A table that chose something: what it chose, and where that is recorded."""

    table: Table
    chose: str
    source: str


_BOBW = "bobw's constants (the default variant)"
_BOBW_SOURCE = "bench/bench_bobw.py tuning_tables; bench/RESULTS.md, 'Best of both worlds'"
_ROBUST = "the robust, mean and adaptive presets (robust: the default before bobw)"
_ROBUST_SOURCE = "commit 4d9a4df; VARIANTS.md (γ scale ½ on the arena's ftl_breaker)"
#: ``suite``'s families in its order (its tables at seed 0 are those of ``suite_seeds(0)``)
SUITE_ORDER = (
    "bernoulli",
    "gaussian",
    "heavy_tailed",
    "piecewise_stationary",
    "ftl_breaker",
    "contextual",
    "outlier",
)
_SUITE_0 = dict(zip(SUITE_ORDER, suite_seeds(0), strict=True))

#: the tables that chose the default's constants or the earlier presets
CHOSE: tuple[Chose, ...] = (
    *(
        Chose(Table(f, 1), _BOBW, _BOBW_SOURCE)
        for f in ("bernoulli", "gaussian", "heavy_tailed", "contextual", "ftl_breaker")
    ),
    Chose(
        Table("heavy_tailed", 7),
        "bobw's scale (the RMS), after a first held-out run on it",
        "bench/RESULTS.md, 'Best of both worlds'; VARIANTS.md",
    ),
    # the arena's tables when robust was chosen: its suite at seed 0 (no outlier yet), digits
    *(Chose(Table(f, s), _ROBUST, _ROBUST_SOURCE) for f, s in _SUITE_0.items() if f != "outlier"),
    Chose(Table("digits", 0), _ROBUST, _ROBUST_SOURCE),
)

#: tables scored before this split that chose nothing: the arena's other seed-0 tables and
#: bench_bobw's held-out and growth tables (the arena's families only)
SEEN: tuple[Table, ...] = (
    Table("outlier", _SUITE_0["outlier"]),
    Table("wine", 0),
    Table("diabetes", 0),
    *(
        Table(f, 7)
        for f in (
            "bernoulli",
            "outlier",
            "digits",
            "wine",
            "diabetes",
            "ftl_breaker",
            "delayed_switch",
            "spiky",
            "piecewise_stationary",
        )
    ),
    Table("bernoulli", 11),
)


def held_out(n_tables: int, first_seed: int = FIRST_HELD_OUT_SEED) -> list[Table]:
    """``n_tables`` draws (seeds ``first_seed`` on) of every family but ``NOT_HELD_OUT``;
    a draw in ``CHOSE`` or ``SEEN`` raises ``ValueError`` naming it."""
    n_tables = check_int("n_tables", n_tables, 1)
    first_seed = check_int("first_seed", first_seed, 0)
    used = {c.table for c in CHOSE} | set(SEEN)
    draws = [
        Table(f, s)
        for f in FAMILIES
        if f not in NOT_HELD_OUT
        for s in range(first_seed, first_seed + n_tables)
    ]
    clash = [t for t in draws if t in used]
    if clash:
        raise ValueError(f"held-out draws {clash} were used before: choose another first_seed")
    return draws


#: the families whose competitor is a fixed arm or a context map on stationary losses (the
#: others change under the learner: switches, a late swap, spikes, the FTL-breaker)
STATIONARY = (
    "bernoulli",
    "gaussian",
    "heavy_tailed",
    "contextual",
    "outlier",
    "digits",
    "wine",
    "diabetes",
)

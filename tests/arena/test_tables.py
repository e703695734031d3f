"""The arena's held-out draws against the tables that chose the default (``arena.lab.tables``)
and the report that names both (``bench/bench_arena.py``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from arena.lab.environments import suite, suite_seeds
from arena.lab.tables import (
    CHOSE,
    FAMILIES,
    FIRST_HELD_OUT_SEED,
    NOT_HELD_OUT,
    SEEN,
    STATIONARY,
    SUITE_ORDER,
    Table,
    held_out,
)
from arena.runner import merge, play, tsi_contenders

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 300


def _bench(name: str):
    """A bench script as a module (bench/ on the path for its own imports)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "bench"))


def _columns(table: np.ndarray) -> list[bytes]:
    """The table's columns as bytes, sorted: equal for two tables equal up to arm labels."""
    return sorted(np.ascontiguousarray(table.T)[m].tobytes() for m in range(table.shape[1]))


def test_the_held_out_draws_and_the_tables_that_chose_are_disjoint_as_specs():
    draws = held_out(10)
    chose = {c.table for c in CHOSE}
    assert len(draws) == len(set(draws)) == 10 * (len(FAMILIES) - len(NOT_HELD_OUT))
    assert not set(draws) & chose
    assert not set(draws) & set(SEEN)
    assert {t.family for t in draws} == set(FAMILIES) - set(NOT_HELD_OUT)


def test_no_held_out_table_equals_a_table_that_chose_even_up_to_arm_labels():
    chose = {(c.table.family, tuple(_columns(c.table.build(ROUNDS).losses))) for c in CHOSE}
    seen = {(t.family, tuple(_columns(t.build(ROUNDS).losses))) for t in SEEN}
    for t in held_out(10):
        key = (t.family, tuple(_columns(t.build(ROUNDS).losses)))
        assert key not in chose, t
        assert key not in seen, t


def test_every_ftl_breaker_draw_is_the_tuning_table_up_to_arm_labels_so_none_is_held_out():
    tuning = _columns(Table("ftl_breaker", 1).build(ROUNDS).losses)
    assert all(_columns(Table("ftl_breaker", s).build(ROUNDS).losses) == tuning for s in (7, 100))
    assert "ftl_breaker" in NOT_HELD_OUT
    assert all(t.family != "ftl_breaker" for t in held_out(10))


def test_chose_lists_bench_bobws_tuning_tables():
    bobw = _bench("bench_bobw")
    theirs = [(e.name, e.losses.tobytes()) for e in bobw.tuning_tables(ROUNDS)]
    ours = [
        (t.build(ROUNDS).name, t.build(ROUNDS).losses.tobytes())
        for t in (c.table for c in CHOSE if c.chose.startswith("bobw's constants"))
    ]
    assert ours == theirs


def test_chose_and_seen_list_the_arena_suite_of_seed_0_robust_was_chosen_on():
    robust = {c.table for c in CHOSE if c.chose.startswith("the robust")}
    envs = suite(ROUNDS, 0)
    for env, family, seed in zip(envs, SUITE_ORDER, suite_seeds(0), strict=True):
        assert env.name == family
        assert np.array_equal(Table(family, seed).build(ROUNDS).losses, env.losses)
        assert Table(family, seed) in (robust if family != "outlier" else set(SEEN))
    assert Table("digits", 0) in robust


def test_a_held_out_draw_that_was_used_before_is_refused():
    with pytest.raises(ValueError, match="used before"):
        held_out(10, first_seed=0)
    assert held_out(1)[0].seed == FIRST_HELD_OUT_SEED
    with pytest.raises(ValueError, match="family"):
        Table("coin", 1)


def test_the_stationary_families_are_families():
    assert set(STATIONARY) <= set(FAMILIES)


def test_merge_puts_the_draws_instances_side_by_side():
    c = tsi_contenders(["paper"])[0]
    parts = [play(Table("bernoulli", s).build(ROUNDS), c, 3, s) for s in (100, 101)]
    both = merge(parts)
    assert np.array_equal(both.normalised, np.concatenate([p.normalised for p in parts]))
    assert both.curve.shape == (parts[0].curve.shape[0], 6)


def test_the_report_names_the_tables_that_chose_and_the_held_out_ones():
    arena = _bench("bench_arena")
    plan = {"held_out_seeds": "100–109"}
    text = "\n".join(arena.split_lines(plan))
    for c in CHOSE:
        assert f"{c.table.family} {c.table.seed}" in text
    for t in SEEN:
        assert f"{t.family} {t.seed}" in text
    assert "**Held out**" in text and "table seeds 100–109" in text
    assert "**Not held out**: ftl_breaker" in text


def test_the_committed_report_names_both_sets_and_leads_with_held_out_figures():
    report = (ROOT / "bench" / "arena" / "REPORT.md").read_text()
    split = report.index("### Which tables chose the default, and which are held out")
    headline = report.index("### Headline: the default (`bobw`) on held-out tables")
    assert split < headline < report.index("### Losses identity")
    assert "bernoulli 1, gaussian 1, heavy_tailed 1, contextual 1, ftl_breaker 1" in report
    assert "**Held out**" in report
    assert "### Best of both worlds: the frontier" in report


def test_replace_subsection_rewrites_that_section_and_nothing_else(tmp_path):
    arena = _bench("bench_arena")
    path = tmp_path / "REPORT.md"
    path.write_text("# r\n\n### A\na\n\n### Best of both worlds: the frontier\nold\n\n### B\nb\n")
    arena.replace_subsection(path, ["### Best of both worlds: the frontier", "", "new", ""])
    text = path.read_text()
    assert "old" not in text and "new" in text
    assert text.startswith("# r\n\n### A\na\n\n") and text.endswith("\n### B\nb\n")


def test_the_committed_frontier_names_every_target_of_the_default():
    from arena.report import FRONTIER_TARGETS

    section = (ROOT / "bench" / "arena" / "REPORT.md").read_text()
    section = section.split("### Best of both worlds: the frontier", 1)[1].split("\n### ", 1)[0]
    for _, title, limit in FRONTIER_TARGETS:
        assert f"{title} (≤ {limit:g})" in section

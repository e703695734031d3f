"""The ratios of ``bench_core.py``: every measure over its reference (the quotient of
medians and the same-repeat quotients) and the targets, PASS or MISS."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one
from core_plan import TARGETS


def ratio(measures: dict[str, dict], key: str, ref: str) -> dict[str, Any] | None:
    """measure / reference: the quotient of medians, and per repeat (same-repeat pairs)."""
    if key not in measures or ref not in measures:
        return None
    a, b = measures[key], measures[ref]
    per_repeat = [x / y for x, y in zip(a["rates"], b["rates"], strict=True)]
    return {
        "measure": key,
        "reference": ref,
        "ratio": a["median"] / b["median"],
        "per_repeat": per_repeat,
        "min": min(per_repeat),
        "max": max(per_repeat),
    }


PAIRS = (  # every ratio the report shows, (measure, reference)
    *((t[1], t[2]) for t in TARGETS),
    ("bandit_fixed_m10", "exp3_m10"),
    ("bandit_fixed_m1000", "river_exp3_m1000"),
    ("bandit_fixed_m10", "bandit_fixed_m1000"),
    ("batch_switching", "numpy_batch_switching"),
    ("batch_contextual", "numpy_batch_contextual"),
    ("batch_fixed", "exp3_batch"),
    ("batch_fixed", "batch_switching"),
    ("batch_fixed", "batch_contextual"),
    ("bandit_u_m10", "table_m10"),
    ("bandit_u_m1000", "table_m1000"),
    ("batch_u_fixed", "table_batch"),
    ("bandit_fixed_m10", "bandit_u_m10"),
)


def all_ratios(measures: dict[str, dict]) -> dict[str, dict[str, Any]]:
    found = {f"{a}/{b}": ratio(measures, a, b) for a, b in PAIRS}
    return {name: r for name, r in found.items() if r is not None}


def targets_of(ratios: dict[str, dict]) -> list[dict[str, Any]]:
    out = []
    for label, key, ref, op, bound in TARGETS:
        r = ratios.get(f"{key}/{ref}")
        passed = None if r is None else (r["ratio"] >= bound if op == ">=" else r["ratio"] <= bound)
        out.append(
            {
                "label": label,
                "ratio": None if r is None else r["ratio"],
                "op": op,
                "bound": bound,
                "pass": passed,
                "measure": key,
                "reference": ref,
            }
        )
    return out

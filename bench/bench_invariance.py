"""Invariance at length: how many selections change when the losses are mapped by
1000·l + 10^6, 1000·l, l + 3 and 10^-4·l − 3, for every competition class, over 10^5
rounds of the tables of ``arena.lab.rounding_tables`` (trend and ×100 regimes with ties,
near-ties, one-arm spikes, real forecast errors).

    .venv/bin/python bench/bench_invariance.py                      # the default, 10^5 rounds
    .venv/bin/python bench/bench_invariance.py --variants bobw robust --rounds 20000

Every instance plays the same draws on the losses and on each map; a selection that
differs is counted with the round of the first. Writes ``--out`` (markdown) and ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one

from core_machine import cpu_model, git_state

from arena.lab.rounding_tables import MAPS, TABLES, classes, selections

HERE = Path(__file__).resolve().parent
N_ARMS, N_CONTEXTS = 8, 3
CLASSES = classes(N_ARMS, N_CONTEXTS)


def measure(
    kind: str, rounds: int, instances: int, variant: Any, classes: Iterable[str] = tuple(CLASSES)
) -> list[dict[str, Any]]:
    """One row per class (of ``classes``) and map: selections that differ from the
    unmapped run."""
    rng = np.random.default_rng(20261207)
    losses = TABLES[kind](rng, rounds, instances, N_ARMS)
    u = rng.random((rounds, instances))
    contexts = rng.integers(0, N_CONTEXTS, size=(rounds, instances))
    rows = []
    for name in classes:
        build = CLASSES[name]
        ctx = contexts if name == "contextual" else None
        base = selections(losses, u, ctx, build(), variant)
        for label, f in MAPS.items():
            differ = np.argwhere(selections(f(losses), u, ctx, build(), variant) != base)
            first = int(differ[:, 0].min()) + 1 if len(differ) else None
            rows.append(
                {"table": kind, "class": name, "variant": variant, "map": label,
                 "selections": int(base.size), "changed": len(differ), "first_round": first}
            )  # fmt: skip
    return rows


def report(rows: list[dict[str, Any]], command: str, meta: dict[str, Any]) -> str:
    lines = [
        "# Invariance over long runs: selections changed by maps that round",
        "",
        f"Reproduce: `{command}` ({meta['seconds']:.0f} s on {meta['machine']}, "
        f"{meta['date']}, commit {meta['commit']}). {meta['rounds']:,} rounds × "
        f"{meta['instances']} instances a run, "
        f"{N_ARMS} arms, the same draws on the losses and on each map; the tables are "
        "`arena/lab/rounding_tables.py`.",
        "",
        "| variant | table | class | " + " | ".join(MAPS) + " |",
        "|---|---|---|" + "---:|" * len(MAPS),
    ]
    keyed = {(r["variant"], r["table"], r["class"], r["map"]): r for r in rows}
    for v, t, c in dict.fromkeys((r["variant"], r["table"], r["class"]) for r in rows):
        cells = []
        for m in MAPS:
            r = keyed[v, t, c, m]
            cells.append(f"{r['changed']} (from {r['first_round']:,})" if r["changed"] else "0")
        lines.append(f"| {v} | {t} | {c} | " + " | ".join(cells) + " |")
    total = sum(r["changed"] for r in rows)
    lines += ["", f"Changed in all: {total:,} of {sum(r['selections'] for r in rows):,}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--rounds", type=int, default=100_000)
    p.add_argument("--instances", type=int, default=6)
    p.add_argument("--variants", nargs="+", default=["bobw"])
    p.add_argument("--tables", nargs="+", default=list(TABLES), choices=list(TABLES))
    p.add_argument("--out", type=Path, default=HERE / "bobw" / "invariance.md")
    p.add_argument("--json", type=Path, default=HERE / "bobw" / "invariance.json")
    args = p.parse_args(argv)
    start = time.perf_counter()
    rows = []
    for variant in args.variants:
        for kind in args.tables:
            found = measure(kind, args.rounds, args.instances, variant)
            print(f"  {variant} {kind}: {sum(r['changed'] for r in found)} changed", flush=True)
            rows += found
    meta = {
        "rounds": args.rounds,
        "instances": args.instances,
        "seconds": time.perf_counter() - start,
        "machine": f"{cpu_model()} ({os.cpu_count()} CPUs)",
        "commit": git_state().get("commit", "?"),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    command = "python bench/bench_invariance.py " + shlex.join(argv or sys.argv[1:])
    args.out.write_text(report(rows, command.strip(), meta), encoding="utf-8")
    args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"{args.out}: {sum(r['changed'] for r in rows)} selections changed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

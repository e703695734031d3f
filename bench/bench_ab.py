"""Two revisions' throughput, measured in alternation against one broker.

Run from the repository root (about 2 minutes to build each revision, then ~2.5 minutes
a revision and round)::

    .venv/bin/python bench/bench_ab.py 8d47f1f HEAD --rounds 3   # raw in bench/ab_results.json

On a shared host the same code runs at very different speeds minutes apart (this
project's 2-core host: 0.43 to 0.85 of the passthrough within ten minutes), so a change
is judged by running the build before and after in turns, each against the passthrough
of its own repeat. Each revision is checked out in a worktree of its own and its
extensions are built there (``setup.py build_ext --inplace``, with this environment's
Python); every round runs ``bench_flow.py --only throughput`` of revision A, then of B,
each from its worktree (``PYTHONPATH``) against the broker this script starts
(``flow_kafka.broker``: ``$KAFKA_BOOTSTRAP_SERVERS`` when set). Reported: the median of
every repeat of each measure, and B over A.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from flow_kafka import broker  # noqa: E402

#: (label, mode in bench_flow's throughput results, field of each repeat)
MEASURES = (
    ("combined topic / passthrough", "events", "ratio_to_passthrough"),
    ("two topics / passthrough", "separate", "ratio_to_passthrough"),
    ("default setup, events/s", "separate", "default_setup_events_per_s"),
    ("worker us an event, combined topic", "events", "worker_us_per_event"),
    ("worker us an event, two topics", "separate", "worker_us_per_event"),
)


def log(msg: str) -> None:
    print(f"[bench_ab {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def checkout(rev: str, where: Path) -> str:
    """A worktree of ``rev`` at ``where`` with its extensions built; its commit."""
    subprocess.run(["git", "worktree", "add", "--detach", str(where), rev], cwd=ROOT, check=True)
    build = [sys.executable, "setup.py", "--quiet", "build_ext", "--inplace"]
    subprocess.run(build, cwd=where, check=True, stdout=subprocess.DEVNULL)
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=where,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def throughput(tree: Path, bootstrap: str, out: Path) -> dict[str, Any]:
    """One ``bench_flow.py --only throughput`` of the code in ``tree``: its results."""
    env = {**os.environ, "PYTHONPATH": str(tree), "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    command = [sys.executable, str(tree / "bench" / "bench_flow.py"), "--only", "throughput"]
    subprocess.run(
        [*command, "--out", str(out)],
        cwd=tree.parent,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return json.loads(out.read_text())["throughput"]


def repeats(results: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Every repeat's value of each measure (``MEASURES``) over the runs ``results``.

    >>> run = {"events": {"runs": [{"ratio_to_passthrough": 0.5, "worker_us_per_event": 9}]},
    ...        "separate": {"runs": [{"ratio_to_passthrough": 0.6,
    ...                               "default_setup_events_per_s": 4e4,
    ...                               "worker_us_per_event": 8}]}}
    >>> repeats([run, run])["combined topic / passthrough"]
    [0.5, 0.5]
    """
    return {
        label: [r[field] for result in results for r in result[mode]["runs"] if field in r]
        for label, mode, field in MEASURES
    }


def report(names: tuple[str, str], values: tuple[dict[str, list[float]], ...]) -> str:
    """A markdown table: each measure's median over every repeat of A and of B, and B / A.

    >>> a, b = {"m": [1.0, 2.0, 3.0]}, {"m": [3.0, 4.0]}
    >>> print(report(("old", "new"), (a, b)).splitlines()[2])
    | m | 2 (3) | 3.5 (2) | 1.75 |
    """
    lines = [
        f"| measure | {names[0]} (repeats) | {names[1]} (repeats) | B / A |",
        "|---|---:|---:|---:|",
    ]
    for label in values[0]:
        a, b = (statistics.median(v[label]) for v in values)
        lines.append(
            f"| {label} | {_figure(a)} ({len(values[0][label])}) "
            f"| {_figure(b)} ({len(values[1][label])}) | {b / a:.3g} |"
        )
    return "\n".join(lines)


def _figure(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("rev_a", help="the revision before (any git revision)")
    parser.add_argument("rev_b", help="the revision after")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each, alternating")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "ab_results.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tsi-ab-") as tmp:
        trees = (Path(tmp) / "a", Path(tmp) / "b")
        try:
            commits = tuple(
                checkout(rev, tree)
                for rev, tree in zip((args.rev_a, args.rev_b), trees, strict=True)
            )
            log(f"built {commits[0]} and {commits[1]}")
            runs: tuple[list, list] = ([], [])
            with broker() as bk:
                for round_ in range(args.rounds):
                    for side, tree in enumerate(trees):
                        log(f"round {round_ + 1} of {args.rounds}: {commits[side]}")
                        out = Path(tmp) / f"{side}-{round_}.json"
                        runs[side].append(throughput(tree, bk.bootstrap, out))
        finally:
            for tree in trees:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(tree)],
                    cwd=ROOT,
                    check=False,
                    stderr=subprocess.DEVNULL,
                )
    values = (repeats(runs[0]), repeats(runs[1]))
    print(report(commits, values))
    args.out.write_text(json.dumps({"commits": commits, "repeats": values}, indent=1) + "\n")
    log(f"raw repeats written to {args.out}")


if __name__ == "__main__":
    main()

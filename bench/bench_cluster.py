"""The service as deployed in one process and as a cluster of several, on the same input.

Run from the repository root (about 4 minutes; it starts the project's broker unless
``KAFKA_BOOTSTRAP_SERVERS`` is set)::

    .venv/bin/python bench/bench_cluster.py       # raw figures in bench/cluster_results.json

``bench_flow.py`` measures one process against references doing the service's work. A
cluster spreads the shards over its processes (``-i``/``-a``, one worker each): each
process reads some of the input partitions and hands every event of a shard it does not
hold to the process that does, pickled (Bytewax's exchange). Each round runs the Python
reference (``bench_flow.run_reference``: every input consumed, one answer per request,
pipelined; two hops for the default two-topic setup, as its internal topic makes it) and
then the service as 1, 2, ... processes (``bench_flow.run_deployed``: tail mode, no
recovery, the combined events topic and the default two-topic setup); the figures are
each round's steady events/s and their ratio to that round's reference, medians over the
rounds (every round counted). On a host whose cores the broker and the load share, a second
process competes with them: read the figures with the machine they were measured on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from bench_flow import (  # noqa: E402
    bench_session,
    log,
    machine_info,
    prepare_input,
    run_deployed,
    run_reference,
)

MODES = {"events": "combined events topic", "separate": "default two-topic setup"}


def measure(requests: int, units: int, rounds: int, sizes: tuple[int, ...]) -> dict[str, Any]:
    """Per mode, each round's passthrough and service rates, and the medians."""
    results: dict[str, Any] = {"requests": requests, "units": units, "rounds": rounds}
    with bench_session() as (bk, workdir, registry_path, counter):
        results["machine"] = machine_info(bk)
        for mode in MODES:
            inp = prepare_input(bk, mode, requests, units)
            runs = []
            for k in range(rounds):
                hops = 2 if mode == "separate" else 1
                ceiling = run_reference(bk, inp, counter, "python", hops)
                run = {"passthrough": ceiling}
                for n in sizes:
                    deployed = run_deployed(bk, inp, counter, registry_path, workdir, n)
                    run[n] = deployed["events_per_s"]
                log(
                    f"{mode} round {k + 1}: reference {ceiling:,.0f}; "
                    + "; ".join(f"{n} x {run[n]:,.0f} ({run[n] / ceiling:.2f})" for n in sizes)
                )
                runs.append(run)
            results[mode] = {
                "runs": runs,
                "passthrough_events_per_s": statistics.median(r["passthrough"] for r in runs),
                "events_per_s": {n: statistics.median(r[n] for r in runs) for n in sizes},
                "ratio_to_passthrough": {
                    n: statistics.median(r[n] / r["passthrough"] for r in runs) for n in sizes
                },
            }
    return results


def report(results: dict[str, Any], sizes: tuple[int, ...]) -> str:
    m = results["machine"]
    lines = [
        f"{results['requests']:,} requests + their feedback, {results['units']:,} units; "
        f"medians of {results['rounds']} rounds; {m['cpu_model']}, {m['usable_cpus']} cores, "
        f"Python {m['python']}, Bytewax {m['bytewax']}, confluent-kafka {m['confluent_kafka']}, "
        f"at {m['git_commit']}",
        "",
        "| setup | Python reference, events/s | "
        + " | ".join(f"{n} process{'es' if n > 1 else ''}" for n in sizes)
        + " |",
        "|---|---:|" + "---:|" * len(sizes),
    ]
    for mode, name in MODES.items():
        r = results[mode]
        cells = [f"{r['events_per_s'][n]:,.0f} ({r['ratio_to_passthrough'][n]:.2f})" for n in sizes]
        ceiling = f"{r['passthrough_events_per_s']:,.0f}"
        lines.append(f"| {name} | {ceiling} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--units", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", default="1,2", help="cluster sizes, e.g. 1,2,3")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "cluster_results.json")
    args = parser.parse_args()
    try:
        sizes = tuple(int(n) for n in args.processes.split(","))
    except ValueError:
        parser.error(f"--processes takes numbers such as 1,2, got {args.processes!r}")
    if not sizes or min(sizes) < 1:
        parser.error(f"--processes takes numbers >= 1, got {args.processes!r}")
    results = measure(args.requests, args.units, args.rounds, sizes)
    print(report(results, sizes))
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    log(f"raw results written to {args.out}")


if __name__ == "__main__":
    main()

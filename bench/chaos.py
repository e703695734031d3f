"""The fault campaign for minutes: members 1 to 3 serve clients on a broker of its own
while random faults strike (a member killed -9, also while it restores; a directory
lost; a rescale by restart; the broker killed -9 and started again, or paused), then
every request, answer, feedback and instance is checked (``tests/service/chaos.py``).

Run from the repository root, one campaign per seed (a broker each)::

    .venv/bin/python bench/chaos.py --minutes 30 --seeds 1 2 3

Each seed prints one JSON line: the counts that must be 0 (unanswered, changed answers,
lost or extra rounds and updates, instances unlike an uninterrupted run), dead letters
by reason, members that stopped on their own, and the faults in order. The exit status
is 1 when any seed found something.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.testing.kafka_broker import start_broker, stop_broker
from tests.service.chaos import FAULTS, Campaign, Verdict


def campaign(seed: int, seconds: float, pace: float, max_members: int) -> Verdict:
    """One seed's campaign on a broker of its own."""
    with tempfile.TemporaryDirectory(prefix="tsi-chaos-") as tmp:
        broker_dir, work = Path(tmp) / "kafka", Path(tmp) / "work"
        broker_dir.mkdir()
        work.mkdir()
        bootstrap = start_broker(broker_dir)
        try:
            run = Campaign(bootstrap, broker_dir, work, seed, seconds, pace, max_members)
            return run.run()
        finally:
            stop_broker(broker_dir)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="Faults for this long.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1], help="One run each.")
    parser.add_argument("--pace", type=float, default=0.02, help="Seconds between requests.")
    parser.add_argument("--max-members", type=int, default=3, choices=[1, 2, 3])
    args = parser.parse_args()
    found = False
    for seed in args.seeds:
        began = time.monotonic()
        verdict = campaign(seed, args.minutes * 60, args.pace, args.max_members)
        line = {"seed": seed, "clean": verdict.clean(), **dataclasses.asdict(verdict)}
        line["wall_s"] = round(time.monotonic() - began)
        line["fault_counts"] = {f: sum(s.endswith(f" {f}") for s in verdict.faults) for f in FAULTS}
        print(orjson.dumps(line).decode(), flush=True)
        found |= not verdict.clean()
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())

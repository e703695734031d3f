"""What an epoch's close costs the shards with recovery: a pause every answer waits for.

Run from the repository root (under a minute)::

    .venv/bin/python bench/bench_close.py

``DEFAULT_SHARDS`` (128) shards with a shard store (``flows.service.shards.shard_log``),
held by their key groups (``GroupLogic``, one per Bytewax key), are fed as the dataflow
feeds them, one item per group, on
``bench_engine``'s workload (10 arms, per-unit instances over 10,000 units, each
request followed by its feedback, batches of 1,000 messages). An epoch serves
``PAIRS`` requests and their feedback: the first half before a generation turns
(a second passes: the calls after the turn do what they do then, until nothing is left
for them), the second half after it. Then every shard's ``snapshot()``, the close, is
timed (wall clock, all of them), with the instances it found changed: every group's
``snapshot()``, which waits once for its shards' changelog acknowledgements. Median of ``REPEATS``
epochs on the same shards, after one epoch of warm-up. No Kafka, no Bytewax.
``--changelog``: each shard's log mirrored to an in-memory changelog
(``flows.service.shards.changelog.MemoryChangelog``): what the mirror costs the shards
themselves, without the broker's round trip. ``--kafka``: mirrored to a changelog topic on
a real broker (``KAFKA_BOOTSTRAP_SERVERS``, else one started as the tests start theirs,
``flows.testing.kafka_broker``): the close then waits for the broker's acknowledgements.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from bench_engine import BATCH, messages  # noqa: E402

from flows.service.dataflow import Guards, parse_and_route  # noqa: E402
from flows.service.instances.registry import LiveRegistry, Registry  # noqa: E402
from flows.service.observe.stream_clock import StreamClock  # noqa: E402
from flows.service.runtime.gc_freezer import freeze_long_lived  # noqa: E402
from flows.service.shards.changelog import Changelog, MemoryChangelog  # noqa: E402
from flows.service.shards.deadlines import WakeUpScheduler  # noqa: E402
from flows.service.shards.group_logic import GroupLogic  # noqa: E402
from flows.service.shards.logic import FlowContext  # noqa: E402
from flows.service.wire.events import Origin, parse_event  # noqa: E402
from flows.service.wire.keys import DEFAULT_SHARDS  # noqa: E402

PAIRS = 12_000  # requests and their feedback in an epoch: ~10,000 instances changed
REPEATS = 5


class Shards:
    """The shards of one flow over a store directory, held by their key groups, fed in
    batches."""

    def __init__(
        self, store: Path, registry: LiveRegistry, changelog: Changelog | None = None
    ) -> None:
        self.registry = registry
        self.context = FlowContext(
            registry,
            snapshots=True,
            stream=StreamClock(),
            wake_ups=WakeUpScheduler(),
            store=store,
            changelog=changelog,
        )
        self.groups: dict[str, GroupLogic] = {}
        self.offset = 0

    def feed(self, msgs: list[tuple[bytes, str]]) -> None:
        now = time.time()
        for start in range(0, len(msgs), BATCH):
            batch = []
            for raw, _ in msgs[start : start + BATCH]:
                batch.append((raw, Origin("events", 0, self.offset, now)))
                self.offset += 1
            groups, _ = parse_and_route(parse_event, Guards(), self.registry, batch)
            for group, parts in groups:
                logic = self.groups.get(group)
                if logic is None:
                    logic = self.groups[group] = GroupLogic(self.context)
                logic.on_batch([parts])

    def turn(self) -> None:
        """A generation turns in every shard (as after a second), and the calls that
        follow do their work until none is left (as the service's calls do)."""
        for group in self.groups.values():
            for logic in group.shards.values():
                logic.store.generations.turned = float("-inf")
                logic.handle([])
                generations = logic.store.generations
                while generations.unwritten or generations.saved or generations.settling:
                    logic.handle([])

    def close(self) -> tuple[float, int]:
        """Seconds of every group's snapshot, and the instances they found changed."""
        stores = [s.store for group in self.groups.values() for s in group.shards.values()]
        changed = sum(
            len(store.touched | store.generations.cooling | set(store.generations.settling))
            for store in stores
        )
        started = time.perf_counter()
        for group in self.groups.values():
            group.snapshot()
        return time.perf_counter() - started, changed


def kafka_changelog(stack: contextlib.ExitStack, scratch: Path) -> Changelog:
    """A changelog topic (one partition a shard) on ``KAFKA_BOOTSTRAP_SERVERS``, or on a
    broker started for the run (stopped when ``stack`` closes)."""
    from flows.service.connectors.kafka_admin import create_topics
    from flows.service.connectors.kafka_changelog import KafkaChangelog
    from flows.testing.kafka_broker import broker_session, unique_topic

    session = broker_session(scratch / "kafka")
    bootstrap = next(session)
    stack.callback(session.close)
    topic = unique_topic("bench-changelog")
    create_topics([bootstrap], {}, [topic], changelog=(topic, DEFAULT_SHARDS))
    return KafkaChangelog([bootstrap], topic)


def epoch(shards: Shards, msgs: list[tuple[bytes, str]]) -> tuple[float, int]:
    half = len(msgs) // 2
    shards.feed(msgs[:half])
    shards.turn()
    shards.feed(msgs[half:])
    return shards.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=PAIRS)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--changelog", action="store_true", help="mirror to a changelog")
    parser.add_argument("--kafka", action="store_true", help="the changelog on a broker")
    args = parser.parse_args()
    from flow_plan import registry_toml

    msgs = messages("events", args.pairs)
    freeze_long_lived()
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(tempfile.TemporaryDirectory(prefix="tsi-bench-close-"))
        changelog: Changelog | None = MemoryChangelog() if args.changelog else None
        if args.kafka:
            changelog = kafka_changelog(stack, Path(store))
        registry = LiveRegistry(Registry.from_toml(registry_toml()))
        shards = Shards(Path(store) / "shards", registry, changelog)
        shards.feed(msgs)
        shards.close()  # the bases
        shards.turn()
        epoch(shards, msgs)  # warm-up
        runs = []
        for _ in range(args.repeats):
            shards.turn()
            runs.append(epoch(shards, msgs))
    seconds = [s for s, _ in runs]
    changed = statistics.median(n for _, n in runs)
    print("## An epoch's close with recovery (`bench/bench_close.py`)\n")
    print(
        f"- {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python ", end=""
    )
    print(f"{platform.python_version()}; load average {os.getloadavg()[0]:.2f}")
    print(f"- {args.pairs:,} requests and their feedback an epoch, a generation turning halfway")
    if args.changelog:
        print("- each shard's log mirrored to an in-memory changelog (`--changelog`)")
    if args.kafka:
        print("- each shard's log mirrored to a changelog topic on a local broker (`--kafka`)")
    print(
        f"- the close of {DEFAULT_SHARDS} shards: "
        f"**{statistics.median(seconds) * 1e3:.1f} ms** (median of "
        f"{args.repeats}; runs {', '.join(f'{s * 1e3:.1f}' for s in seconds)}), "
        f"{changed:,.0f} instances changed"
    )


if __name__ == "__main__":
    main()

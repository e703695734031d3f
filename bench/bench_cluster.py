"""The service as 1, 2, 4, 8 members (``tsi run --members N --member K``) against the same
run's reference: does its throughput grow with its processes?

Run from the repository root (it starts the project's broker unless
``KAFKA_BOOTSTRAP_SERVERS`` is set)::

    .venv/bin/python bench/bench_cluster.py                 # sizes as the cores allow
    .venv/bin/python bench/bench_cluster.py --sizes 1,2,4,8 --java-home jre --kafka-jars kafka

Each round produces the workload (requests, then their feedback, on the two input
topics, ``--partitions`` each) and runs on it the Python reference
(``flow_throughput.run_reference``: every input consumed, one answer per request, through an
internal topic: the service's two hops) and the service as each size of members, each
member one process with one worker, run as users run it (``tsi run --recovery-dir DIR``:
a fresh recovery directory per member and run, the default snapshot interval, the
changelog on, a fresh changelog topic per run that the members create at start-up;
``DEFAULT_SHARDS`` shards, the internal topic of ``shard_count.internal_partitions``
partitions, as ``tsi topics create`` makes it; ``--no-recovery``: the lighter variant,
no recovery directory and so no changelog). The reference is
timed from its first answer to its last (Kafka timestamps); members start one after the
other and run independently, so each member is timed from its own first answer to its
last (``member_rates``) and the service's rate is the sum of its members'. Figures:
medians over the rounds of events/s, the ratio to the reference, and the ratio to linear
(N members against N x one member of the same round), and the recovery directories'
peak disk use (sampled while the members run, and once they stopped). Each member takes
a core, and the broker and the load want theirs: the default sizes are the powers of 2 up to
min(8, cores // 2); on a host with fewer cores than that, a member running while another
starts has more CPU than its share, and the sum overstates.

On a machine without network or Java: ``--java-home DIR`` (a Java runtime, e.g. the
``jlink`` one ``bench/cluster_bundle.sh`` makes) and ``--kafka-jars DIR`` (the broker's
jars in ``DIR/lib``, as ``deploy/kafka/fetch.sh`` keeps them) start the broker offline.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition  # noqa: E402
from flow_kafka import (  # noqa: E402
    bulk_producer,
    log,
    produce_all,
)
from flow_report import machine_info  # noqa: E402
from flow_service import bench_session, check_alive, service_process  # noqa: E402
from flow_throughput import Input, run_reference  # noqa: E402
from flow_workload import workload  # noqa: E402

from flows.service.connectors.members import Members  # noqa: E402
from flows.service.runtime.shard_count import internal_partitions  # noqa: E402
from flows.service.wire.keys import DEFAULT_SHARDS, shard_index  # noqa: E402
from flows.testing import kafka_broker  # noqa: E402

#: each member: ``tsi run``, one worker (``--members``/``--member`` and the recovery
#: options added by ``member_args``)
MEMBER = ("-m", "flows.cli", "run")

#: the commit a bundle (``cluster_bundle.sh``, no git) was built from
BUNDLED_COMMIT = ROOT / "COMMIT"

#: the internal topic's partitions, as ``tsi topics create`` gives a new one
INTERNAL_PARTITIONS = internal_partitions(None, DEFAULT_SHARDS)


def member_args(members: int, member: int, recovery: Path | None, changelog: str) -> tuple:
    """``tsi run``'s arguments for member ``member`` of ``members``: with ``recovery`` (a
    fresh directory) and the changelog topic ``changelog``, as users run it; without,
    ``--no-recovery`` (no changelog either).

    >>> member_args(2, 1, None, "c")[3:]
    ('--members', '2', '--member', '1', '--no-recovery')
    >>> member_args(2, 0, Path("/r"), "c")[7:]
    ('--recovery-dir', '/r', '--changelog-topic', 'c')
    """
    mode = (
        ("--no-recovery",)
        if recovery is None
        else ("--recovery-dir", str(recovery), "--changelog-topic", changelog)
    )
    return (*MEMBER, "--members", str(members), "--member", str(member), *mode)


def member_of(key: str, members: tuple[Members, ...]) -> int:
    """The index of the member holding instance key ``key``'s shard (the service's rule,
    ``Members.holds``, with the internal topic of ``INTERNAL_PARTITIONS``).

    >>> group = tuple(Members(2, k) for k in range(2))
    >>> sorted({member_of(f"home\x1fu{u}", group) for u in range(50)})
    [0, 1]
    """
    shard = shard_index(key, DEFAULT_SHARDS)
    [member] = [m.index for m in members if m.holds(shard, INTERNAL_PARTITIONS)]
    return member


def disk_use(paths: list[Path]) -> int:
    """Bytes of the files under ``paths`` (missing ones count 0)."""
    total = 0
    for path in paths:
        for parent, _, files in os.walk(path):
            for name in files:
                with contextlib.suppress(FileNotFoundError):
                    total += os.stat(os.path.join(parent, name)).st_size
    return total


def default_sizes(cores: int) -> tuple[int, ...]:
    """Powers of 2 up to min(8, cores // 2), at least 1 member.

    >>> default_sizes(2), default_sizes(16), default_sizes(64)
    ((1,), (1, 2, 4, 8), (1, 2, 4, 8))
    """
    top, sizes = max(1, min(8, cores // 2)), [1]
    while sizes[-1] * 2 <= top:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


def topics_of(bootstrap: str, kinds: tuple[str, ...], partitions: int) -> dict[str, str]:
    """Fresh topics of ``partitions`` partitions (the dead-letter topic one)."""
    names = {}
    for kind in kinds:
        name = kafka_broker.unique_topic(f"bench-{kind}")
        kafka_broker.create_topic(bootstrap, name, 1 if kind == "dlq" else partitions)
        names[kind] = name
    return names


def count(consumer: Any, topic: str, partitions: int) -> int:
    """Messages in ``topic`` (its high watermarks; a fresh topic starts at 0)."""
    return sum(
        consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
        for p in range(partitions)
    )


def member_rates(bootstrap: str, topic: str, partitions: int, members: int) -> list[float]:
    """Each member's steady events/s: the answers of ``topic`` told apart by member (an
    answer's instance key names its shard, held by one member: ``member_of``),
    two input events each (a request and its feedback, served by the same member), over
    the time from the member's first answer to its last (Kafka timestamps)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tsi-bench-unused"})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    ends = [consumer.get_watermark_offsets(TopicPartition(topic, p))[1] for p in range(partitions)]
    group = tuple(Members(members, k) for k in range(members))
    stamps: dict[int, list[int]] = {k: [] for k in range(members)}
    read = 0
    try:
        while read < sum(ends):
            for m in consumer.consume(10_000, 1.0):
                if not m.error():
                    read += 1
                    stamps[member_of(m.key().decode(), group)].append(m.timestamp()[1])
    finally:
        consumer.close()
    return [2 * len(t) / ((max(t) - min(t)) / 1000.0) for t in stamps.values()]


def run_members(
    bk: Any,
    inp: Input,
    partitions: int,
    registry: Path,
    workdir: Path,
    members: int,
    recovery: bool = True,
) -> tuple[float, int]:
    """The service as ``members`` members on ``inp`` (``partitions`` per topic), each with
    a fresh recovery directory and the run's changelog topic (``recovery``), else
    ``--no-recovery``: the sum of its members' steady events/s (``member_rates``) and the
    recovery directories' peak bytes together (0 without)."""
    out = topics_of(bk.bootstrap, ("sel", "dlq"), partitions)
    internal = topics_of(bk.bootstrap, ("internal",), INTERNAL_PARTITIONS)["internal"]
    changelog = kafka_broker.unique_topic("bench-changelog")  # made by the members
    group = f"bench-{uuid.uuid4().hex[:12]}"
    requests = inp.events // 2
    counter = Consumer({"bootstrap.servers": bk.bootstrap, "group.id": "tsi-bench"})
    dirs: list[Path] = []
    peak = 0
    with contextlib.ExitStack() as stack:
        procs = []
        for k in range(members):
            logfile = workdir / f"member-{uuid.uuid4().hex[:8]}-{k}.log"
            directory = logfile.with_suffix(".recovery") if recovery else None
            dirs += [directory] if directory else []
            args = member_args(members, k, directory, changelog)
            topics = {**inp.topics, **out}
            proc = service_process(bk, args, topics, registry, logfile, internal, group)
            procs.append((stack.enter_context(proc), logfile))
        deadline = time.perf_counter() + 600
        while count(counter, out["sel"], partitions) < requests:
            for proc, logfile in procs:
                check_alive(proc, logfile)
            if time.perf_counter() > deadline:
                answered = count(counter, out["sel"], partitions)
                raise TimeoutError(f"{members} members answered {answered}")
            peak = max(peak, disk_use(dirs))
            time.sleep(0.2)
    peak = max(peak, disk_use(dirs))  # once stopped
    dead = count(counter, out["dlq"], 1)
    counter.close()
    if dead:
        log(f"  WARNING: {members} members wrote {dead} dead letters")
    return sum(member_rates(bk.bootstrap, out["sel"], partitions, members)), peak


def prepare(bk: Any, requests: int, units: int, partitions: int) -> Input:
    """The two input topics, ``partitions`` each, holding the workload."""
    topics = topics_of(bk.bootstrap, ("requests", "feedback"), partitions)
    events = produce_all(bulk_producer(bk.bootstrap), workload(topics, requests, units))
    return Input("separate", topics, events)


def measure(args: argparse.Namespace, sizes: tuple[int, ...]) -> dict[str, Any]:
    """Each round's reference and members' rates, and their medians."""
    results: dict[str, Any] = {
        "requests": args.requests,
        "units": args.units,
        "rounds": args.rounds,
        "partitions": args.partitions,
        "sizes": sizes,
        "recovery": args.recovery,
        "shards": DEFAULT_SHARDS,
        "internal_partitions": INTERNAL_PARTITIONS,
    }
    with bench_session() as (bk, workdir, registry_path, counter):
        results["machine"] = machine_info(bk)
        if not results["machine"]["git_commit"] and BUNDLED_COMMIT.exists():  # a bundle
            results["machine"]["git_commit"] = BUNDLED_COMMIT.read_text().strip()
        runs = []
        for k in range(args.rounds):
            inp = prepare(bk, args.requests, args.units, args.partitions)
            run = {"reference": run_reference(bk, inp, counter, "python", 2)}
            for n in sizes:
                run[n], run[f"disk_{n}"] = run_members(
                    bk, inp, args.partitions, registry_path, workdir, n, args.recovery
                )
            log(
                f"round {k + 1}: reference {run['reference']:,.0f}; "
                + "; ".join(
                    f"{n} x {run[n]:,.0f} ({run[f'disk_{n}'] / 2**20:.1f} MiB)" for n in sizes
                )
            )
            runs.append(run)
    results["runs"] = runs
    results["events_per_s"] = {n: statistics.median(r[n] for r in runs) for n in sizes}
    results["peak_disk_bytes"] = {n: max(r[f"disk_{n}"] for r in runs) for n in sizes}
    results["reference_events_per_s"] = statistics.median(r["reference"] for r in runs)
    results["ratio_to_reference"] = {
        n: statistics.median(r[n] / r["reference"] for r in runs) for n in sizes
    }
    results["ratio_to_linear"] = {
        n: statistics.median(r[n] / (n * r[sizes[0]] / sizes[0]) for r in runs) for n in sizes
    }
    return results


def report(results: dict[str, Any]) -> str:
    m, sizes = results["machine"], results["sizes"]
    how = (
        "a fresh recovery directory per member, the changelog on"
        if results["recovery"]
        else "--no-recovery"
    )
    lines = [
        f"{results['requests']:,} requests + their feedback, {results['units']:,} units, "
        f"{results['partitions']} input partitions, {results['shards']} shards, internal "
        f"topic of {results['internal_partitions']}, {how}; medians of "
        f"{results['rounds']} rounds; "
        f"{m['cpu_model']}, {m['usable_cpus']} cores, Python {m['python']}, Bytewax "
        f"{m['bytewax']}, at {m['git_commit']}, load average "
        f"{m['load_average_at_start'][0]:.1f} at the start",
        "",
        "| members | events/s | ratio to the reference | ratio to linear | recovery "
        "directories' peak, MiB |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in sizes:
        disk = f"{results['peak_disk_bytes'][n] / 2**20:.1f}" if results["recovery"] else "-"
        lines.append(
            f"| {n} | {results['events_per_s'][n]:,.0f} | "
            f"{results['ratio_to_reference'][n]:.2f} | {results['ratio_to_linear'][n]:.2f} | "
            f"{disk} |"
        )
    lines.append(
        f"| reference (Python, two hops) | {results['reference_events_per_s']:,.0f} | | | |"
    )
    return "\n".join(lines)


def offline_broker(java_home: Path | None, kafka_jars: Path | None) -> None:
    """Start the broker with this Java runtime and these jars (``deploy/kafka`` reads
    ``JAVA_HOME`` and its jar cache ``TSI_KAFKA_CACHE``), from ``deploy/kafka`` beside this
    script when the installed project has none."""
    if java_home is not None:
        if not (java_home / "bin" / "java").exists():
            raise SystemExit(f"--java-home {java_home}: no bin/java there")
        os.environ["JAVA_HOME"] = str(java_home.resolve())
        os.environ["PATH"] = f"{java_home.resolve() / 'bin'}{os.pathsep}{os.environ['PATH']}"
    if not kafka_broker.KAFKA_DIR.exists():  # the project installed from its wheel (a bundle)
        kafka_broker.KAFKA_DIR = ROOT / "deploy" / "kafka"
    if kafka_jars is not None:
        if not (kafka_jars / "lib" / ".complete").exists():
            raise SystemExit(f"--kafka-jars {kafka_jars}: no lib/ of jars made by fetch.sh")
        os.environ["TSI_KAFKA_CACHE"] = str(kafka_jars.resolve())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--units", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", help="members, e.g. 1,2,4,8 (default: as the cores allow)")
    parser.add_argument("--partitions", type=int, default=8, help="of each input topic")
    parser.add_argument(
        "--no-recovery",
        dest="recovery",
        action="store_false",
        help="the lighter variant: members without a recovery directory (nor changelog)",
    )
    parser.add_argument("--java-home", type=Path, help="a Java runtime (bin/java)")
    parser.add_argument("--kafka-jars", type=Path, help="the broker's jars (DIR/lib)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "cluster_results.json")
    args = parser.parse_args()
    try:
        sizes = (
            tuple(int(n) for n in args.sizes.split(","))
            if args.sizes
            else default_sizes(len(os.sched_getaffinity(0)))
        )
    except ValueError:
        parser.error(f"--sizes takes numbers such as 1,2,4, got {args.sizes!r}")
    if not sizes or min(sizes) < 1 or max(sizes) > args.partitions:
        parser.error(f"--sizes takes numbers from 1 to --partitions, got {sizes}")
    offline_broker(args.java_home, args.kafka_jars)
    results = measure(args, sizes)
    print(report(results))
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    log(f"raw results written to {args.out}")


if __name__ == "__main__":
    main()

"""Operating ``tsi run`` on the real broker: what it checks at start, how an operator gets
out of a stuck offset, registry changes live and across restarts, running without a
recovery store, readiness, and what a crash prints."""

import base64
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from flows.service.connectors.kafka_admin import group_offsets
from flows.testing.kafka_broker import consume_all, create_topic, free_port, unique_topic
from tests.waiting import wait_for

TSI = str(Path(sys.executable).parent / "tsi")
SHOP = """
[experiments.shop]
arms = [{arms}]
per_unit = true
feedback_ttl = 600
{extra}
"""


def shop(arms, extra=""):
    return SHOP.format(arms=", ".join(f'"{a}"' for a in arms), extra=extra)


def tsi(*args, timeout=120, env=None):
    """``tsi ARGS`` as an operator runs it, to the end."""
    return subprocess.run(
        [TSI, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env
    )


def start(*args, log_file=None):
    """``tsi run ARGS`` in the background (stderr captured)."""
    extra = ["--log-file", str(log_file)] if log_file else []
    return subprocess.Popen(
        [TSI, "run", *map(str, args), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def produce(bootstrap, topic, events):
    producer = Producer({"bootstrap.servers": bootstrap})
    for event in events:
        key = f"{event['experiment']}\x1f{event.get('unit', '')}"
        producer.produce(topic, orjson.dumps(event), key=key)
    assert producer.flush(30) == 0


def requests(ids, unit="u1", experiment="shop"):
    return [
        {"type": "request", "experiment": experiment, "unit": unit, "request_id": rid}
        for rid in ids
    ]


def messages(bootstrap, topic):
    return [orjson.loads(v) for part in consume_all(bootstrap, topic).values() for _, v, _ in part]


def ready(port: int) -> bool:
    """Whether the service's ``/ready`` answers 200 on ``port``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


def committed(bootstrap, group, topic):
    """The offset ``group`` committed on partition 0 of ``topic`` (None: nothing yet)."""
    return group_offsets([bootstrap], {}, group, [topic]).get((topic, 0))


def service_topics(bootstrap, partitions=2):
    names = {n: unique_topic(n) for n in ("ev", "sel", "dlq")}
    for name in names.values():
        create_topic(bootstrap, name, partitions)
    return names


def run_args(bootstrap, names, registry, *more):
    return [
        *("--registry", registry, "--brokers", bootstrap, "--events-topic", names["ev"]),
        *("--selections-topic", names["sel"], "--dlq-topic", names["dlq"]),
        *("--snapshot-every", "0.5", "--connect-timeout", "5"),
        *more,
    ]


def test_startup_names_a_missing_output_topic_and_tsi_topics_create_fixes_it(
    kafka_bootstrap, tmp_path
):
    registry = tmp_path / "registry.toml"
    registry.write_text(shop("ab"))
    names = {n: unique_topic(n) for n in ("ev", "sel", "dlq")}
    create_topic(kafka_bootstrap, names["ev"], 2)  # the input exists, the outputs do not
    args = run_args(kafka_bootstrap, names, registry, "--no-recovery", "--stop-at-end")
    done = tsi("run", *args)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert names["sel"] in done.stderr and names["dlq"] in done.stderr
    assert "tsi topics create" in done.stderr
    topic_args = ["--events-topic", names["ev"], "--selections-topic", names["sel"]]
    made = tsi(
        "topics",
        "create",
        "--brokers",
        kafka_bootstrap,
        *topic_args,
        "--dlq-topic",
        names["dlq"],
        "--partitions",
        "2",
    )
    assert made.returncode == 0, made.stderr
    recovery = tmp_path / "recovery"
    produce(kafka_bootstrap, names["ev"], requests(["r1", "r2"]))
    args = run_args(kafka_bootstrap, names, registry, "--recovery-dir", recovery, "--stop-at-end")
    done = tsi("run", *args)
    assert done.returncode == 0, done.stderr
    assert {s["request_id"] for s in messages(kafka_bootstrap, names["sel"])} == {"r1", "r2"}


def test_an_operator_skips_an_offset_and_the_skip_is_a_dead_letter(kafka_bootstrap, tmp_path):
    registry = tmp_path / "registry.toml"
    registry.write_text(shop("ab"))
    names = service_topics(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, names["ev"], requests(["r0", "r1", "r2"]))
    skip = f"{names['ev']}:0:1"
    args = run_args(
        kafka_bootstrap, names, registry, "--recovery-dir", tmp_path / "rec", "--stop-at-end"
    )
    done = tsi("run", *args, "--skip-offset", skip)
    assert done.returncode == 0, done.stderr
    assert {s["request_id"] for s in messages(kafka_bootstrap, names["sel"])} == {"r0", "r2"}
    [letter] = messages(kafka_bootstrap, names["dlq"])
    assert (letter["reason"], letter["offset"]) == ("skipped", 1)
    assert orjson.loads(base64.b64decode(letter["raw_b64"]))["request_id"] == "r1"


def test_the_registry_changes_live_and_across_kill_9_without_a_crash(kafka_bootstrap, tmp_path):
    registry = tmp_path / "registry.toml"
    registry.write_text(shop("abcd"))
    names = service_topics(kafka_bootstrap)
    port = free_port()
    recovery = tmp_path / "recovery"
    args = run_args(
        kafka_bootstrap, names, registry, "--recovery-dir", recovery, "--metrics-port", port
    )

    def answered(prefix):
        return {
            s["request_id"]: s["arm_name"]
            for s in messages(kafka_bootstrap, names["sel"])
            if s["request_id"].startswith(prefix)
        }

    units = [f"u{i}" for i in range(8)]
    log = tmp_path / "run.log"
    proc = start(*args, log_file=log)
    try:
        for unit in units:  # each user learns; some tickets stay open
            produce(
                kafka_bootstrap, names["ev"], requests([f"a-{unit}-{i}" for i in range(6)], unit)
            )
        wait_for(lambda: len(answered("a-")) == 48, proc)
        wait_for(lambda: ready(port), proc, what="readiness")
        # live: arm 'e' appended, 'b' renamed 'lime'; SIGHUP, applied at the next epoch
        registry.write_text(shop(["a", "lime", "c", "d", "e"], 'renamed_arms = { b = "lime" }'))
        proc.send_signal(signal.SIGHUP)
        in_force = "the reloaded registry is now in force"
        wait_for(lambda: in_force in log.read_text(), proc, what="the reload in force")
        for unit in units:
            produce(
                kafka_bootstrap, names["ev"], requests([f"b-{unit}-{i}" for i in range(10)], unit)
            )
        wait_for(lambda: len(answered("b-")) == 80, proc)
        assert set(answered("b-").values()) <= {"a", "lime", "c", "d", "e"}
        assert "lime" in answered("b-").values()
        assert "reloaded, applied when the current epoch closes: edited 'shop'" in log.read_text()
        # a misspelt header ([experiment.shop]) would drop 'shop': refused, 'shop' stays
        live = shop(["a", "lime", "c", "d", "e"], 'renamed_arms = { b = "lime" }')
        other = '[experiments.other]\narms = ["x"]\n'
        registry.write_text(other + live.replace("[experiments.shop]", "[experiment.shop]"))
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "unknown table [experiment]" in log.read_text(), proc, seconds=10)
        [refused] = [line for line in log.read_text().splitlines() if "reload refused" in line]
        assert "running registry stays: unknown table [experiment] (did you mean" in refused
        # deliberate period: an epoch closes with nothing pending; the answers after it are
        # checked against the running arms, which hold whether or not it closed
        time.sleep(1.0)
        produce(kafka_bootstrap, names["ev"], [r for u in units for r in requests([f"t-{u}"], u)])
        wait_for(lambda: len(answered("t-")) == 8, proc)
        assert set(answered("t-").values()) <= {"a", "lime", "c", "d", "e"}
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # restart on an edited registry: 'c' retired, the competition changed
    registry.write_text(
        shop(["a", "lime", "d", "e"], 'competition = { kind = "switching", rate = 0.01 }')
    )
    proc = start(*args)
    try:
        for unit in units:
            produce(
                kafka_bootstrap, names["ev"], requests([f"c-{unit}-{i}" for i in range(5)], unit)
            )
        wait_for(lambda: len(answered("c-")) == 40, proc)
        assert set(answered("c-").values()) <= {"a", "lime", "d", "e"}
        # deliberate period for the retired tickets' dead letters: the checks below are
        # subsets (no other reason, no other ticket), true with fewer letters too
        time.sleep(1.5)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    letters = messages(kafka_bootstrap, names["dlq"])
    reasons = {d["reason"] for d in letters}
    assert reasons <= {"arm_retired"}, reasons  # no internal_error, no crash
    retired = {orjson.loads(base64.b64decode(d["raw_b64"]))["request_id"] for d in letters}
    before = {**answered("a-"), **answered("b-"), **answered("t-")}
    assert retired <= {rid for rid, arm in before.items() if arm == "c"}
    # the experiment removed: its instances are archived, its events dead-lettered
    registry.write_text('[experiments.other]\narms = ["x"]\n')
    produce(kafka_bootstrap, names["ev"], requests(["d-1"]))
    proc = start(*args)
    try:
        wait_for(
            lambda: any(
                d["reason"] == "unknown_experiment" for d in messages(kafka_bootstrap, names["dlq"])
            ),
            proc,
        )
        time.sleep(1.5)  # deliberate: nothing happens over a period, the service stays up
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    shown = tsi("inspect", "--recovery-dir", recovery, "--registry", registry, "shop/u1")
    assert shown.returncode == 0 and "archived" in shown.stdout, shown.stderr
    first = tmp_path / "first.toml"
    first.write_text(shop("abcd"))
    assert tsi("inspect", "--recovery-dir", recovery, "--registry", first).returncode == 0


def test_without_recovery_the_input_resumes_from_the_groups_offsets(kafka_bootstrap, tmp_path):
    registry = tmp_path / "registry.toml"
    registry.write_text(shop("ab"))
    names = service_topics(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, names["ev"], requests(["old"]))  # before the group existed
    group = unique_topic("group")
    args = run_args(kafka_bootstrap, names, registry, "--no-recovery", "--group-id", group)
    probes: list[str] = []

    def a_probe_is_answered():
        probes.append(f"probe{len(probes)}")
        produce(kafka_bootstrap, names["ev"], requests(probes[-1:]))
        return any(s["request_id"] in probes for s in messages(kafka_bootstrap, names["sel"]))

    proc = start(*args)
    try:
        # assigned at the end of the topic (a new group has no offsets): a probe answered
        wait_for(a_probe_is_answered, proc)
        produce(kafka_bootstrap, names["ev"], requests([f"r{i}" for i in range(20)]))
        # an epoch's offsets are committed once its answers are written: all served
        end = 1 + len(probes) + 20
        wait_for(lambda: committed(kafka_bootstrap, group, names["ev"]) == end, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    produce(kafka_bootstrap, names["ev"], requests([f"s{i}" for i in range(20)]))
    proc = start(*args)
    try:
        wait_for(lambda: committed(kafka_bootstrap, group, names["ev"]) == end + 20, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    served = [s["request_id"] for s in messages(kafka_bootstrap, names["sel"])]
    answered_probes = [rid for rid in served if rid in probes]  # those sent once it read
    expected = [f"r{i}" for i in range(20)] + [f"s{i}" for i in range(20)] + answered_probes
    assert sorted(served) == sorted(expected)  # nothing before, nothing lost
    assert len(set(served)) == len(served)  # nothing twice


def test_a_crash_prints_one_line_and_where_the_log_is(kafka_bootstrap, tmp_path):
    registry = tmp_path / "registry.toml"
    registry.write_text(shop("ab"))
    names = service_topics(kafka_bootstrap, partitions=1)
    config = tmp_path / "kafka.toml"
    config.write_text("[kafka.producer]\nmessage.timeout.ms = 2000\n")  # a dotted key
    log_file = tmp_path / "run.log"
    port = free_port()
    args = run_args(kafka_bootstrap, names, registry, "--no-recovery", "--kafka-config", config)
    proc = start(*args, "--metrics-port", port, log_file=log_file)
    try:
        wait_for(lambda: ready(port), proc, what="readiness")
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        admin.delete_topics([names["sel"]])[names["sel"]].result(30)
        gone = lambda: names["sel"] not in admin.list_topics(timeout=10).topics  # noqa: E731
        wait_for(gone, proc, 60, "the selections topic deleted")
        produce(kafka_bootstrap, names["ev"], requests(["r1", "r2"]))
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [line for line in err.strip().splitlines() if line]
    assert proc.returncode == 1
    assert len(lines) == 2, err  # the start line and the stop line, nothing else
    assert lines[0].startswith("tsi run: serving") and str(log_file) in lines[0]
    assert lines[1].startswith("tsi run: the service stopped:") and str(log_file) in lines[1]
    assert names["sel"] in lines[1]
    report = log_file.read_text()
    assert "Traceback" in report and "message.timeout.ms=2000" in report
    assert os.path.getsize(log_file) > len(err)


def test_an_emptied_or_stale_recovery_store_is_refused_not_silently_restarted(
    kafka_bootstrap, tmp_path
):
    import shutil

    registry = tmp_path / "registry.toml"
    registry.write_text(shop("ab"))
    names = service_topics(kafka_bootstrap, partitions=1)
    recovery = tmp_path / "recovery"
    args = run_args(
        kafka_bootstrap,
        names,
        registry,
        "--recovery-dir",
        recovery,
        "--stop-at-end",
        "--group-id",
        unique_topic("group"),
        "--no-changelog",  # the changelog-less path: only the group's offsets remain
    )
    produce(kafka_bootstrap, names["ev"], requests([f"r{i}" for i in range(20)]))
    assert tsi("run", *args).returncode == 0
    backup = tmp_path / "backup"
    shutil.copytree(recovery, backup)
    produce(kafka_bootstrap, names["ev"], requests([f"s{i}" for i in range(5)]))
    assert tsi("run", *args).returncode == 0
    shutil.rmtree(recovery)  # the store is lost: starting over would re-emit everything
    done = tsi("run", *args)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "is empty but consumer group" in done.stderr and "--fresh" in done.stderr
    shutil.copytree(backup, recovery)  # an old copy: behind what was processed
    done = tsi("run", *args)
    assert done.returncode == 2 and "is behind consumer group" in done.stderr, done.stderr
    shutil.rmtree(recovery)
    produce(kafka_bootstrap, names["ev"], requests(["t0"]))
    done = tsi("run", *args, "--fresh")  # the reset accepted: from the group's offsets
    assert done.returncode == 0, done.stderr
    served = sorted(s["request_id"] for s in messages(kafka_bootstrap, names["sel"]))
    expected = sorted([f"r{i}" for i in range(20)] + [f"s{i}" for i in range(5)] + ["t0"])
    assert served == expected  # nothing re-emitted, nothing lost


def test_partitions_added_at_run_time_end_the_service_cleanly_and_a_restart_reads_them(
    kafka_bootstrap, tmp_path
):
    from confluent_kafka.admin import NewPartitions

    registry = tmp_path / "registry.toml"
    registry.write_text(shop("ab"))
    names = service_topics(kafka_bootstrap, partitions=1)
    config = tmp_path / "kafka.toml"
    config.write_text("[kafka.consumer]\ntopic.metadata.refresh.interval.ms = 2000\n")
    args = run_args(
        kafka_bootstrap,
        names,
        registry,
        "--recovery-dir",
        tmp_path / "rec",
        "--kafka-config",
        config,
    )
    produce(kafka_bootstrap, names["ev"], requests(["r0", "r1"]))
    proc = start(*args)
    try:
        wait_for(lambda: len(messages(kafka_bootstrap, names["sel"])) == 2, proc)
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        admin.create_partitions([NewPartitions(names["ev"], 3)])[names["ev"]].result(30)
        _, err = proc.communicate(timeout=60)  # it notices and ends by itself
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, err  # a clean end asking to be started again
    assert f"topic {names['ev']} has 3 partitions" in err.strip().splitlines()[-1]
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for partition in (1, 2):  # messages in the new partitions
        event = requests([f"new{partition}"], unit=f"p{partition}")[0]
        producer.produce(names["ev"], orjson.dumps(event), partition=partition)
    assert producer.flush(30) == 0
    done = tsi("run", *args, "--stop-at-end")
    assert done.returncode == 0, done.stderr
    served = sorted(s["request_id"] for s in messages(kafka_bootstrap, names["sel"]))
    assert served == ["new1", "new2", "r0", "r1"]  # read from the new partitions, none twice


def test_several_workers_in_one_process_serve_every_request(kafka_bootstrap, tmp_path):
    # Each worker lists the input's partitions on the same source object: a count summed
    # over the listings (6 for 3) read as "partitions added" and ended the flow at once,
    # which `tsi run` ends with "restart": a loop for any --workers above 1.
    registry = tmp_path / "registry.toml"
    registry.write_text(shop("ab"))
    names = service_topics(kafka_bootstrap, partitions=3)
    ids = [f"r{i}" for i in range(30)]
    events = []
    for i, rid in enumerate(ids):
        [request] = requests([rid], unit=f"u{i % 7}")
        events += [request, {**request, "type": "feedback", "loss": i % 3}]
    produce(kafka_bootstrap, names["ev"], events)
    args = run_args(kafka_bootstrap, names, registry, "--recovery-dir", tmp_path / "rec")
    done = tsi("run", *args, "--workers", "2", "--stop-at-end")
    assert done.returncode == 0, done.stderr
    served = sorted(s["request_id"] for s in messages(kafka_bootstrap, names["sel"]))
    assert served == sorted(ids)
    assert messages(kafka_bootstrap, names["dlq"]) == []

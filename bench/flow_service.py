"""A service in a background process for the benchmarks: started, watched, stopped, waited on until
it answers or its output holds a count."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one
from flow_kafka import Broker, Counter, broker, new_topics
from flow_plan import ROOT, registry_toml


@contextlib.contextmanager
def service_process(
    bk: Broker,
    args: tuple[str, ...],
    topics: dict[str, str],
    registry_path: Path,
    logfile: Path,
    internal: str | None = None,
    group: str | None = None,
) -> Iterator[subprocess.Popen]:
    """The Kafka service in a background process (tail mode), stopped at the end; in the
    two-topic setup with the internal topic ``internal`` (the processes of one cluster
    share it), else a new one; in consumer group ``group``, else a new one."""
    env = dict(
        os.environ,
        TSI_REGISTRY=str(registry_path),
        KAFKA_BOOTSTRAP_SERVERS=bk.bootstrap,
        TSI_TOPIC_SELECTIONS=topics["sel"],
        TSI_TOPIC_DLQ=topics["dlq"],
        # a group of its own: a fresh recovery directory refuses a group with progress
        TSI_GROUP_ID=group or f"bench-{uuid.uuid4().hex[:12]}",
    )
    # and a changelog of its own (with a recovery directory tsi run creates it): one
    # shared with an earlier run would rebuild that run's state
    env["TSI_TOPIC_CHANGELOG"] = f"{env['TSI_GROUP_ID']}-changelog"
    for name in ("TSI_TOPIC_REQUESTS", "TSI_TOPIC_FEEDBACK", "TSI_TOPIC_EVENTS"):
        env.pop(name, None)
    # without recovery the service starts from its (fresh) group's offsets: read from the
    # start, so that what is produced before its consumers are assigned is not skipped
    config = logfile.with_suffix(".kafka.toml")
    config.write_text('[kafka.consumer]\nauto.offset.reset = "earliest"\n')
    env["TSI_KAFKA_CONFIG"] = str(config)
    env.pop("TSI_STOP_AT_END", None)  # tail mode: the service waits for new messages
    if "events" in topics:
        env["TSI_TOPIC_EVENTS"] = topics["events"]
    else:  # the default two-topic setup also needs its internal topic
        env["TSI_TOPIC_REQUESTS"] = topics["requests"]
        env["TSI_TOPIC_FEEDBACK"] = topics["feedback"]
        env["TSI_TOPIC_INTERNAL"] = internal or new_topics(bk.bootstrap, ("internal",))["internal"]
    with open(logfile, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, *args], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield proc
    finally:
        stop_process(proc, 15)


def stop_process(proc: subprocess.Popen, seconds: float) -> None:
    """SIGTERM, and SIGKILL if ``proc`` has not ended ``seconds`` later."""
    proc.terminate()
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(15)


def check_alive(proc: subprocess.Popen, logfile: Path) -> None:
    if proc.poll() is not None:
        tail = logfile.read_text(errors="replace").splitlines()[-20:]
        raise RuntimeError(f"service exited with {proc.returncode}:\n" + "\n".join(tail))


def wait_for(
    counter: Counter, topic: str, target: int, proc: subprocess.Popen, logfile: Path
) -> None:
    last, last_change = -1, time.perf_counter()
    while True:
        n = counter.count(topic)
        if n >= target:
            return
        check_alive(proc, logfile)
        if n != last:
            last, last_change = n, time.perf_counter()
        elif time.perf_counter() - last_change > 60:
            raise TimeoutError(f"{topic}: stuck at {n} of {target} messages for 60 s")
        time.sleep(0.25)


@contextlib.contextmanager
def bench_session() -> Iterator[tuple[Broker, Path, Path, Counter]]:
    """The broker (``broker``), a work directory holding the workload's registry file,
    and a counter of topics, for one bench run; all closed at the end."""
    with tempfile.TemporaryDirectory(prefix="tsi-bench-") as tmp, broker() as bk:
        workdir = Path(tmp)
        registry_path = workdir / "registry.toml"
        registry_path.write_text(registry_toml())
        counter = Counter(bk.bootstrap)
        try:
            yield bk, workdir, registry_path, counter
        finally:
            counter.close()

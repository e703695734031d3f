"""The service as a real ``tsi run`` process on a broker, and its probes, for tests and
benchmarks: the topics made by ``tsi topics create`` (``create_topics``), a start
(``start``), the waits for ``/ready`` (``wait_ready``) and for a load (``wait_served``),
the gauges (``gauges``) and a clean stop (``stop``).

Every name the service uses comes from ``environment``: a unique application id (its
changelog and internal topic are named from it) and unique input and output topics, so
that runs on one broker share nothing.

>>> sorted(k for k in environment("127.0.0.1:9092", "app", "r.toml") if k.startswith("TSI_T"))
['TSI_TOPIC_DLQ', 'TSI_TOPIC_FEEDBACK', 'TSI_TOPIC_REQUESTS', 'TSI_TOPIC_SELECTIONS']
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def environment(bootstrap: str, app: str, registry: str | Path, **extra: str) -> dict[str, str]:
    """The service's environment: broker, registry, application ``app`` and its topics
    (``{app}.requests``, ...), the rest the defaults; ``extra`` on top."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "TSI_REGISTRY": str(registry),
        "TSI_GROUP_ID": app,
        "TSI_TOPIC_REQUESTS": f"{app}.requests",
        "TSI_TOPIC_FEEDBACK": f"{app}.feedback",
        "TSI_TOPIC_SELECTIONS": f"{app}.selections",
        "TSI_TOPIC_DLQ": f"{app}.dlq",
        **extra,
    }


def create_topics(env: dict[str, str]) -> None:
    """``tsi topics create`` with ``env`` (its defaults: 128 shards); raises if it fails."""
    command = [sys.executable, "-m", "flows.cli", "topics", "create"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"tsi topics create failed: {done.stderr[-2000:]}")


def start(env: dict[str, str], recovery: Path, port: int) -> subprocess.Popen:
    """``tsi run`` with recovery in ``recovery`` and metrics on ``port``; its log on stderr."""
    command = [sys.executable, "-m", "flows.cli", "run"]
    run_env = {**env, "TSI_RECOVERY_DIR": str(recovery), "TSI_METRICS_PORT": str(port)}
    return subprocess.Popen(command, env=run_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def get(port: int, path: str) -> tuple[int, str] | None:
    """(status, body) of ``path`` on the service's metrics port; None while it does not
    answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None


def wait_ready(
    process: subprocess.Popen, port: int, timeout: float, every: float = 0.05
) -> tuple[float, list[str]]:
    """Seconds until ``/ready`` answers 200, and the distinct 503 reasons seen before, in
    order; ``RuntimeError`` if the process ends or ``timeout`` passes first."""
    started = time.monotonic()
    reasons: list[str] = []
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"the service ended: {process.stderr.read().decode()[-2000:]}")
        answer = get(port, "/ready")
        if answer is not None and answer[0] == 200:
            return time.monotonic() - started, reasons
        if answer is not None and (not reasons or reasons[-1] != answer[1].strip()):
            reasons.append(answer[1].strip())
        time.sleep(every)
    raise RuntimeError(f"/ready not 200 after {timeout:g} s; last: {reasons[-1:]}")


def gauges(port: int, *names: str) -> dict[str, float]:
    """The values of the unlabelled or summed gauges ``names`` from ``/metrics``."""
    answer = get(port, "/metrics")
    if answer is None:
        raise RuntimeError(f"no /metrics on port {port}")
    found = dict.fromkeys(names, 0.0)
    for name in names:
        for value in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", answer[1], re.MULTILINE):
            found[name] += float(value)
    return found


def wait_served(process: subprocess.Popen, port: int, instances: int, timeout: float) -> None:
    """Wait until the service holds ``instances`` instances and an epoch closed after
    (what a restart resumes); ``RuntimeError`` if it ends or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while gauges(port, "tsi_instances")["tsi_instances"] < instances:
        if time.monotonic() > deadline or process.poll() is not None:
            raise RuntimeError(f"{instances} instances not served in {timeout:g} s")
        time.sleep(0.2)
    served_at = time.time()
    epoch = "tsi_last_epoch_timestamp_seconds"
    while gauges(port, epoch)[epoch] <= served_at:
        if time.monotonic() > deadline or process.poll() is not None:
            raise RuntimeError(f"no epoch closed in {timeout:g} s after the instances")
        time.sleep(0.2)


def stop(process: subprocess.Popen, timeout: float = 60.0) -> None:
    """SIGTERM, and wait for a clean end (``RuntimeError`` with its log otherwise)."""
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise RuntimeError("the service did not stop on SIGTERM") from None

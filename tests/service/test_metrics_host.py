"""The address metrics and probes are served on: ``tsi run --metrics-host`` /
``TSI_METRICS_HOST`` down to ``serve_metrics``, the bind itself, and a bad host in one line."""

from __future__ import annotations

import collections
import errno
import socket
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

import flows.service.main
import flows.service.runtime.process
from flows.cli import app
from flows.service.observe import metrics
from flows.service.observe.metrics import DEFAULT_HOST, MetricsPortError, Readiness, serve_metrics
from flows.service.runtime.settings import Settings

REGISTRY_TOML = '[experiments.m]\narms = ["a", "b"]\n'


@contextmanager
def served(host: str | None = None) -> Iterator[int]:
    """A metrics server on a free port of ``host`` (None: the default); yields the port."""
    args = () if host is None else (host,)
    server, _ = serve_metrics(0, *args, readiness=Readiness())
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        metrics._servers.pop((host or DEFAULT_HOST, server.server_port), None)


def answers(address: str, port: int) -> bool:
    """Whether ``/healthz`` answers at ``address:port`` (False: the connection is refused)."""
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/healthz", timeout=5) as reply:
            return reply.status == 200
    except OSError as exc:
        reason = getattr(exc, "reason", exc)
        assert getattr(reason, "errno", None) == errno.ECONNREFUSED, exc
        return False


def test_the_server_binds_the_host_it_is_given():
    """127.0.0.1 is not 127.0.0.2 (both are this machine's loopback on Linux): a server
    bound to the one is not reached at the other, one bound to every interface is."""
    with served("127.0.0.1") as port:
        server = metrics._servers[("127.0.0.1", port)][0]
        assert server.socket.getsockname() == ("127.0.0.1", port)
        assert answers("127.0.0.1", port)
        assert not answers("127.0.0.2", port)
    with served() as port:
        server = metrics._servers[(DEFAULT_HOST, port)][0]
        assert server.socket.getsockname() == ("0.0.0.0", port)
        assert answers("127.0.0.1", port) and answers("127.0.0.2", port)


def test_a_host_name_is_resolved():
    with served("localhost") as port:
        server = metrics._servers[("localhost", port)][0]
        assert server.socket.getsockname()[0] in {"127.0.0.1", "::1"}


def test_an_ipv6_address_binds_an_ipv6_socket():
    assert socket.has_ipv6, "this test needs a Python built with IPv6"
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        raise AssertionError(f"this test needs an IPv6 loopback (::1): {exc}") from None
    with served("::1") as port:
        server = metrics._servers[("::1", port)][0]
        assert server.socket.family == socket.AF_INET6
        assert server.socket.getsockname()[:2] == ("::1", port)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("no-such-host.invalid", "metrics host 'no-such-host.invalid' is not a known address"),
        (
            "192.0.2.1",  # TEST-NET-1: never this machine's
            "metrics host '192.0.2.1' is not an address of this machine",
        ),
        ("", "metrics host '' is not a host name or address"),
        (" 127.0.0.1", "metrics host ' 127.0.0.1' is not a host name or address"),
    ],
)
def test_a_bad_host_is_one_line_naming_the_option(host, expected):
    nonlocal_bind = Path("/proc/sys/net/ipv4/ip_nonlocal_bind")
    assert not nonlocal_bind.exists() or nonlocal_bind.read_text().strip() == "0", (
        "this test needs net.ipv4.ip_nonlocal_bind = 0 (else any address binds)"
    )
    with pytest.raises(MetricsPortError) as caught:
        serve_metrics(0, host, readiness=Readiness())
    message = str(caught.value)
    assert message.startswith(expected), message
    assert "\n" not in message and "--metrics-host / TSI_METRICS_HOST" in message
    assert caught.value.__suppress_context__ or caught.value.__context__ is None


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "0.0.0.0"),
        ({"TSI_METRICS_HOST": "127.0.0.1"}, "127.0.0.1"),
        ({"TSI_METRICS_HOST": " ::1 "}, "::1"),
        ({"TSI_METRICS_HOST": ""}, "0.0.0.0"),
    ],
)
def test_settings_read_tsi_metrics_host(env, expected):
    assert Settings.from_env({"TSI_REGISTRY": "r.toml", **env}).metrics_host == expected
    assert Settings(registry=Path("r.toml")).metrics_host == DEFAULT_HOST == "0.0.0.0"


@pytest.mark.parametrize(
    ("args", "env", "host"),
    [
        ([], {}, "0.0.0.0"),
        (["--metrics-host", "127.0.0.1"], {}, "127.0.0.1"),
        ([], {"TSI_METRICS_HOST": "10.1.2.3"}, "10.1.2.3"),
    ],
)
def test_tsi_run_passes_the_metrics_host(monkeypatch, tmp_path, args, env, host):
    (tmp_path / "r.toml").write_text(REGISTRY_TOML)
    seen = {}
    monkeypatch.setattr("flows.cli.run.run_flow", lambda *a, **kw: seen.update(kw))
    limits = collections.defaultdict(lambda: 1_048_588)  # every topic there, no broker needed
    monkeypatch.setattr("flows.service.runtime.startup.check_kafka_topics", lambda *a: limits)
    monkeypatch.setattr("flows.service.runtime.startup.check_members", lambda *a: 0)
    monkeypatch.delenv("TSI_METRICS_HOST", raising=False)
    result = CliRunner().invoke(
        app, ["run", "--registry", str(tmp_path / "r.toml"), "--no-recovery", *args], env=env
    )
    assert result.exit_code == 0, result.output
    assert seen["metrics_host"] == host


def test_tsi_run_with_a_bad_host_is_one_line_and_status_2(monkeypatch, tmp_path):
    (tmp_path / "r.toml").write_text(REGISTRY_TOML)
    ran = []
    monkeypatch.setattr(
        flows.service.runtime.process, "cli_main", lambda flow, **kw: ran.append(flow)
    )
    monkeypatch.setattr(flows.service.runtime.process, "freeze_long_lived", lambda: None)
    monkeypatch.setattr(flows.service.runtime.process, "start_trimming", lambda every: None)
    monkeypatch.setattr(flows.service.runtime.process, "on_signals", lambda say: None)
    limits = collections.defaultdict(lambda: 1_048_588)
    monkeypatch.setattr("flows.service.runtime.startup.check_kafka_topics", lambda *a: limits)
    monkeypatch.setattr("flows.service.runtime.startup.check_members", lambda *a: 0)
    argv = ["run", "--registry", str(tmp_path / "r.toml"), "--no-recovery"]
    argv += ["--metrics-port", "9", "--metrics-host", "no-such-host.invalid"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert ran == []  # the flow never started
    [line] = [x for x in result.stderr.splitlines() if x.startswith("tsi run: metrics host")]
    assert line.startswith("tsi run: metrics host 'no-such-host.invalid' is not a known address")


def test_the_process_and_the_bytewax_run_entry_point_pass_the_host(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(
        flows.service.runtime.process, "serve_metrics", lambda port, **kw: calls.append((port, kw))
    )
    monkeypatch.setattr(flows.service.runtime.process, "cli_main", lambda flow, **kw: None)
    monkeypatch.setattr(flows.service.runtime.process, "freeze_long_lived", lambda: None)
    flows.service.runtime.process.run("FLOW", metrics_port=9464, metrics_host="127.0.0.1")
    flows.service.runtime.process.run("FLOW", metrics_port=9465)
    assert [(port, kw["addr"]) for port, kw in calls] == [(9464, "127.0.0.1"), (9465, "0.0.0.0")]

    calls.clear()
    (tmp_path / "r.toml").write_text(REGISTRY_TOML)
    monkeypatch.setenv("TSI_REGISTRY", str(tmp_path / "r.toml"))
    monkeypatch.setenv("TSI_METRICS_PORT", "9466")
    monkeypatch.setenv("TSI_METRICS_HOST", "127.0.0.1")
    assert flows.service.main.flow is not None
    assert [(port, kw["addr"]) for port, kw in calls] == [(9466, "127.0.0.1")]

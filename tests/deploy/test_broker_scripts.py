"""Without Java the broker cannot start: tests fail and say what to install, never skip."""

import os
import subprocess

import pytest

from flows.testing.kafka_broker import KAFKA_DIR, BrokerStartError, start_broker
from tests.conftest import kafka_bootstrap


def test_the_broker_helper_refuses_naming_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(BrokerStartError, match="Java 17"):
        start_broker(tmp_path / "data")


def test_the_fixture_fails_the_session_naming_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)

    class Factory:
        def mktemp(self, name):
            return tmp_path / name

    fixture = kafka_bootstrap.__wrapped__(Factory())
    with pytest.raises(pytest.fail.Exception, match="Java 17"):
        next(fixture)


def test_fetch_script_refuses_without_java_and_says_what_to_install(tmp_path):
    env = {
        **os.environ,
        "JAVA_HOME": str(tmp_path / "no-jdk"),
        "TSI_KAFKA_CACHE": str(tmp_path / "cache"),
    }
    done = subprocess.run(
        [str(KAFKA_DIR / "fetch.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "java not found" in done.stderr and "Java 17" in done.stderr

"""Without Java the broker cannot start: tests fail and say what to install, never skip."""

import os
import subprocess

import pytest

from tests.kafka_broker import KAFKA_DIR, start_broker


def test_the_fixture_fails_naming_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(pytest.fail.Exception, match="Java 17"):
        start_broker(tmp_path / "data")


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

"""``tsi serve`` and ``tsi keys`` refuse bad access settings at once: one line naming the
problem, exit status 2, nothing started or changed (no broker needed)."""

import subprocess

import pytest

from tests.service.test_operating import TSI


def tsi(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TSI, *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (
            ("--tls-cert", "{dir}/cert.pem"),
            "give --tls-cert and --tls-key together, got only --tls-cert",
        ),
        (("--tls-key", "{dir}/key.pem"), "got only --tls-key"),
        (("--tls-cert", "{dir}/none.pem", "--tls-key", "{dir}/key.pem"), "none.pem cannot be read"),
        (("--tls-cert", "{dir}/cert.pem", "--tls-key", "{dir}/key.pem"), "do not load"),
        (("--keys", "{dir}/none.toml"), "none.toml: [Errno 2]"),
        (("--keys", "{dir}/cert.pem"), "keys file"),
    ],
)
def test_tsi_serve_refuses_bad_tls_and_keys_in_one_line(tmp_path, given, named):
    for name in ("cert.pem", "key.pem"):
        (tmp_path / name).write_text("not PEM\n")
    done = tsi("serve", "--brokers", "127.0.0.1:1", *(g.format(dir=tmp_path) for g in given))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("tsi serve: ") and done.stderr.count("\n") == 1, done.stderr
    assert named in done.stderr


def test_tsi_keys_refusals_change_nothing(tmp_path):
    keys = tmp_path / "keys.toml"
    created = tsi("keys", "create", "web", "--scope", "decide", "--file", keys)
    assert created.returncode == 0 and created.stdout.startswith("tsi_")
    assert created.stdout.strip() not in keys.read_text()
    before = keys.read_text()
    for args, named in [
        (("create", "web", "--scope", "read"), "a key named 'web' exists"),
        (("create", "x", "--scope", "write"), "unknown scope 'write'"),
        (("revoke", "nobody"), "no key named 'nobody' (keys: web)"),
    ]:
        done = tsi("keys", *args, "--file", keys)
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert named in done.stderr
    assert keys.read_text() == before
    assert tsi("keys", "list", "--file", keys).stdout == "web\tdecide\n"

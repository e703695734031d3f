"""``tsi replay`` on hostile logs: every line accounted for, nothing raises, outputs in the
order of the input, the input streamed (see ``flows.tools.replay``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY as METRICS
from typer.testing import CliRunner

import flows.tools.replay as replay_module
from flows.cli import app
from flows.service.instances.registry import Registry
from flows.service.wire.events import Origin
from flows.tools.replay import AT_END, BATCH, Outputs, Replayed, replay
from flows.tools.replay_input import kafka_range, merge_by_time

TOML = (
    '[experiments.e]\narms = ["a", "b"]\nfeedback_ttl = 10\n'
    '[experiments.u]\narms = ["x", "y", "z"]\nper_unit = true\nfeedback_ttl = 10\n'
)
REG = Registry.from_toml(TOML)
T0 = 1_767_225_600  # 2026-01-01
NO_TS = object()  # the line has no "ts" field


def event(kind: str, rid: Any, ts: Any = T0, experiment: str = "e", **extra: Any) -> bytes:
    data = {"type": kind, "experiment": experiment, "request_id": rid, **extra}
    if ts is not NO_TS:
        data["ts"] = ts
    return orjson.dumps(data)


def req(rid: Any, ts: Any = T0, **extra: Any) -> bytes:
    return event("request", rid, ts, **extra)


def fb(rid: Any, ts: Any = T0, loss: float = 1.0, **extra: Any) -> bytes:
    return event("feedback", rid, ts, loss=loss, **extra)


def applied_so_far() -> float:
    """Feedback the instances say they applied (the service's own metric): a count
    independent of the replay's accounting."""
    labels = ({"experiment": e, "outcome": "applied"} for e in REG.experiments)
    return sum(METRICS.get_sample_value("tsi_feedback_total", x) or 0.0 for x in labels)


def replayed(lines: list[bytes]) -> Replayed:
    """Replay ``lines`` (origin "log", line numbers from 1) and check what must hold for any
    log: every line is accounted for, the applied feedback is what the instances applied."""
    before = applied_so_far()
    out = replay([(raw, Origin("log", None, n)) for n, raw in enumerate(lines, 1)], REG)
    assert out.events == len(lines)
    assert out.unaccounted == 0, out
    assert out.applied_feedback == applied_so_far() - before
    assert out.served == len(out.selections) == len(out.selection_lines)
    assert sum(out.reasons.values()) == len(out.dead_letters)
    assert all(d["detail"].endswith(AT_END) for d in out.at_end)
    return out


def reasons(letters: list[dict[str, Any]]) -> list[str]:
    return [d["reason"] for d in letters]


def test_feedback_right_after_its_request_without_ts_is_applied():
    # the old replay gave the feedback the largest ts of its read batch (T0 + 100, a later
    # line): it expired its own ticket and was lost
    out = replayed([req("r1"), fb("r1", NO_TS), req("r2", T0 + 100)])
    assert out.applied_feedback == 1 and out.dead_letters == []
    assert [(d["reason"], d["offset"]) for d in out.at_end] == [("ticket_expired", 3)]


def test_a_line_without_ts_takes_the_previous_events_time_never_a_later_one():
    # r2 happens at T0 (the line before it), so r3 at T0 + 20 expires it with r1, and its
    # feedback is late; at T0 + 20 it would have been applied
    out = replayed([req("r1"), req("r2", NO_TS), req("r3", T0 + 20), fb("r2", NO_TS)])
    assert reasons(out.dead_letters) == ["ticket_expired", "ticket_expired", "late_feedback"]
    assert out.last_ts == T0 + 20


def test_lines_before_any_ts_happen_at_time_zero():
    out = replayed([req("r1", NO_TS), fb("r1", NO_TS), req("r2", None)])
    assert out.applied_feedback == 1 and out.last_ts == 0.0


def test_a_ts_out_of_range_is_a_dead_letter_that_changes_nothing():
    bad = [1e308, -1, 1e11 + 1, 18446744073709551615, "NaN", "2026-01-01", True, [T0], {}]
    lines = [req("r1")] + [req(f"bad{i}", ts) for i, ts in enumerate(bad)]
    lines += [b'{"type": "request", "experiment": "e", "request_id": "inf", "ts": 1e400}']
    lines += [fb("r1", T0 + 1), req("r9", NO_TS)]
    out = replayed(lines)
    # a request at 1e308 used to expire every open ticket of its instance
    assert reasons(out.dead_letters) == ["ts_out_of_range"] * 4 + ["wrong_type"] * 5 + [
        "malformed_json"
    ]
    assert out.applied_feedback == 1 and out.last_ts == T0 + 1  # r9 at r1's feedback's time
    assert [s["request_id"] for s in out.selections] == ["r1", "r9"]


@pytest.mark.parametrize(
    ("rid", "reason"),
    [
        (7, "wrong_type"),
        (7.5, "wrong_type"),
        (True, "wrong_type"),
        (None, "missing_field"),
        ([1, 2], "wrong_type"),
        ({"a": 1}, "wrong_type"),
        ("", "bad_value"),
        ("x" * 300, "bad_value"),
    ],
)
def test_a_request_id_of_any_json_type_is_refused_with_its_reason(rid, reason):
    out = replayed([req(rid), fb(rid), req("ok"), fb("ok", T0 + 1)])
    assert reasons(out.dead_letters) == [reason, reason]
    assert out.served == 1 and out.applied_feedback == 1


def test_an_empty_log_and_a_log_of_only_broken_lines():
    assert replayed([]).events == 0
    broken = [
        b"garbage",
        b"\xff\xfe\x00 not utf-8",
        b"[1, 2]",
        b'"text"',
        b"null",
        b"{}",
        b'{"type": "request"}',
        b'{"type": "nothing", "experiment": "e", "request_id": "r"}',
        b'{"type": "feedback", "experiment": "e", "request_id": "r", "loss": "NaN"}',
        b'{"type": "request", "experiment": "nope", "request_id": "r"}',
        b'{"type": "request", "experiment": "u", "request_id": "r"}',  # per-unit, no unit
        b'{"pad": "' + b"x" * 200_000 + b'"}',
    ]
    out = replayed(broken)
    assert out.served == 0 and len(out.dead_letters) == len(broken) and out.at_end == []
    assert [d["offset"] for d in out.dead_letters] == list(range(1, len(broken) + 1))
    assert {"malformed_json", "not_an_object", "missing_field", "bad_value"} <= set(out.reasons)
    assert {"unknown_experiment", "oversize", "wrong_type"} <= set(out.reasons)


def test_feedback_before_its_request_is_applied_when_the_request_comes():
    out = replayed([fb("r1"), req("r1", T0 + 1)])
    assert out.applied_feedback == 1 and out.dead_letters == out.at_end == []


def test_what_is_pending_at_the_end_of_the_log_comes_out_as_dead_letters():
    out = replayed([fb("early1"), req("open1", T0 + 1), fb("early2", T0 + 2)])
    assert out.dead_letters == []
    assert [(d["reason"], d["offset"]) for d in out.at_end] == [
        ("unknown_ticket", 1),
        ("ticket_expired", 2),
        ("unknown_ticket", 3),
    ]


def test_duplicates_retries_and_late_feedback():
    lines = [req("r1"), req("r1", T0 + 1), fb("r1", T0 + 2), fb("r1", T0 + 3), req("r1", T0 + 4)]
    lines += [req("r2", T0 + 5), req("r3", T0 + 16), fb("r2", T0 + 17)]
    out = replayed(lines)
    assert [s["request_id"] for s in out.selections] == ["r1"] * 3 + ["r2", "r3"]
    assert len({s["arm"] for s in out.selections[:3]}) == 1  # a retry: the same answer
    # r3's line expired r2, whose feedback then came late (each in its line's place)
    got = [(d["reason"], d["offset"]) for d in out.dead_letters]
    assert got == [("duplicate_feedback", 4), ("ticket_expired", 6), ("late_feedback", 8)]
    assert out.applied_feedback == 1 and reasons(out.at_end) == ["ticket_expired"]


def test_lines_that_share_an_origin_are_still_accounted_for():
    lines = [req("r1"), fb("r1", T0 + 1), b"{", req("r2", T0 + 2), fb("early", T0 + 3)]
    out = replay([(raw, Origin("same")) for raw in lines], REG)
    assert out.unaccounted == 0 and out.applied_feedback == 1
    assert reasons(out.dead_letters) == ["malformed_json"]
    assert sorted(reasons(out.at_end)) == ["ticket_expired", "unknown_ticket"]


def interleaved(n: int, units: int = 300) -> list[bytes]:
    """Requests of many users (every shard), answered in order a few lines later (1 ms a
    line: 10^4 lines within the time to live); every 50th line broken."""
    lines, waiting = [], []
    for k in range(n):
        if k % 50 == 49:
            lines.append(b"{broken %d" % k)
        elif waiting and k % 3 == 0:
            rid, unit = waiting.pop(0)
            lines.append(event("feedback", rid, T0 + k / 1000, "u", unit=unit, loss=k % 5))
        else:
            waiting.append((f"r{k}", f"user{k % units}"))
            lines.append(event("request", f"r{k}", T0 + k / 1000, "u", unit=f"user{k % units}"))
    return lines


def test_outputs_follow_the_input_order_across_shards_and_epochs(monkeypatch):
    lines = interleaved(3000)
    out = replayed(lines)
    requests = [orjson.loads(x)["request_id"] for x in lines if b'"request"' in x]
    assert [s["request_id"] for s in out.selections] == requests
    assert [d["offset"] for d in out.dead_letters] == list(range(50, 3001, 50))
    # an epoch per read batch: the outputs are sorted in many small windows, same bytes
    monkeypatch.setattr(replay_module, "EPOCH", timedelta(0))
    again = replayed(lines)
    assert again.selection_lines == out.selection_lines
    assert again.dead_letters == out.dead_letters and again.at_end == out.at_end


def test_the_input_is_streamed_and_outputs_are_written_as_they_come(monkeypatch):
    monkeypatch.setattr(replay_module, "EPOCH", timedelta(0))
    n, read, ahead = 20_000, [0], []

    def lines():
        for number, raw in enumerate(interleaved(n), 1):
            read[0] += 1
            yield raw, Origin("gen", None, number)

    def selections(written: list[bytes]) -> None:
        last = int(orjson.loads(written[-1])["request_id"][1:])  # its line is last + 1
        ahead.append(read[0] - (last + 1))

    out = replay(lines(), REG, outputs=Outputs(selections, lambda _: None, lambda _: None))
    assert out.events == n and out.unaccounted == 0
    assert out.selections == out.selection_lines == []  # written, not kept
    assert len(ahead) > n // (4 * BATCH)  # written in many pieces as the log is read
    assert max(ahead) <= 2 * BATCH  # never more than a read batch or two ahead


MEMORY_PROBE = """
import itertools, resource, sys
from pathlib import Path
from flows.service.instances.registry import Registry
from flows.tools.replay import Outputs, replay
from flows.tools.replay_input import read_lines

path = Path(sys.argv[1])
reg = Registry.from_toml('[experiments.u]\\narms = ["a", "b", "c"]\\nper_unit = true')
quiet = Outputs(lambda _: None, lambda _: None, lambda _: None)
warm_up = itertools.islice(read_lines(path), 20_000)
replay(warm_up, reg, outputs=quiet)  # a first, short run: the runtime's own memory
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = replay(read_lines(path), reg, outputs=quiet)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(out.events, out.served, out.applied_feedback, out.unaccounted, grown * 1024)
"""


def write_large_log(path: Path, n: int) -> int:
    """n lines of requests and their feedback over 1,000 users; the file's size."""
    with path.open("wb") as f:
        for k in range(n):
            rid, unit = f"r{k - k % 2}", f"user{(k - k % 2) % 1000}"
            kind = "feedback" if k % 2 else "request"
            e = {"type": kind, "experiment": "u", "unit": unit, "request_id": rid, "ts": 1.8e9 + k}
            f.write(orjson.dumps(e | {"loss": 0.5} if k % 2 else e) + b"\n")
    return path.stat().st_size


def test_a_log_of_a_million_lines_replays_in_memory_far_below_its_size(tmp_path):
    """10^6 lines (~100 MB), every one accounted for; the peak RSS of replaying them stays
    within a small part of the log above that of replaying 20,000 lines (measured: no
    growth at all; ~19 s, 53,000 lines/s), where holding the log would take several times
    its size."""
    n = 1_000_000
    size = write_large_log(tmp_path / "log", n)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(MEMORY_PROBE), str(tmp_path / "log")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines, served, applied, unaccounted, grown = map(int, done.stdout.split())
    assert (lines, served, applied, unaccounted) == (n, n // 2, n // 2, 0)
    assert size > 90e6 and grown < size / 4, (grown, size)


def test_merging_two_logs_is_lazy_and_by_time_each_log_in_its_own_order():
    read = []

    def log(name: str, times: list[Any]):
        for i, ts in enumerate(times):
            read.append(name)
            yield (b"{}" if ts is NO_TS else orjson.dumps({"ts": ts}), f"{name}{i}")

    merged = merge_by_time(log("q", [1, NO_TS, 4, 3, 1e308]), log("f", [NO_TS, 2, NO_TS, 4]))
    assert read == []
    first = next(merged)
    assert first[1] == "f0" and len(read) == 2  # before any time: first; nothing read ahead
    rest = [origin for _, origin in merged]
    # q1 keeps q0's time, f2 f1's; q3 (3 < 4) stays after q2; 1e308 is no time: q4 keeps 3
    assert rest == ["q0", "q1", "f1", "f2", "q2", "q3", "q4", "f3"]


RUNNER = CliRunner()


def cli(*args: Any):
    return RUNNER.invoke(app, [str(a) for a in args])


def test_replaying_the_demo_log_writes_its_selections_byte_for_byte(tmp_path):
    demo, again = tmp_path / "demo", tmp_path / "replay"
    done = cli("demo", "--requests", 2000, "--seed", 5, "--out", demo)
    assert done.exit_code == 0, done.output
    args = ("--registry", demo / "registry.toml", "--events", demo / "events.jsonl")
    done = cli("replay", *args, "--out", again)
    assert done.exit_code == 0, done.output
    assert (again / "selections.jsonl").read_bytes() == (demo / "selections.jsonl").read_bytes()
    # and the demo's dead letters, but for where they say they come from (the demo counts
    # its messages from 0, the file its lines from 1) and what the end of the log closed
    ours = [*_letters(again / "dead_letters.jsonl"), *_letters(again / "pending_at_end.jsonl")]
    assert sorted(ours) == sorted(_letters(demo / "dead_letters.jsonl"))
    # the report too, byte for byte: the same outputs, and the demo's report_context.json
    pages = sorted(p.name for p in demo.iterdir() if p.suffix in (".md", ".html", ".png"))
    assert {"REPORT.md", "REPORT.html", "regret.png"} <= set(pages)
    for name in pages:
        assert (again / name).read_bytes() == (demo / name).read_bytes(), name
    # with another seed the draws differ: the replay's own title, the demo's truth kept
    done = cli("replay", *args, "--seed", 6, "--out", tmp_path / "seed6")
    assert done.exit_code == 0, done.output
    text = (tmp_path / "seed6" / "REPORT.md").read_text()
    assert text.startswith("# tsi replay report") and "regret" in text.lower()


def _letters(path: Path) -> list[bytes]:
    out = []
    for line in path.read_bytes().splitlines():
        letter = orjson.loads(line)
        letter["detail"] = letter["detail"].removesuffix(AT_END)
        for name in ("source", "partition", "offset"):
            del letter[name]
        out.append(orjson.dumps(letter, option=orjson.OPT_SORT_KEYS))
    return out


@pytest.mark.parametrize(
    ("content", "status"),
    [
        (b"", 0),
        (b"\n\n", 0),
        (b"garbage\n\xff\xfe\n[1]\n", 2),
        (req(["a", "list"]) + b"\n" + fb({"an": "object"}) + b"\n" + req(True) + b"\n", 2),
        (req("r", 1e308) + b"\n" + req("r", "NaN") + b"\n" + req("r", NO_TS) + b"\n", 0),
        (fb("only-feedback") + b"\n", 2),
    ],
    ids=["empty", "blank", "broken", "odd-ids", "odd-ts", "only-feedback"],
)
def test_the_cli_replays_any_log_with_its_outputs_and_a_report(tmp_path, content, status):
    """Any log is replayed to the end; one whose every line became a dead letter (what
    the end of the log closed included) exits 2, saying so."""
    log, registry, out = tmp_path / "log.jsonl", tmp_path / "r.toml", tmp_path / "out"
    log.write_bytes(content)
    registry.write_text(TOML)
    done = cli("replay", "--registry", registry, "--events", log, "--out", out)
    assert done.exit_code == status, done.output
    assert ("became a dead letter" in done.stderr) == (status == 2)
    assert "Traceback" not in done.output
    written = sum(
        len((out / name).read_bytes().splitlines())
        for name in ("selections.jsonl", "dead_letters.jsonl", "pending_at_end.jsonl")
    )
    assert written >= len([x for x in content.splitlines() if x])
    assert (out / "REPORT.md").exists()


def test_the_cli_merges_requests_and_feedback_files_and_refuses_one_file_twice(tmp_path):
    requests, feedback = tmp_path / "q.jsonl", tmp_path / "f.jsonl"
    requests.write_bytes(b"\n".join([req("r1"), req("r2", T0 + 30)]) + b"\n")
    # r1's feedback has no ts: it keeps the time of the line before it in its file, T0 + 1
    feedback.write_bytes(b"\n".join([fb("r0", T0 + 1), fb("r1", NO_TS)]) + b"\n")
    registry = tmp_path / "r.toml"
    registry.write_text(TOML)
    base = ("replay", "--registry", registry, "--requests", requests)
    done = cli(*base, "--feedback", feedback, "--out", tmp_path / "out", "--no-report")
    assert done.exit_code == 0, done.output
    assert "1 feedback applied" in done.output and not (tmp_path / "out" / "REPORT.md").exists()
    # r0's feedback never got its request: r2's line, 29 s later, closed it
    for name, reason in (("dead_letters", "unknown_ticket"), ("pending_at_end", "ticket_expired")):
        [letter] = (tmp_path / "out" / f"{name}.jsonl").read_bytes().splitlines()
        assert orjson.loads(letter)["reason"] == reason
    same = subprocess.run(
        [sys.executable, "-m", "flows.cli", *map(str, base), "--feedback", str(requests)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert same.returncode == 2 and "two different files" in same.stderr


def test_a_kafka_range_is_merged_across_partitions_in_time_order(kafka_bootstrap, tmp_path):
    from confluent_kafka import Producer

    from flows.testing.kafka_broker import create_topic, unique_topic

    topic = unique_topic("replay-merge")
    create_topic(kafka_bootstrap, topic, partitions=3)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    base_ms = int(time.time() * 1000) - 3_600_000  # brokers refuse times in the future
    # partition after partition, so that reading them one after the other is out of order
    for p in range(3):
        for i in range(p, 60, 3):
            producer.produce(topic, req(f"r{i:02d}", T0 + i), partition=p, timestamp=base_ms + i)
    assert producer.flush(30) == 0
    messages = list(kafka_range(kafka_bootstrap, topic))
    assert [m[1].time for m in messages] == [(base_ms + i) / 1000 for i in range(60)]
    assert [m[1].partition for m in messages[:6]] == [0, 1, 2, 0, 1, 2]
    tail = [o.offset for _, o in kafka_range(kafka_bootstrap, topic, 15, 18)]
    assert tail == [15] * 3 + [16] * 3 + [17] * 3  # of the three partitions, by time
    registry = tmp_path / "r.toml"
    registry.write_text(TOML)
    out = tmp_path / "out"
    done = cli(
        *("replay", "--registry", registry, "--topic", topic, "--brokers", kafka_bootstrap),
        *("--out", out, "--no-report"),
    )
    assert done.exit_code == 0, done.output
    served = [orjson.loads(x)["request_id"] for x in (out / "selections.jsonl").open("rb")]
    assert served == [f"r{i:02d}" for i in range(60)]

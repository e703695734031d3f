"""The dataflow end to end in memory (the same builder runs on Kafka and files)."""

import bytewax.operators as op
import orjson
from bytewax.testing import TestingSink, TestingSource, run_main

from flows.service.connectors.files import file_wiring
from flows.service.connectors.memory import memory_wiring, unbatched
from flows.service.dataflow import Inputs, Outputs, Wiring, build_flow
from flows.service.instances.registry import Registry
from flows.service.wire.events import Origin

REGISTRY = Registry.from_toml(
    """
[experiments.shared]
arms = ["a", "b", "c"]
seed = 3

[experiments.per_user]
arms = ["x", "y"]
per_unit = true
competition = { kind = "switching", rate = 0.01 }
"""
)


def msg(topic, i, **fields):
    return (orjson.dumps(fields), Origin(topic, 0, i))


def run(requests, feedback, clock=lambda: 1000.0):
    selections, dead = [], []
    run_main(build_flow(REGISTRY, memory_wiring(requests, feedback, selections, dead), clock))
    return ([(k, orjson.loads(v)) for k, v in selections], [(k, orjson.loads(v)) for k, v in dead])


def test_every_request_is_answered_and_every_bad_input_is_a_dead_letter():
    requests = [msg("rq", i, experiment="shared", request_id=f"r{i}") for i in range(20)]
    requests += [
        msg("rq", 20 + i, experiment="per_user", unit=f"u{i % 3}", request_id=f"p{i}")
        for i in range(9)
    ]
    requests += [
        (b"{broken", Origin("rq", 1, 0)),
        msg("rq", 30, experiment="nope", request_id="z"),
        msg("rq", 31, experiment="per_user", request_id="no-unit"),
        msg("rq", 32, experiment="shared", request_id="c", context=1),
    ]
    feedback = [
        msg("fb", i, experiment="shared", request_id=f"r{i}", loss=float(i)) for i in range(20)
    ]
    feedback += [
        msg("fb", 20, experiment="shared", request_id="r0", loss=1.0),  # duplicate
        msg("fb", 21, experiment="shared", request_id="r1", loss=float("1e301")),
    ]
    selections, dead = run(requests, feedback)
    assert sorted(s["request_id"] for _, s in selections) == sorted(
        [f"r{i}" for i in range(20)] + [f"p{i}" for i in range(9)]
    )
    keys = {s["request_id"]: k for k, s in selections}
    assert keys["r0"] == "shared" and keys["p0"] == "per_user\x1fu0"
    reasons = sorted(d["reason"] for _, d in dead)
    assert reasons == sorted(
        [
            "malformed_json",
            "unknown_experiment",
            "missing_field",
            "context_out_of_range",
            "duplicate_feedback",
            "loss_out_of_range",
        ]
    )
    origins = {(d["reason"], d["source"], d["partition"], d["offset"]) for _, d in dead}
    assert ("malformed_json", "rq", 1, 0) in origins and (
        "loss_out_of_range",
        "fb",
        0,
        21,
    ) in origins


def test_the_same_input_gives_the_same_selections_byte_for_byte():
    requests = [
        msg("rq", i, experiment="per_user", unit=f"u{i % 4}", request_id=f"r{i}") for i in range(40)
    ]
    feedback = [
        msg(
            "fb",
            i,
            experiment="per_user",
            unit=f"u{i % 4}",
            request_id=f"r{i}",
            reward=float(i % 3),
        )
        for i in range(40)
    ]
    assert run(requests, feedback) == run(requests, feedback)


def test_file_wiring_reads_jsonl_and_writes_jsonl(tmp_path):
    (tmp_path / "rq.jsonl").write_bytes(
        b'{"experiment": "shared", "request_id": "a"}\n\nnot json\n'
        b'{"experiment": "shared", "request_id": "b"}\n'
    )
    (tmp_path / "fb.jsonl").write_bytes(b'{"experiment": "shared", "request_id": "a", "loss": 1}\n')
    out_sel, out_dead = tmp_path / "sel.jsonl", tmp_path / "dlq.jsonl"
    run_main(
        build_flow(
            REGISTRY, file_wiring(tmp_path / "rq.jsonl", tmp_path / "fb.jsonl", out_sel, out_dead)
        )
    )
    selections = [orjson.loads(line) for line in out_sel.read_text().splitlines()]
    dead = [orjson.loads(line) for line in out_dead.read_text().splitlines()]
    assert [s["request_id"] for s in selections] == ["a", "b"]
    assert [(d["reason"], d["offset"]) for d in dead] == [("malformed_json", 3)]
    assert dead[0]["source"].endswith("rq.jsonl")


def test_combined_event_stream_keeps_each_instance_in_stream_order():
    events = []
    for i in range(30):
        unit = f"u{i % 3}"
        events.append(
            msg("ev", 2 * i, type="request", experiment="per_user", unit=unit, request_id=f"r{i}")
        )
        events.append(
            msg(
                "ev",
                2 * i + 1,
                type="feedback",
                experiment="per_user",
                unit=unit,
                request_id=f"r{i}",
                loss=float(i % 2),
            )
        )
    events.append(msg("ev", 99, type="other", experiment="per_user", unit="u0", request_id="x"))
    first_sel, first_dead = [], []
    run_main(build_flow(REGISTRY, memory_wiring([], [], first_sel, first_dead, events=events)))
    again_sel, again_dead = [], []
    run_main(build_flow(REGISTRY, memory_wiring([], [], again_sel, again_dead, events=events)))
    assert first_sel == again_sel and len(first_sel) == 30
    assert [orjson.loads(v)["reason"] for _, v in first_dead] == ["bad_value"]
    # every feedback met its open ticket (none waited as early feedback and expired)
    rounds = {}
    for key, value in first_sel:
        rounds.setdefault(key, []).append(orjson.loads(value)["round"])
    assert all(r == list(range(1, 11)) for r in rounds.values())


def test_a_backlog_of_both_topics_does_not_overflow_the_early_feedback_buffer():
    registry = Registry.from_toml(
        '[experiments.busy]\narms = ["a", "b"]\nearly_feedback_limit = 5\n'
    )
    requests = [msg("rq", i, experiment="busy", request_id=f"r{i}") for i in range(200)]
    feedback = [msg("fb", i, experiment="busy", request_id=f"r{i}", loss=1.0) for i in range(200)]
    selections, dead = [], []

    def backlog(items):  # a consumer catching up reads big batches from each topic
        return lambda flow, step: (op.input(step, flow, TestingSource([items])), None)

    wiring = Wiring(
        Inputs({"requests": backlog(requests), "feedback": backlog(feedback)}),
        Outputs(
            lambda step, up: unbatched(step, up, TestingSink(selections)),
            lambda step, up: unbatched(step, up, TestingSink(dead)),
        ),
    )
    run_main(build_flow(registry, wiring))
    assert len(selections) == 200
    assert [orjson.loads(v)["reason"] for _, v in dead] == []

"""The dataflow's composite steps one by one: what each passes on (``oks``) and what it
refuses (``errs``), and the wake-up scheduler each flow makes for itself."""

import math

import bytewax.operators as op
import orjson
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSink, TestingSource, run_main

from flows.service.connectors.kafka import kafka_wiring
from flows.service.connectors.memory import memory_wiring
from flows.service.connectors.topics import Topics
from flows.service.dataflow import (
    Guards,
    Inputs,
    Repartition,
    Wiring,
    build_flow,
    parse_route,
    shard_step,
    through_internal_topic,
)
from flows.service.instances.registry import LiveRegistry, Registry
from flows.service.observe.stream_clock import StreamClock
from flows.service.shards.deadlines import WAKE_UP
from flows.service.shards.group_logic import group_builder
from flows.service.shards.logic import flow_context
from flows.service.wire.events import (
    DeadLetter,
    Origin,
    ParseBySource,
    parse_feedback,
    parse_request,
)
from flows.service.wire.keys import group_of, shard_of

REGISTRY = Registry.from_toml('[experiments.e]\narms = ["a", "b"]\nfeedback_ttl = 5\n')
LIVE = LiveRegistry(REGISTRY)


def message(offset, topic="rq", **fields):
    return orjson.dumps(fields), Origin(topic, 0, offset)


def collect(stream, step):
    """The items of a stream, in a list the flow appends to."""
    items = []
    op.output(step, stream, TestingSink(items))
    return items


def collect_batches(stream, step):
    """The items of a stream of batches, in a list the flow appends to."""
    return collect(op.flat_map(f"{step}_items", stream, lambda batch: batch), step)


def test_parse_route_passes_routed_events_on_and_its_refusals_out():
    batch = [
        message(0, experiment="e", request_id="ok"),
        (b"{not json", Origin("rq", 0, 1)),
        message(2, experiment="nope", request_id="lost"),
        message(3, experiment="e", request_id="skipped"),
    ]
    flow = Dataflow("steps")
    messages = op.input("in", flow, TestingSource([batch]))
    guards = Guards(skip=frozenset({("rq", 0, 3)}))
    parsed = parse_route("parse", messages, parse_request, guards, LIVE)
    oks, errs = collect(parsed.oks, "oks"), collect_batches(parsed.errs, "errs")
    run_main(flow)
    assert [(d.reason, d.origin.offset) for d in errs] == [
        ("malformed_json", 1),
        ("unknown_experiment", 2),
        ("skipped", 3),
    ]
    assert [
        (group, [(shard, [event.request_id for _, _, event in routed]) for shard, routed in parts])
        for group, parts in oks
    ] == [(group_of(shard_of("e")), [(shard_of("e"), ["ok"])])]


def test_the_internal_round_trip_refuses_what_it_reads_back_and_what_its_source_could_not():
    """The copies go to the internal sink; what the internal source reads back is routed
    again, and both its own errors and the refusals of what it read are the step's errs."""
    written = []
    not_a_copy = DeadLetter("not_a_copy", "no origin header", b"x", Origin("internal", 0, 7))
    read_back = [
        message(5, topic="tsi.requests", experiment="e", request_id="r1"),
        message(6, topic="tsi.requests", experiment="gone", request_id="r2"),
    ]

    def source(flow, step):
        return (
            op.input(step, flow, TestingSource([read_back])),
            op.input(f"{step}_errors", flow, TestingSource([[not_a_copy]])),
        )

    def sink(step, up):
        op.output(step, op.flat_map(f"{step}_items", up, lambda b: b), TestingSink(written))

    repartition = Repartition(sink, source, ParseBySource("tsi.requests"))
    flow = Dataflow("steps")
    routed = op.input("routed", flow, TestingSource([[("e", None, parse_request(*read_back[0]))]]))
    trip = through_internal_topic(flow, repartition, [routed], Guards(), LIVE)
    oks, errs = collect(trip.oks, "oks"), collect_batches(trip.errs, "errs")
    run_main(flow)
    assert sorted((d.reason, d.origin.offset) for d in errs) == [
        ("not_a_copy", 7),
        ("unknown_experiment", 6),
    ]
    assert [[event.request_id for _, _, event in routed] for _, [(_, routed)] in oks] == [["r1"]]
    assert [(key, raw) for key, raw, _ in written] == [("e", read_back[0][0])]


def test_the_shard_step_passes_selections_on_and_the_shards_refusals_out():
    request = parse_request(*message(0, experiment="e", request_id="r1"))
    answer = message(1, topic="fb", experiment="e", request_id="r1", loss=1.0)
    e = REGISTRY.experiments["e"]
    shard = shard_of("e")
    batches = [
        (group_of(shard), [(shard, [("e", e, request)])]),
        (group_of(shard), [(shard, [("e", e, parse_feedback(*answer))])]),
        (group_of(shard), [(shard, [("e", e, parse_feedback(*answer))])]),  # the same again
    ]
    flow = Dataflow("steps")
    events = op.input("events", flow, TestingSource(batches))
    served = shard_step(events, group_builder(flow_context(REGISTRY, clock=lambda: 1000.0)))
    oks, errs = collect_batches(served.oks, "oks"), collect_batches(served.errs, "errs")
    run_main(flow)
    assert [orjson.loads(value)["request_id"] for _, value in oks] == ["r1"]
    assert [(d.reason, d.origin.offset) for d in errs] == [("duplicate_feedback", 1)]


def steps(flow):
    """Every step of ``flow``, nested steps included."""
    todo = list(flow.substeps)
    while todo:
        step = todo.pop()
        todo += step.substeps
        yield step


def wake_up_source_and_shard(flow):
    """The flow's wake-up source and a new shard of its stateful step."""
    (source,) = [s.source for s in steps(flow) if s.step_id.endswith(".wake_ups")]
    (shards,) = [s for s in steps(flow) if s.step_id.endswith(".shards")]
    return source, shards.builder(None)


def test_two_flows_in_one_process_do_not_share_wake_up_queues():
    """Each flow's shards wish into the scheduler its own wake-up source reads, on the
    same thread as the other flow's."""
    flows = []
    for _ in range(2):
        wiring = memory_wiring([], [], [], [])
        unbounded = Wiring(Inputs(wiring.inputs.sources, ending=lambda: False), wiring.outputs)
        flows.append(build_flow(REGISTRY, unbounded, clock=lambda: 1000.0, snapshots=False))
    (first_source, first), (second_source, second) = map(wake_up_source_and_shard, flows)
    assert first.context.wake_ups is not second.context.wake_ups
    request = parse_request(*message(0, experiment="e", request_id="r1"))
    first.handle([(shard_of("e"), [("e", first.context.registry.current["e"], request)])])
    first_part = first_source.build("wake_ups", 0, 1)
    second_part = second_source.build("wake_ups", 0, 1)
    first.context.wake_ups.queue().want(shard_of("e"), -math.inf)  # due now
    assert second_part.next_batch() == []
    assert first_part.next_batch() == [(shard_of("e"), WAKE_UP)]


def test_the_steps_recovery_keys_its_state_by_keep_their_ids():
    """Bytewax keys the sources', sinks' and shards' recovery state by step id: a store
    written before the dataflow's steps became composite ones must still resume."""
    wiring = kafka_wiring(["127.0.0.1:1"], Topics(), tail=True)
    flow = build_flow(REGISTRY, wiring, stream=StreamClock())
    kept = sorted(
        (type(step).__name__, step.step_id)
        for step in steps(flow)
        if type(step).__name__ in ("input", "output", "stateful_batch")
    )
    assert kept == [
        ("input", "tsi.feedback_in.kafka_input"),
        ("input", "tsi.internal_in"),
        ("input", "tsi.requests_in.kafka_input"),
        ("input", "tsi.wake_ups"),
        ("output", "tsi.dead_letters_out"),
        ("output", "tsi.internal_out"),
        ("output", "tsi.selections_out"),
        ("stateful_batch", "tsi.shards"),
    ]

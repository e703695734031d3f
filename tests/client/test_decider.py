"""The Python client as an application meets it, on the real broker and a running service."""

import asyncio
import time
import uuid

import pytest

from flows.client import (
    AsyncDecider,
    BadRequestError,
    ClientSettings,
    DeadLetterError,
    Decider,
    DecisionTimeoutError,
    KafkaUnavailableError,
)
from flows.testing.kafka_broker import consume_all, free_port
from tests.waiting import wait_for


def test_a_decision_its_retry_and_its_feedback(service):
    with Decider(service.settings(timeout=20)) as decider:
        decision = decider.decide("shop", unit="u1")
        assert decision.arm_name in ("a", "b", "c")
        assert ["a", "b", "c"][decision.arm] == decision.arm_name
        assert 0 < decision.prob <= 1 and decision.why == "bandit"
        uuid.UUID(decision.request_id)  # drawn: a UUID
        again = decider.decide("shop", unit="u1", request_id=decision.request_id)
        assert again == decision
        applied = 'tsi_feedback_total{experiment="shop",outcome="applied"}'
        before = service.metric(applied)
        decider.feedback("shop", decision.request_id, loss=0.5, unit="u1", arm=decision.arm_name)
        wait_for(lambda: service.metric(applied) == before + 1, service.proc, 30, "feedback")
    assert service.metric('tsi_retries_total{experiment="shop"}') >= 1


def test_several_feedbacks_of_an_aggregating_experiment_are_collected(service):
    with Decider(service.settings(timeout=20)) as decider:
        decision = decider.decide("basket", unit="u7", request_id="basket-1")
        for reward in (1, 2, 3):
            decider.feedback("basket", "basket-1", reward=reward, unit="u7")
    collected = 'tsi_feedback_total{experiment="basket",outcome="collected"}'
    wait_for(lambda: service.metric(collected) == 3, service.proc, 30, "collected feedback")
    assert decision.arm_name in ("x", "y")


def test_two_async_clients_at_once_each_get_their_own_answers(service):
    async def ask(decider, prefix):
        ids = [f"{prefix}-{i}" for i in range(25)]
        decisions = await asyncio.gather(*(decider.decide("shop", request_id=i) for i in ids))
        return ids, decisions

    async def both():
        settings = service.settings(timeout=30)
        async with AsyncDecider(settings) as one, AsyncDecider(settings) as two:
            return await asyncio.gather(ask(one, "one"), ask(two, "two"))

    for ids, decisions in asyncio.run(both()):
        assert [d.request_id for d in decisions] == ids
        assert all(d.arm_name in ("a", "b", "c") for d in decisions)


def test_a_request_refused_by_the_service_raises_its_dead_letter(service):
    with (
        Decider(service.settings(timeout=20)) as decider,
        pytest.raises(DeadLetterError) as refused,
    ):
        decider.decide("no-such-experiment", request_id="lost-1")
    assert refused.value.reason == "unknown_experiment"
    assert refused.value.request_id == "lost-1"


def test_a_bad_request_is_refused_before_it_is_sent_naming_the_field(service):
    with Decider(service.settings()) as decider:
        with pytest.raises(BadRequestError, match="unit must be a string"):
            decider.decide("shop", unit=7)
        with pytest.raises(BadRequestError, match="'loss' or 'reward', not both"):
            decider.feedback("shop", "r", loss=1, reward=1)
        with pytest.raises(BadRequestError, match="request_id must have 1 to 256"):
            decider.decide("shop", request_id="")
    sent = consume_all(service.bootstrap, service.names["ev"])
    assert not any(
        b'"unit":7' in v or b'"request_id":""' in v for p in sent.values() for _, v, _ in p
    )


def test_no_answer_in_time_is_a_timeout_naming_the_request_and_the_seconds(service):
    with Decider(service.settings(service.unserved(), timeout=0.5)) as decider:
        started = time.monotonic()
        with pytest.raises(DecisionTimeoutError, match=r"'late-1' within 0.5 s") as late:
            decider.decide("shop", request_id="late-1")
        assert 0.5 <= time.monotonic() - started < 5
    assert (late.value.request_id, late.value.seconds) == ("late-1", 0.5)


def test_unreachable_brokers_are_a_clear_error():
    settings = ClientSettings(brokers=f"127.0.0.1:{free_port()}", connect_timeout=1)
    with pytest.raises(KafkaUnavailableError, match="did not answer within 1 s"):
        Decider(settings)

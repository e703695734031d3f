"""``Decider`` (blocking) and ``AsyncDecider`` (asyncio): a decision and its feedback in
one call each, straight over Kafka (the ``tsi serve`` gateway serves HTTP with the second).

Both share one ``Connection`` design: a request is produced to the requests topic (the
events topic when the service is given one), and the call waits for the selection with its
``request_id``. A ``request_id`` is drawn (UUID 4) when none is given; a retry with the
same one gets the same answer, as the service guarantees.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from flows.client.connection import Connection, Waiter
from flows.client.errors import DecisionTimeoutError, KafkaUnavailableError
from flows.client.messages import feedback_message, request_message
from flows.client.settings import ClientSettings


@dataclass(frozen=True)
class Decision:
    """A selection as the service wrote it: serve ``arm_name``; ``prob`` is its propensity,
    ``why`` what served it (``bandit``, ``holdout``, ``burn_in``, ``forced``)."""

    experiment: str
    unit: str | None
    request_id: str
    arm: int
    arm_name: str
    prob: float
    round: int
    why: str

    @classmethod
    def of(cls, selection: Mapping[str, Any]) -> Decision:
        """The decision of a selection's JSON object (fields it may add are dropped)."""
        return cls(**{f.name: selection.get(f.name) for f in fields(cls)})


class _Base:
    def __init__(self, settings: ClientSettings | None = None, **given: Any) -> None:
        """Connect (``KafkaUnavailableError`` when the brokers do not answer). ``given``
        overrides fields of ``settings`` (``brokers="kafka:9092"``, ``timeout=0.5``)."""
        settings = settings or ClientSettings()
        if given:
            settings = replace(settings, **given)
        self.settings = settings
        self._connection = Connection(settings)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Any:
        """A client configured as ``tsi run`` is: ``KAFKA_BOOTSTRAP_SERVERS``,
        ``TSI_KAFKA_CONFIG``, ``TSI_TOPIC_*``, ``TSI_DECIDE_TIMEOUT``."""
        return cls(ClientSettings.from_env(env))

    def _request(
        self,
        experiment: str,
        unit: str | None,
        request_id: str | None,
        context: Any,
        eligible: Any,
    ) -> tuple[str, Waiter]:
        request_id = str(uuid.uuid4()) if request_id is None else request_id
        topics = self.settings.topics
        combined = topics.events is not None
        key, value = request_message(experiment, unit, request_id, context, eligible, combined)
        topic = topics.events or topics.requests
        return request_id, self._connection.ask(topic, key, value, (experiment, request_id))

    def _feedback(
        self,
        experiment: str,
        request_id: str,
        loss: float | None,
        reward: float | None,
        unit: str | None,
        arm: str | int | None,
        guardrails: Mapping[str, float] | None = None,
    ) -> concurrent.futures.Future:
        topics = self.settings.topics
        combined = topics.events is not None
        key, value = feedback_message(
            experiment, unit, request_id, loss, reward, arm, combined, guardrails
        )
        return self._connection.tell(topics.events or topics.feedback, key, value)

    def _timed_out(self, request_id: str, waiter: Waiter, timeout: float) -> Exception:
        """Why no answer came: the broker never took the request, or the service was late."""
        self._connection.forget(waiter)
        if not waiter.delivered:
            return KafkaUnavailableError(
                f"Kafka did not take request {request_id!r} within {timeout:g} s"
            )
        return DecisionTimeoutError(request_id, timeout)

    def close(self) -> None:
        """Send what is queued, then disconnect."""
        self._connection.close()


class Decider(_Base):
    """Decisions and feedback over Kafka, blocking; safe to share between threads.

    ``decide`` returns a ``Decision`` or raises ``BadRequestError`` (refused before sending,
    naming the field), ``DeadLetterError`` (the service refused it, with the reason),
    ``DecisionTimeoutError`` (no answer in time: serve a fallback, send no feedback) or
    ``KafkaUnavailableError``.
    """

    def decide(
        self,
        experiment: str,
        unit: str | None = None,
        request_id: str | None = None,
        context: int | Mapping[str, Any] | None = None,
        eligible: list[str | int] | None = None,
        timeout: float | None = None,
    ) -> Decision:
        """The arm to serve this request."""
        timeout = self.settings.timeout if timeout is None else timeout
        request_id, waiter = self._request(experiment, unit, request_id, context, eligible)
        try:
            return Decision.of(waiter.future.result(timeout))
        except concurrent.futures.TimeoutError:
            raise self._timed_out(request_id, waiter, timeout) from None

    def feedback(
        self,
        experiment: str,
        request_id: str,
        loss: float | None = None,
        reward: float | None = None,
        unit: str | None = None,
        arm: str | int | None = None,
        timeout: float | None = None,
        guardrails: Mapping[str, float] | None = None,
    ) -> None:
        """Report the loss (or reward) of a decision, and its guardrail metrics if any;
        returns once the broker has it."""
        timeout = self.settings.timeout if timeout is None else timeout
        future = self._feedback(experiment, request_id, loss, reward, unit, arm, guardrails)
        try:
            future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise KafkaUnavailableError(
                f"Kafka did not take the feedback of {request_id!r} within {timeout:g} s"
            ) from None

    def __enter__(self) -> Decider:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncDecider(_Base):
    """``Decider`` for asyncio: the same calls, awaited (the waiting happens off the loop)."""

    async def decide(
        self,
        experiment: str,
        unit: str | None = None,
        request_id: str | None = None,
        context: int | Mapping[str, Any] | None = None,
        eligible: list[str | int] | None = None,
        timeout: float | None = None,
    ) -> Decision:
        """The arm to serve this request (errors as ``Decider.decide``)."""
        timeout = self.settings.timeout if timeout is None else timeout
        request_id, waiter = self._request(experiment, unit, request_id, context, eligible)
        answer = asyncio.wrap_future(waiter.future)
        done, _ = await asyncio.wait({answer}, timeout=timeout)
        if not done:
            answer.cancel()
            raise self._timed_out(request_id, waiter, timeout)
        return Decision.of(answer.result())

    async def feedback(
        self,
        experiment: str,
        request_id: str,
        loss: float | None = None,
        reward: float | None = None,
        unit: str | None = None,
        arm: str | int | None = None,
        timeout: float | None = None,
        guardrails: Mapping[str, float] | None = None,
    ) -> None:
        """Report the loss (or reward) of a decision, and its guardrail metrics if any;
        returns once the broker has it."""
        timeout = self.settings.timeout if timeout is None else timeout
        delivered = asyncio.wrap_future(
            self._feedback(experiment, request_id, loss, reward, unit, arm, guardrails)
        )
        done, _ = await asyncio.wait({delivered}, timeout=timeout)
        if not done:
            delivered.cancel()
            raise KafkaUnavailableError(
                f"Kafka did not take the feedback of {request_id!r} within {timeout:g} s"
            )
        delivered.result()

    async def __aenter__(self) -> AsyncDecider:
        return self

    async def __aexit__(self, *_: object) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

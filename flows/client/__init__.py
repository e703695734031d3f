"""Decisions from Python in one call, straight over Kafka (``Decider``, ``AsyncDecider``).

A web application copies this (the service running, its topics created)::

    from flows.client import Decider, DecisionTimeoutError

    decider = Decider(brokers="127.0.0.1:9092")        # once, at start; thread-safe
    try:
        decision = decider.decide("checkout", unit="u42")
        arm = decision.arm_name                        # serve it
    except DecisionTimeoutError:
        arm = "control"                                # fallback: send no feedback
    else:
        decider.feedback("checkout", decision.request_id, reward=1.0, unit="u42", arm=arm)

``Decider.from_env()`` reads the variables ``tsi run`` reads (brokers, Kafka settings,
topics). ``AsyncDecider`` is the same with ``await``.
"""

from flows.client.decider import AsyncDecider, Decider, Decision
from flows.client.errors import (
    BadRequestError,
    DeadLetterError,
    DecisionError,
    DecisionTimeoutError,
    KafkaUnavailableError,
)
from flows.client.settings import ClientSettings

__all__ = [
    "AsyncDecider",
    "BadRequestError",
    "ClientSettings",
    "DeadLetterError",
    "Decider",
    "Decision",
    "DecisionError",
    "DecisionTimeoutError",
    "KafkaUnavailableError",
]

"""What a decision or a feedback can fail with: each names the request and the reason."""

from __future__ import annotations


class DecisionError(Exception):
    """Base of the client's errors."""


class BadRequestError(DecisionError, ValueError):
    """The request or feedback is refused before it is sent, as the service would refuse it
    (``reason`` as its dead letters say, ``detail`` naming the field)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class DecisionTimeoutError(DecisionError, TimeoutError):
    """No answer came within the time-out; serve a fallback and send no feedback."""

    def __init__(self, request_id: str, seconds: float) -> None:
        super().__init__(f"no answer to request {request_id!r} within {seconds:g} s")
        self.request_id = request_id
        self.seconds = seconds


class KafkaUnavailableError(DecisionError, ConnectionError):
    """The brokers could not be reached, or did not take the message in time."""


class DeadLetterError(DecisionError):
    """The service refused the request: it wrote it to its dead-letter topic."""

    def __init__(self, request_id: str, reason: str, detail: str) -> None:
        super().__init__(f"request {request_id!r} was refused: {reason}: {detail}")
        self.request_id = request_id
        self.reason = reason
        self.detail = detail

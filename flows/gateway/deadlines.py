"""Connections that must bring a whole request in time: idle and slow clients are closed.

uvicorn (``httptools`` protocol) arms its keep-alive time-out only after a response, and
cancels it at a request's first byte: a connection that never sends a request, or sends
one a byte at a time, is held forever. ``ReadDeadlineProtocol`` gives every request a
deadline, ``READ_TIMEOUT`` seconds from the connection's start or from the last
response, by which its headers and body must be in; past it the connection is closed.
The request's handling (a decision may wait for its answer) is not counted.

It is passed to uvicorn as its ``http`` protocol class (``tsi serve``: ``with_timeout``).

>>> with_timeout(2.5).read_timeout
2.5
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["READ_TIMEOUT", "ReadDeadlineProtocol", "with_timeout"]

#: Seconds a client has to send a whole request, from its connection or its last answer.
READ_TIMEOUT = 10.0


class ReadDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's ``httptools`` protocol with a deadline on reading each request."""

    read_timeout = READ_TIMEOUT
    _read_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # a next request already in: it is being handled
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._read_deadline = self.loop.call_later(self.read_timeout, self._expire)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _expire(self) -> None:
        """No whole request in time: the connection is closed."""
        self._read_deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def with_timeout(seconds: float) -> type[ReadDeadlineProtocol]:
    """The protocol class with a read deadline of ``seconds`` (above 0, else ValueError)."""
    if not seconds > 0:
        raise ValueError(f"a read time-out must be above 0 seconds, got {seconds!r}")
    return type("ReadDeadlineProtocol", (ReadDeadlineProtocol,), {"read_timeout": seconds})

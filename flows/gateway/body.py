"""A request's body read under a limit: refused (``BodyTooLargeError``) once it is known
to exceed ``MAX_BODY`` bytes, never held whole. Both the gateway's own calls and its
OpenFeature routes (``flows.gateway.ofrep``) read their bodies here.
"""

from __future__ import annotations

from starlette.requests import Request

__all__ = ["MAX_BODY", "BodyTooLargeError", "read_body"]

#: The longest request body read, in bytes: a decision's or feedback's JSON is far shorter.
MAX_BODY = 64 * 1024


class BodyTooLargeError(Exception):
    """A request body over ``MAX_BODY`` bytes (a 413)."""


async def read_body(request: Request, limit: int = MAX_BODY) -> bytes:
    """The body of ``request``, refused (``BodyTooLargeError``) once it is known to exceed
    ``limit`` bytes: by its Content-Length before anything is read, else as it streams in."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLargeError(f"the body is {int(declared)} bytes, over the {limit} allowed")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLargeError(f"the body is over the {limit} bytes allowed")
        chunks.append(chunk)
    return b"".join(chunks)

"""What every route reads of a request: its body within a bound, the caller's address.

Shared by the app (gateway.app) and the routers it includes (feedback, lifecycle, tokenize,
tinker), so none of them imports the app.
"""

from __future__ import annotations

from fastapi import Request

from gateway.errors import RequestTooLarge


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused past ``limit`` bytes without reading more than that."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(
            f"the request body is {declared} bytes; this gateway takes at most {limit}"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge(f"the request body is over {limit} bytes, this gateway's limit")
        chunks.append(chunk)
    return b"".join(chunks)


def client_of(request: Request) -> str | None:
    """The caller's address (behind a proxy: what uvicorn's ``proxy_headers`` made of it)."""
    return request.client.host if request.client else None

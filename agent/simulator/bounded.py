"""An httpx transport that lets at most ``limit`` requests into its connection pool at once.

A simulated fleet shares one client among thousands of agents. When they all
register at once (``stagger_s=0``), thousands of requests wait in httpcore's
pool for its few connections, and the pool walks every waiting request
against every connection each time one frees up: at 2,000 nodes and 32
connections ``bench/ingest.py`` spent over ten minutes of its own CPU in that
walk while the control plane sat idle. Held back here instead, on a
semaphore, the pool only ever sees as many requests as it has connections,
and the rest wait in line for nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx


class BoundedTransport(httpx.AsyncBaseTransport):
    """``inner`` with at most ``limit`` requests in it, each counted until its response is closed."""

    def __init__(self, inner: httpx.AsyncBaseTransport, limit: int) -> None:
        self.inner = inner
        self.slots = asyncio.Semaphore(limit)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await self.slots.acquire()
        try:
            response = await self.inner.handle_async_request(request)
        except BaseException:
            self.slots.release()
            raise
        # The connection stays busy until the body is read and closed; so does the slot.
        response.stream = _Releasing(response.stream, self.slots)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Releasing(httpx.AsyncByteStream):
    """A response body that hands its slot back once, when it is closed."""

    def __init__(self, stream: httpx.AsyncByteStream, slots: asyncio.Semaphore) -> None:
        self.stream = stream
        self.slots: asyncio.Semaphore | None = slots

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self.stream.aclose()
        finally:
            if self.slots is not None:
                self.slots.release()
                self.slots = None

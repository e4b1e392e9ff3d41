"""A real OTLP/HTTP receiver process for tests: start it, read what it received.

:func:`otlp_receiver` starts ``tests/support/otlp_receiver.py`` on a free
127.0.0.1 port and yields a :class:`Received`, which reads its JSON lines as
they come; leaving the block terminates the process.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

RECEIVER = Path(__file__).parent / "otlp_receiver.py"


class Received:
    """What a receiver process printed: one dict per span (or per metric point)."""

    def __init__(
        self, port: int, stdout: BufferedByteReceiveStream, process: anyio.abc.Process
    ) -> None:
        self.port = port
        self.process = process
        self.endpoint = f"http://127.0.0.1:{port}"
        self.items: list[dict[str, Any]] = []
        self._stdout = stdout

    async def next(self) -> dict[str, Any]:
        line = (await self._stdout.receive_until(b"\n", 1 << 22)).decode()
        item: dict[str, Any] = json.loads(line)
        self.items.append(item)
        return item

    async def until(self, done: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
        """Read on until ``done(everything so far)``; the caller bounds the wait."""
        while not done(self.items):
            await self.next()
        return self.items

    async def rest(self) -> list[dict[str, Any]]:
        """Read on until the process's output ends (it exited, or was killed); a line cut
        short by a kill is not a span it acknowledged, so it is left out."""
        with contextlib.suppress(anyio.EndOfStream, anyio.IncompleteRead):
            while True:
                await self.next()
        return self.items

    def spans(self) -> list[dict[str, Any]]:
        return [item for item in self.items if "span_id" in item]


@asynccontextmanager
async def otlp_receiver(port: int = 0) -> AsyncIterator[Received]:
    """Run a receiver process for the body of the block, on ``port`` (0: a free one)."""
    command = [sys.executable, str(RECEIVER), *([str(port)] if port else [])]
    async with await anyio.open_process(command) as process:
        try:
            assert process.stdout is not None
            stdout = BufferedByteReceiveStream(process.stdout)
            line = (await stdout.receive_until(b"\n", 1 << 10)).decode()
            yield Received(int(line.removeprefix("PORT ")), stdout, process)
        finally:
            with contextlib.suppress(ProcessLookupError):  # a test may have killed it
                process.terminate()

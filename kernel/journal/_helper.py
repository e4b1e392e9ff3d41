"""A helper process that reads and checks a journal's rows while this one folds them.

Replay and verify spend about 40% of each event reading its row, inflating its body
and checking its hash (and, in verify, its Merkle leaf and the tree); the fold that
follows is the rest, and both ran on one thread. For a long read on a machine of two
cores or more the reading and checking move to a process of their own
(:func:`helped`), which hands over the canonical bodies of the rows that checked out,
batch by batch, over a pipe: this process only decodes and folds them, the two halves
run at once. The helper runs this kernel's own checks (:func:`~kernel.journal.sealing.
check_rows`, :func:`~kernel.journal.verify.verify_journal`), so what is refused and the
words it is refused in are the same as in process.

It starts in about a tenth of a second (the modules it needs, not the whole kernel
package), so it is used from :data:`HELPER_EVENTS` events on, and never with
``DIRK_HELPER=off`` in the environment (where processes may not be started, say). A
helper that fails in any way is not trusted with anything: its caller reads the journal
itself instead.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from array import array
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path
from typing import IO, Any

import anyio
import msgspec

from kernel.core.events import Event, with_derived
from kernel.journal._helper_worker import BODIES, HEADER, REPORT, STOP
from kernel.journal.errors import is_postgres

HELPER_EVENTS = 20_000
"""The fewest events a read must span for a helper process to pay for its start."""
HEAD_START = 8_000
"""Events a scan reads itself while its helper starts (it takes about 0.1 s)."""
# The kernel package's __init__ imports all of it (about a second); the helper needs
# two dozen modules of kernel.core and kernel.journal, whose own __init__s import nothing.
_BOOT = (
    "import sys, types; kernel = types.ModuleType('kernel'); kernel.__path__ = [sys.argv[1]];"
    " sys.modules['kernel'] = kernel; from kernel.journal._helper_worker import serve; serve()"
)
_decoder = msgspec.json.Decoder(Event)
_KERNEL_DIR = str(Path(__file__).resolve().parent.parent)


class HelperLost(Exception):
    """The helper process ended without saying all it had to: read in process instead."""


def helps(events: int, location: str = "") -> bool:
    """Whether a read of ``events`` events is worth a helper process here (a scan's helper
    reads SQLite files only: ``location``, when given, must be one)."""
    if (location and is_postgres(location)) or os.environ.get("DIRK_HELPER") == "off":
        return False
    return events >= HELPER_EVENTS and (os.cpu_count() or 1) >= 2


def decoded(bodies: list[bytes]) -> list[Event]:
    """Return the events of canonical bodies the helper checked (without chain hashes)."""
    decode = _decoder.decode
    return [decode(body) for body in bodies]


async def helped(request: dict[str, Any]) -> AsyncGenerator[tuple[bytes, Any], None]:
    """Run a helper on ``request``; yield its frames: (BODIES, bodies), then (STOP, seq) or
    (REPORT, bytes).

    Each frame is read in a worker thread, with blocking reads: while this process folds,
    the helper writes on into its pipe (it makes it 1 MiB, a few frames) and never waits
    on an event loop busy folding.

    Raises:
        HelperLost: It could not start, or ended before its last frame.
    """
    try:
        process = await anyio.to_thread.run_sync(_start, request)
    except OSError as exc:
        raise HelperLost(f"the helper did not start ({exc})") from None
    try:
        while True:
            kind, payload = await anyio.to_thread.run_sync(_frame, process.stdout)
            if kind == BODIES:
                yield kind, payload
                continue
            yield kind, int(payload) if kind == STOP else payload
            return
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_end, process)


def _start(request: dict[str, Any]) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-c", _BOOT, _KERNEL_DIR],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert process.stdin is not None
    with process.stdin:
        process.stdin.write(json.dumps(request).encode())
    return process


def _frame(out: IO[bytes] | None) -> tuple[bytes, Any]:
    assert out is not None
    header = out.read(HEADER.size)
    if len(header) < HEADER.size:
        raise HelperLost("the helper ended early")
    kind, size = HEADER.unpack(header)
    payload = out.read(size) if size else b""
    if len(payload) < size:
        raise HelperLost("the helper ended early")
    if kind == BODIES:
        return kind, _split(payload)
    if kind not in (STOP, REPORT):
        raise HelperLost(f"the helper sent a frame of kind {kind!r}")
    return kind, payload


def _end(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
    if process.stdout is not None:
        process.stdout.close()


async def helped_scan(
    path: str, start: int, key: bytes | None, checked: bool
) -> AsyncGenerator[list[Event] | int, None]:
    """Start a helper reading the events from ``start`` on; yield ``[]`` once it started,
    then the events as it read and checked them, batch by batch (as a scan folds them: no
    chain hashes), then the seq to read on from in process.

    That seq is where its checks stopped (a bad row, whose problem the caller words),
    where the journal ended as the helper read it, or where the helper was lost. The
    helper chains event ``start`` on the stored hash of the one before: the caller checks
    the events up to it.
    """
    request = {
        "verify": False,
        "path": path,
        "start": start,
        "key": None if key is None else key.hex(),
        "checked": checked,
    }
    try:
        async with aclosing(helped(request)) as frames:
            yield []
            async for kind, payload in frames:
                if kind != BODIES:
                    break
                batch = _events(payload, start)
                if batch:
                    start = batch[-1].seq + 1
                    yield with_derived(batch)
                if len(batch) < len(payload):
                    break
    except HelperLost:
        pass
    yield start


def _events(bodies: list[bytes], start: int) -> list[Event]:
    """Decode the bodies of events ``start``..; the ones before any that does not decode to
    its seq (the caller reads that one itself, and says what is wrong with it)."""
    try:
        batch = decoded(bodies)
    except ValueError:
        return []
    for offset, event in enumerate(batch):
        if event.seq != start + offset:
            return batch[:offset]
    return batch


def _split(payload: bytes) -> list[bytes]:
    """Return the bodies of a BODIES frame: their count, their lengths, their bytes."""
    try:
        (count,) = struct.unpack_from("<I", payload)
        lengths = array("I")
        lengths.frombytes(payload[4 : 4 + 4 * count])
    except (struct.error, ValueError):
        raise HelperLost("the helper sent a frame that does not parse") from None
    at = 4 + 4 * count
    if len(lengths) != count or at + sum(lengths) != len(payload):
        raise HelperLost("the helper sent a frame that does not add up")
    view, bodies = memoryview(payload), []
    for length in lengths:
        bodies.append(view[at : at + length])
        at += length
    return bodies  # type: ignore[return-value]  # memoryviews: msgspec decodes them alike

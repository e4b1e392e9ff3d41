"""A helper process that reads and checks a journal's rows while this one folds them.

Replay and verify spent about 40% of each event reading its row, inflating its body and
checking its hash (and, in verify, hashing its Merkle leaf), on the thread that then
decodes and folds it. For a long read of a SQLite journal on a machine of two cores or
more, a process of its own does that first part (:mod:`kernel.journal._helper_worker`)
and hands over the rows that checked out, a frame of 1,000 at a time, over a pipe: this
process decodes them, checks what needs the decoded event (its seq, its type and dfid
columns), and folds. The two halves run at once.

The helper judges nothing: at the first row that does not plainly check out it stops,
and the read goes on in process from that row, which is refused in the usual words at
the usual seq. A helper that dies, or says anything unexpected, is dropped the same
way, and what it handed over before was checked. It starts in about 50 ms (sqlite3,
msgspec and the codec, not the kernel package), so it is used from
:data:`HELPER_EVENTS` events on, when a core is free (:func:`helps`), and never with
``DIRK_HELPER=off`` in the environment (where processes may not be started, say).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path
from typing import IO, Any

import anyio
import msgspec

from kernel.core.events import Event, with_derived
from kernel.journal._helper_worker import BODIES, HEADER, STOP
from kernel.journal.errors import is_postgres

HELPER_EVENTS = 20_000
"""The fewest events a read must span for a helper process to pay for its start."""
HEAD_START = 5_000
"""Events read in process while the helper starts."""
# The kernel package's __init__ imports all of it (about a second); the helper needs the
# codec, and kernel.journal's and kernel.core's own __init__s import nothing.
_BOOT = (
    "import sys, types; kernel = types.ModuleType('kernel'); kernel.__path__ = [sys.argv[1]];"
    " sys.modules['kernel'] = kernel; from kernel.journal._helper_worker import serve; serve()"
)
_decoder = msgspec.json.Decoder(Event)
_frames = msgspec.msgpack.Decoder(list[list[Any]])
_KERNEL_DIR = str(Path(__file__).resolve().parent.parent)


class HelperLost(Exception):
    """The helper process ended without saying all it had to: read on in process."""


def helps(events: int, location: str) -> bool:
    """Whether a read of ``events`` events of the journal at ``location`` is worth a helper
    process here: a SQLite file, two cores or more, and one of them free now (on a busy
    machine the helper only adds its own work), unless ``DIRK_HELPER`` says ``on``
    (whatever the load) or ``off`` (never)."""
    asked = os.environ.get("DIRK_HELPER", "")
    if asked == "off" or is_postgres(location) or events < HELPER_EVENTS:
        return False
    cores = os.cpu_count() or 1
    return cores >= 2 and (asked == "on" or _running() <= cores - 1)


def _running() -> float:
    """How many threads want a core now, this one included (Linux's count of runnable
    tasks; elsewhere the load average, plus this one)."""
    try:
        with open("/proc/loadavg", encoding="ascii") as file:
            return int(file.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.getloadavg()[0] + 1
    except (AttributeError, OSError):  # no load average here: never a helper unasked
        return float("inf")


def request(path: str, start: int, last: int | None, checked: bool, verify: bool) -> dict[str, Any]:
    """What a helper is asked: rows ``start``..``last`` (None: to the end), their hashes
    checked or not, for a verify with their hashes, columns and leaves. Never a chain key:
    a keyed chain is read in process (its key goes to no other process)."""
    return {"path": path, "start": start, "last": last, "checked": checked, "verify": verify}


async def helped(asked: dict[str, Any]) -> AsyncGenerator[list[list[Any]] | int, None]:
    """Run a helper; yield ``[]`` once it started, then each frame of rows it checked
    (``[bodies, hashes, types, dfids, leaves]``), then the seq to read on from in process.

    That seq is where its checks stopped (a row it does not vouch for), where its read
    ended, or, if it was lost, the one after the last row it handed over. Each frame is
    read in a worker thread, with blocking reads: while this process folds, the helper
    writes on into its pipe and never waits on an event loop busy folding.
    """
    start = asked["start"]
    try:
        process = await anyio.to_thread.run_sync(_start, asked)
    except OSError:
        yield start
        return
    try:
        yield []
        while True:
            kind, payload = await anyio.to_thread.run_sync(_frame, process.stdout)
            if kind == STOP:
                yield payload
                return
            start += len(payload[0])
            yield payload
    except HelperLost:
        yield start
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_end, process)


async def helped_scan(
    path: str, start: int, checked: bool
) -> AsyncGenerator[list[Event] | int, None]:
    """Start a helper reading events from ``start`` on; yield ``[]`` once it started, then
    the events it checked (as a scan folds them: no chain hashes), then the seq to read
    on from. It chains event ``start`` on the stored hash of the one before: the caller
    checks the events up to it."""
    async with aclosing(helped(request(path, start, None, checked, False))) as frames:
        async for frame in frames:
            if isinstance(frame, int):
                yield frame
                return
            if not frame:
                yield []
                continue
            batch = decoded(frame[0], start)
            if batch:
                start = batch[-1].seq + 1
                yield with_derived(batch)
            if len(batch) < len(frame[0]):
                break
    yield start


def decoded(bodies: list[bytes], start: int) -> list[Event]:
    """Decode the bodies of events ``start``..; the ones before any that does not decode to
    its seq (the caller reads that one itself, and says what is wrong with it)."""
    decode = _decoder.decode
    try:
        batch = [decode(body) for body in bodies]
    except ValueError:
        return []
    for offset, event in enumerate(batch):
        if event.seq != start + offset:
            return batch[:offset]
    return batch


def _start(asked: dict[str, Any]) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-c", _BOOT, _KERNEL_DIR],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert process.stdin is not None
    with process.stdin:
        process.stdin.write(json.dumps(asked).encode())
    return process


def _frame(out: IO[bytes] | None) -> tuple[bytes, Any]:
    assert out is not None
    header = out.read(HEADER.size)
    if len(header) < HEADER.size:
        raise HelperLost("the helper ended early")
    kind, size = HEADER.unpack(header)
    payload = out.read(size)
    if len(payload) < size:
        raise HelperLost("the helper ended early")
    parsed = _parsed(kind, payload)
    if parsed is None:
        raise HelperLost("the helper sent a frame that does not parse")
    return kind, parsed


def _parsed(kind: bytes, payload: bytes) -> int | list[list[Any]] | None:
    """A frame's contents: STOP's seq, or BODIES' lists; None if it is neither."""
    try:
        if kind == STOP:
            return int(payload)
        frame = _frames.decode(payload) if kind == BODIES else []
    except ValueError:
        return None
    if len(frame) == 5 and frame[0] and all(type(body) is bytes for body in frame[0]):
        return frame
    return None


def _end(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
    if process.stdout is not None:
        process.stdout.close()

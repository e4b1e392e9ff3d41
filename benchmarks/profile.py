"""Summarise a py-spy profile of P1 by kernel concern, or by thread and library.

By thread and library (every thread, native frames, idle samples told apart)::

    py-spy record --native --threads --idle -f raw -r 200 -o p1.folded -- \\
        python -m benchmarks --only P1 --repeats 1
    python -m benchmarks.profile --libraries p1.folded

The journal writer's compression, SQLite and file I/O run in worker threads with the GIL
released: only a profile of every thread with native frames sees them (a ``--gil``
profile shows the event loop alone). The benchmark's C1.loop / C1.writer / C1.other
give the same split in CPU time; this one says which library inside each thread.

By kernel concern (the event loop's Python frames)::

    py-spy record --nonblocking --gil -f raw -r 500 -o p1.folded -- \\
        python -m benchmarks --only P1 --repeats 1 --gc-threshold 20000
    python -m benchmarks.profile p1.folded

Use ``--nonblocking``: py-spy's default (pausing the process to sample) piles
samples onto syscalls, and asyncio's ``get_running_loop`` makes one (getpid)
on every anyio call, so anyio looks several times costlier than it is.
Raising the GC threshold keeps the collector's time (G1 in the benchmark) from
being smeared over whichever line happened to allocate.

Each sample of the event loop thread goes to the concern of its deepest
matching frame; samples of other threads are two lines of their own: the
checkpoint snapshots encoded in a worker thread, and the rest (the journal
writer's sqlite work while it holds the GIL).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Sequence

CONCERNS = [
    ("journal seal: stamp Event, canonical encode, sha256 chain", r"seal \(kernel|stamp \(kernel"),
    ("journal transition check: re-fold of every draft", r"Projections\.transition_check"),
    ("projections.apply on commit (fold again)", r"Projections\.apply|Kernel\._on_commit"),
    ("journal writer task, thread hop", r"Journal\._commit|Journal\.run_writer|to_thread"),
    ("Outbox.emit: staging fold", r"Outbox\.emit"),
    ("visible_state + context_ref digest", r"visible_state|context_ref \(kernel|digest \(kernel"),
    (
        "actor logic (compiler, DIM, execution, registry)",
        r"ContextCompiler|IntegrityModule|ExecutionEngine|evaluate \(kernel|idempotency_key"
        r"|session_hash|SeededIds",
    ),
    (
        "task spawn per context; adapter call pool",
        r"TaskGroup\.start_soon|Effects\.__call__|CallPool",
    ),
    (
        "anyio checkpoints and backend lookups",
        r"checkpoint|get_async_backend|current_async_library",
    ),
    ("mailbox send/receive", r"Mailbox\.|MemoryObject"),
    ("Reply / anyio.Event", r"Reply\.|Event\.__new__|Event\.set|Event\.wait|Event\.__init__"),
    ("agent host: _reason, to_record, submit", r"Kernel\._reason|to_record|Kernel\.submit|_call"),
    ("supervisor runner: Outbox, batches, effects", r"Supervisor\.|Outbox\."),
    ("semaphore", r"Semaphore"),
    ("benchmark driver, agent and adapter", r"\(benchmarks/flows|Kernel\.trigger"),
]
LOOP = "asyncio loop: run_once, select, call_soon, task steps"
THREADS = "other threads holding the GIL (sqlite writer)"
SNAPSHOTS = "checkpoint snapshots encoded in a thread (holding the GIL)"


def summarise(lines: Sequence[str]) -> tuple[int, Counter[str]]:
    """Return the number of samples and the samples per concern of py-spy raw output."""
    patterns = [(name, re.compile(pattern)) for name, pattern in CONCERNS]
    shares: Counter[str] = Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if "Thread._bootstrap" in frames[0]:
            concern = SNAPSHOTS if "encode_snapshot" in stack else THREADS
        elif "_run_once" in stack:
            concern = next(
                (
                    name
                    for frame in reversed(frames)
                    for name, pattern in patterns
                    if pattern.search(frame)
                ),
                LOOP,
            )
        else:
            continue  # start-up, imports, the report
        shares[concern] += int(count)
        total += int(count)
    return total, shares


LIBRARIES = [
    ("compression (zstd, zlib)", r"zstd\.c|zstandard|libz\.|zlibmodule|deflate|inflate"),
    ("SQLite (engine and module)", r"libsqlite3|_sqlite|cursor\.c|microprotocols\.c|statement\.c"),
    ("file I/O syscalls", r"^(fdatasync|fsync|pwrite64|pread64|write|read|lseek64?) \(libc"),
    ("msgspec", r"msgspec"),
    ("hashlib (SHA-256)", r"_hashopenssl|libcrypto|sha256"),
    ("interpreter (libpython: eval, GC, allocation)", r"libpython|gc_collect"),
    ("kernel (Python)", r"\(kernel/|\(agents_sdk/|\(policies/"),
    ("benchmark driver (Python)", r"\(benchmarks/"),
    ("anyio, asyncio, stdlib (Python)", r"\.py:\d+\)$"),
]
IDLE = (
    r"PyThread_acquire_lock|pthread_cond_(timed)?wait|take_gil|epoll_wait|select \(selectors"
    r"|Condition\.wait|_connection_worker_thread \(aiosqlite"
)
"""A sample ending in a wait (a lock, the GIL, a condition, select), under ``--idle``: the
thread was not running. A real library call beneath the wait (SQLite, zstd) still counts."""


REAL = {name for name, _ in LIBRARIES[:5]}
"""Libraries whose frames under a wait mean the thread ran them (I/O, compression, SQLite)."""


def thread_group(header: str) -> str:
    """Return the thread group of a py-spy ``thread (tid): name`` header."""
    if "MainThread" in header:
        return "event loop"
    if "AnyIO worker" in header:
        return "journal writer (worker threads)"
    if "_connection_worker_thread" in header:
        return "aiosqlite reader"
    return "other threads"


def by_library(lines: Sequence[str]) -> Counter[tuple[str, str]]:
    """Return busy samples per (thread group, library) of py-spy raw output (``--native``).

    A sample goes to the library of its deepest frame that names one; a sample ending in a
    wait (:data:`IDLE`) is idle and left out unless that library is one in :data:`REAL`.
    The event loop counts only inside the loop (not imports).
    """
    libraries = [(name, re.compile(pattern)) for name, pattern in LIBRARIES]
    idle = re.compile(IDLE)
    found: Counter[tuple[str, str]] = Counter()
    # py-spy names a thread in some samples' headers only: name the others by their id.
    names = dict(re.findall(r"^thread \((\d+)\): ([^;]+)", "\n".join(lines), re.M))
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        header, *frames = stack.split(";")
        tid = re.match(r"thread \((\d+)\)", header)
        group = thread_group(names.get(tid.group(1), header) if tid else header)
        if group == "event loop" and "_run_once" not in stack:
            continue
        library = next(
            (
                name
                for frame in reversed(frames)
                for name, pattern in libraries
                if pattern.search(frame)
            ),
            "other native (libc, unresolved)",
        )
        waiting = any(idle.search(frame) for frame in frames[-3:])
        if waiting and library not in REAL:
            continue
        found[(group, library)] += int(count)
    return found


def print_libraries(found: Counter[tuple[str, str]]) -> None:
    """Print each thread group's busy samples, then its libraries' shares of all of them."""
    total = sum(found.values())
    groups: Counter[str] = Counter()
    for (group, _), count in found.items():
        groups[group] += count
    print(f"{total} busy samples (idle left out)")
    for group, in_group in groups.most_common():
        print(f"{in_group / total:6.1%}  {group}")
        for (g, library), count in found.most_common():
            if g == group:
                print(f"        {count / total:6.1%}  {library}")


def main(argv: Sequence[str] | None = None) -> int:
    """Print the share of each concern (or thread and library) in a py-spy raw profile."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    parser.add_argument("folded", help="py-spy record -f raw output")
    parser.add_argument(
        "--libraries", action="store_true", help="split by thread and library (--native run)"
    )
    args = parser.parse_args(argv)
    if args.libraries:
        with open(args.folded) as lines:
            found = by_library(list(lines))
        if not found:
            print("no busy samples in this profile", file=sys.stderr)
            return 1
        print_libraries(found)
        return 0
    with open(args.folded) as lines:
        total, shares = summarise(list(lines))
    if not total:
        print("no samples of the kernel's event loop in this profile", file=sys.stderr)
        return 1
    print(f"{total} samples")
    for concern, count in shares.most_common():
        print(f"{count / total:6.1%}  {concern}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

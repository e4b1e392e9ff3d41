"""Summarise a py-spy profile of P1 by kernel concern.

::

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
    ("task spawn per context; adapter call pool", r"TaskGroup\.start_soon|_spawn_effect|CallPool"),
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


def main(argv: Sequence[str] | None = None) -> int:
    """Print the share of each concern in a py-spy raw profile."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    parser.add_argument("folded", help="py-spy record -f raw output")
    args = parser.parse_args(argv)
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

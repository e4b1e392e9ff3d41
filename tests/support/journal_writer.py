"""Append to the journal at argv[1] until killed, printing each acknowledged seq.

The crash test runs this as a subprocess and kills it with SIGKILL at a random
point: every seq printed here was acknowledged by ``Journal.append``, so it must
still be in the journal when it is reopened. With ``lazy`` as argv[2], half the appenders
append with ``durable=False`` (their transactions alone commit without a sync of their own:
a killed process must lose none of them either).
"""

import sys

import anyio

from kernel.core.events import Draft, TriggerFired
from kernel.journal.opening import open_journal
from kernel.journal.store import Journal

APPENDERS = 4


async def append_forever(journal: Journal, appender: int, durable: bool = True) -> None:
    """Append batches of one to three events, printing their seqs once acknowledged."""
    for i in range(sys.maxsize):
        drafts = [
            Draft(payload=TriggerFired(topic="crash", facts={"appender": appender, "i": i, "k": k}))
            for k in range(1 + i % 3)
        ]
        events = await journal.append(drafts, durable=durable)
        sys.stdout.write("".join(f"{event.seq}\n" for event in events))
        sys.stdout.flush()


async def main(path: str, lazy: bool) -> None:
    """Run the appenders until the process is killed."""
    async with open_journal(path) as journal, anyio.create_task_group() as tg:
        for appender in range(APPENDERS):
            tg.start_soon(append_forever, journal, appender, not (lazy and appender % 2))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2:] == ["lazy"])

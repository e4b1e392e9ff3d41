"""Performance of the kernel, measured against baselines in the same run.

Run ``python -m benchmarks`` (about 10 minutes on 2 cores) or
``python -m benchmarks --quick`` (well under a minute, smaller sizes, said in
the table); add ``--json PATH`` to keep the figures. docs/benchmarks.md
describes each figure and holds the latest full run. Performance
lives here, never in tests: no test asserts a timing.

Figures:

- B1: asyncio.Queue ping-pong round trips per second between two tasks.
- B2: aiosqlite rows per second, executemany of 100 rows per transaction, WAL,
  synchronous=FULL.
- P1: durable DecisionFlows per second through the real kernel (telemetry off),
  with scripted agents and a no-op adapter; every flow must end CLOSED.
- R1: P1 / B1, paired within each round.
- C1, G1: CPU per flow (all threads) and the cyclic GC's share of P1's time.
- E1, E2, J1: events per flow, events per second, journal bytes per event.
- P2: P1 with spans exported over OTLP/HTTP to a receiver process; S2: the
  share of the expected spans that reached it.
- P3: added latency trigger -> CLOSED at 500 flows/s offered (p50, p99).
- P4: DIM verdicts on the trading pack, against a bare function.
- P5: replay (fold every projection) and verify (chain + projection hash), events folded/s
  (derived events included); P5.rows: rows/s.
- P6: journal bytes per event on disk for the trading simulation, with a breakdown.
- P7: opening a journal of 1M events with checkpoints until its state is ready.
- P8: resident memory growth between 100k and 200k closed flows (own process).
- P9: DBOS, LangGraph, autogen-core and Temporal doing one decision (extra
  ``[bench]``), each skipped with its reason when not installed; R9.x: P1 / peer,
  paired per round (each peer runs in its own process right after the round's P1).
- P14: Microsoft's Agent Governance Toolkit doing the same governed decision, in
  memory (``govern()``) and with a ``FileAuditSink``; R14.x: P1 / it, per round.
- P16: added latency of one governed tool call (``kernel.frameworks.Gate.call``, what
  every framework adapter does) over the bare tool call, p50 and p99, one call at a
  time on SQLite; goal: P3's p50 + 0.2 ms in the same run.
"""

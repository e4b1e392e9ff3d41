"""Performance of the kernel, measured against baselines in the same run.

Run ``python -m benchmarks`` (about 5 minutes) or ``python -m benchmarks --quick``
(well under a minute); add ``--json PATH`` to keep the figures. Performance
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
"""

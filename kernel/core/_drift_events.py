"""The drift events: a monitor's breach, recorded with the window that proves it.

A breach (:class:`DriftBreached`) is derived from the journal by a pack's monitor
(kernel.policy.monitors) and evaluated by kernel.state.drift: a pure function of the
events recorded in the window and the time the breach records (``window_end_ns``), so
anyone holding the journal can evaluate the same window again and find the same value
(``kernel.state.drift.reevaluate``). The action it led to is recorded apart, as the
kernel records every status change: an ``AgentStatusChanged`` with operator ``drift``
and the breach's seq in its reason.
"""

from __future__ import annotations

from kernel.core._records import Payload


class DriftBreached(Payload, frozen=True, tag=True):
    """A monitor's metric crossed its bound for one agent (or principal).

    Attributes:
        pack: the pack that declares the monitor (its ref, ``name@version``).
        monitor: the monitor's name.
        metric: what it measures.
        by: ``agent`` or ``principal``; ``subject`` is that agent's id or the
            principal's ``tenant/user``.
        value: the metric over the window.
        bound: the bound it crossed (the fixed one, or factor times the baseline).
        baseline: the baseline window's value, when the monitor has one.
        window_start_ns / window_end_ns: the evidence window, on the kernel's clock:
            events with ``window_start_ns < ts <= window_end_ns``.
        first_seq / last_seq: the first and last journal seq the window counted.
        samples: the observations the window counted.
        as_of_seq: the journal's last seq when it was evaluated: events after it are not
            in the window, whatever their time (0: the whole journal up to the window's end).
        action: what the pack said to do (``notify``, ``demote``, ``suspend``).
    """

    pack: str
    monitor: str
    metric: str
    by: str
    subject: str
    value: float
    bound: float
    window_start_ns: int
    window_end_ns: int
    samples: int
    action: str
    baseline: float | None = None
    first_seq: int = 0
    last_seq: int = 0
    as_of_seq: int = 0

"""Durations and packs as a person reads them, on every surface that shows a flow.

The journal keeps nanoseconds; a person reads ``49 min 24 s``, not ``+2964427.293 ms``.
:func:`duration` picks the largest sensible unit and keeps one smaller where it still
says something (``2 h 05 min``), and the sub-second ones with the precision they need
(``12.3 ms``, ``1.52 s``): ``dirk show`` and the console's flow page both use it.
"""

from __future__ import annotations

from collections.abc import Iterable

from kernel.core import events as ev
from kernel.core.events import Event

_US = 1_000
_MS = 1_000_000
_S = 1_000_000_000
_MIN = 60 * _S
_H = 60 * _MIN
_D = 24 * _H


def duration(ns: int) -> str:
    """``ns`` nanoseconds in the largest sensible unit: ``850 µs``, ``12.3 ms``, ``49 min 24 s``."""
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    return sign + _positive(ns)


def _positive(ns: int) -> str:
    if ns == 0:
        return "0 s"
    if ns < _MS:
        return f"{ns // _US} µs" if ns >= _US else f"{ns} ns"
    if ns < _S:
        return f"{ns / _MS:.1f} ms"
    if ns < _MIN:
        return f"{ns / _S:.2f} s"
    if ns < _H:
        minutes, rest = divmod(ns // _S, 60)
        return f"{minutes} min {rest:02d} s"
    if ns < _D:
        hours, rest = divmod(ns // _MIN, 60)
        return f"{hours} h {rest:02d} min"
    days, rest = divmod(ns // _H, 24)
    return f"{days} d {rest} h"


def offset(ns: int) -> str:
    """An event's time after its flow's first, as a narrative's column shows it (``+1.52 s``)."""
    return f"+{duration(ns)}"


def judged_by(events: Iterable[Event], packs: Iterable[ev.PackRef]) -> str:
    """The pack (name and version) whose verdict a flow's latest judgement names, or ""."""
    by_hash = {pack.hash: pack for pack in packs}
    found = ""
    for event in events:
        payload = event.payload
        if isinstance(payload, ev.ProposalAccepted | ev.ProposalRejected | ev.FlowEscalated):
            pack = by_hash.get(payload.pack)
            version = getattr(payload, "version", "") or (pack.version if pack else "")
            name = pack.name if pack else ""
            found = f"{name} {version}".strip() if name or version else found
    return found

"""The cyclic garbage collector paused while a whole journal is folded.

A fold builds what lasts (the projections) and holds no reference cycles: the projections
reach their domains weakly, events and flow states are not tracked by the collector. Its
automatic runs find nothing to free there, yet each costs in proportion to every tracked
object of the process: on an 8,000-flow journal one full collection over the kernel's heap
in the middle of a replay cost about 7% of it, and of a verify about 9% (issue 45).
:func:`collector_paused` turns the automatic runs off for one fold and back on after it
(what was allocated meanwhile is collected as usual from then on); nested or concurrent
folds share one pause, and a collector someone else turned off stays off.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_pausing = 0
_resume = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the collector's automatic runs for the block (an explicit gc.collect() still
    runs)."""
    global _pausing, _resume
    if _pausing == 0:
        _resume = gc.isenabled()
        gc.disable()
    _pausing += 1
    try:
        yield
    finally:
        _pausing -= 1
        if _pausing == 0 and _resume:
            gc.enable()

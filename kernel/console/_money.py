"""Amounts as people read them: kept here for the console's imports (kernel.audit.units).

``money`` and ``readable`` moved to :mod:`kernel.audit.units`, below both the console
and the MCP server, which show reasons the same way.
"""

from __future__ import annotations

from kernel.audit.units import DIGITS, SYMBOLS, money, readable

__all__ = ["DIGITS", "SYMBOLS", "money", "readable"]

"""What ``dirk serve --example NAME`` serves a journal with: the example's own parts.

An example's run ends with its journal (and its simulated systems' ledgers beside
it); escalations it left waiting need a kernel again for a human's decision to be
applied. Each example module names, in ``serving(files)``, what a kernel on its
journal needs: its packs, its agents (allowed, though none runs: nothing new is
proposed while served), and its simulated systems reopened on their own ledgers.
The systems are served without faults: a person is watching, and what happens to
their approval should be what they approved, not a simulated outage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kernel import Kernel
from kernel.adapters import Adapter
from kernel.policy import PolicyPack


@dataclass
class Served:
    """An example's parts for a served kernel.

    Attributes:
        packs: the packs the example's kernel judged with.
        adapters: its simulated systems, reopened on the ledgers beside the journal.
        allow: its agents.
        bind: called with the kernel once it is open (an adapter that reads its state).
        close: called when the kernel has stopped (the ledgers are closed).
    """

    packs: list[PolicyPack]
    adapters: Mapping[str, Adapter]
    allow: list[str]
    bind: Callable[[Kernel], None] = lambda kernel: None
    close: Callable[[], None] = lambda: None


@dataclass
class RecordedMarket:
    """The market as the journal last recorded it: the feed's prices, no halts.

    The served broker quotes from it (``market.SYMBOL.price`` facts), so an approved
    order executes against the last price the desk saw, and a limit the market has
    since crossed is refused as it would be live.
    """

    kernel: Kernel | None = None
    halted: dict[str, int] = field(default_factory=dict)

    def bind(self, kernel: Kernel) -> None:
        self.kernel = kernel

    @property
    def live(self) -> dict[str, Decimal]:
        if self.kernel is None:
            return {}
        prices: dict[str, Decimal] = {}
        for key, fact in self.kernel.projections.state.items():
            parts = key.split(".")
            if len(parts) == 3 and parts[0] == "market" and parts[2] == "price":
                value: Any = fact.value
                prices[parts[1]] = Decimal(str(value))
        return prices

    def is_halted(self, symbol: str) -> bool:
        return False

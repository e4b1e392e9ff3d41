"""Human-approved limit amendments: one agent's limit, within its pack's bounds, for a while.

A pack declares which limits an operator may amend (``PolicyPack.limits``: a
default, a floor and a ceiling). An operator raises or lowers one of them for
one agent until an expiry; the DIM records the amendment (LimitAmended) or the
refusal (AmendmentRefused) and, from then on, judges that agent's proposals
with the amended value until the expiry passes on the kernel's clock.

Amendments are folded from the journal (``Projections.amendments``), so they
survive a restart, and a replay that asks :func:`in_force` at a proposal's time
gets exactly the limits the live DIM used.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from kernel.core.events import LimitAmended
from kernel.core.reasons import ReasonCode

NS_PER_S = 1_000_000_000


class Amendment(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A limit amended for one agent, as folded from its LimitAmended event."""

    value: int | str
    expires_at_ns: int
    operator: str
    seq: int


class AmendmentInvalid(Exception):
    """An amendment the kernel refused (and recorded as refused), with its reason code."""

    def __init__(self, reason_code: ReasonCode, detail: str) -> None:
        super().__init__(f"{reason_code}: {detail}")
        self.reason_code = reason_code
        self.detail = detail


def folded(event: LimitAmended, seq: int) -> Amendment:
    """Return the amendment a recorded LimitAmended puts in force."""
    return Amendment(
        value=event.value, expires_at_ns=event.expires_at_ns, operator=event.operator, seq=seq
    )


def in_force(amendments: Mapping[str, Amendment], now_ns: int) -> dict[str, int | str]:
    """Return the amended limits still in force at ``now_ns`` (the DIM's Inputs)."""
    return {
        limit: amendment.value
        for limit, amendment in amendments.items()
        if amendment.expires_at_ns > now_ns
    }

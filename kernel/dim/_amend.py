"""The DIM's handling of a limit amendment: the amendment it records, or why not."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from decimal import Decimal
from functools import partial

import msgspec

from kernel.core.events import AmendmentRefused, LimitAmended
from kernel.core.reasons import ReasonCode
from kernel.core.wall import INT_MAX, MAX_DETAIL, AmendmentSpec, InputInvalid, admit, clip, fields
from kernel.policy.packs import LimitSpec, PolicyCatalog, PolicyPack
from kernel.policy.rules import decimal_of
from kernel.runtime.messages import AmendLimit
from kernel.state.amendments import NS_PER_S


def amend(
    msg: AmendLimit, catalog: PolicyCatalog, agents: Collection[str], now_ns: int
) -> LimitAmended | AmendmentRefused:
    """Return the event an amendment request becomes: the amendment, or why not.

    The value must lie within the floor and ceiling of every loaded pack that
    declares the limit; a limit whose default is a whole number takes only whole
    numbers. Floats are refused: limits are money and quantities.
    """

    refuse = partial(_refusal, msg)
    admitted = _admitted(msg)
    if isinstance(admitted, str):
        return refuse(ReasonCode.SCHEMA_INVALID, admitted)
    msg = admitted
    if msg.agent_id not in agents:
        return refuse(ReasonCode.UNKNOWN_AGENT, f"no agent {msg.agent_id!r} is registered")
    specs = _specs(msg.limit, catalog)
    if isinstance(specs, str):
        return refuse(ReasonCode.UNKNOWN_LIMIT, specs)
    whole = any(isinstance(spec.default, int) for _, spec in specs)
    amount = _amount(msg, whole)
    if isinstance(amount, str):
        return refuse(ReasonCode.SCHEMA_INVALID, amount)
    out_of_bounds = _out_of_bounds(msg.limit, amount, specs)
    if out_of_bounds is not None:
        return refuse(ReasonCode.LIMIT_OUT_OF_BOUNDS, out_of_bounds)
    return _amended(msg, amount, whole, specs, now_ns)


def _amended(
    msg: AmendLimit,
    amount: Decimal,
    whole: bool,
    specs: Sequence[tuple[PolicyPack, LimitSpec]],
    now_ns: int,
) -> LimitAmended:
    """The amendment recorded: the value, the bounds every declaring pack allows, its expiry."""
    ttl = Decimal(repr(float(msg.ttl_s)))  # positive, finite and at most MAX_TTL_S (the wall)
    floor = max(Decimal(spec.floor) for _, spec in specs)
    ceiling = min(Decimal(spec.ceiling) for _, spec in specs)
    return LimitAmended(
        limit=msg.limit,
        value=int(amount) if whole else str(amount),
        floor=str(floor),
        ceiling=str(ceiling),
        expires_at_ns=now_ns + int(ttl * NS_PER_S),
        operator=msg.operator,
        reason=msg.reason,
        pack=",".join(pack.hash for pack, _ in specs),
        inbox_id=msg.inbox_id,
    )


def _refusal(msg: AmendLimit, code: ReasonCode, detail: str) -> AmendmentRefused:
    # Every string recorded here is clipped: the request may be anything at all.
    return AmendmentRefused(
        reason_code=code,
        limit=clip(msg.limit),
        value=clip(msg.value, 100),
        operator=clip(msg.operator),
        detail=clip(detail, MAX_DETAIL),
        inbox_id=msg.inbox_id if isinstance(msg.inbox_id, int) else None,
    )


def _specs(limit: str, catalog: PolicyCatalog) -> list[tuple[PolicyPack, LimitSpec]] | str:
    """Each loaded pack that declares the limit, with its spec; or why none does."""
    specs = [(pack, pack.limits[limit]) for pack in catalog.packs if limit in pack.limits]
    if specs:
        return specs
    known = sorted({name for pack in catalog.packs for name in pack.limits})
    return (
        f"no loaded pack declares an amendable limit {limit!r}"
        f" (amendable: {', '.join(known) or 'none'})"
    )


def _admitted(msg: AmendLimit) -> AmendLimit | str:
    """The request as the wall admits it (value and ttl normalised), or why not."""
    try:
        request = admit(
            fields(
                agent_id=msg.agent_id,
                limit=msg.limit,
                value=msg.value,
                ttl_s=msg.ttl_s,
                operator=msg.operator,
                reason=msg.reason,
            ),
            AmendmentSpec,
        )
    except InputInvalid as exc:
        if exc.field in ("operator", "reason"):
            return f"an amendment needs an operator and a reason ({exc.field}: {exc.detail})"
        return f"{exc.field}: {exc.detail}"
    return msgspec.structs.replace(msg, value=request.value, ttl_s=request.ttl_s)


def _amount(msg: AmendLimit, whole: bool) -> Decimal | str:
    """The amended value as a decimal, or why it is none (SCHEMA_INVALID)."""
    amount = decimal_of(msg.value)
    if amount is None:
        return f"{msg.limit}: {msg.value!r} is not an integer or a decimal string (never a float)"
    if not amount.is_finite() or abs(amount) > INT_MAX:
        return f"{msg.limit}: {clip(msg.value, 100)} is out of range"
    if whole and amount != amount.to_integral_value():
        return f"{msg.limit} takes whole units, not {amount}"
    return amount


def _out_of_bounds(
    limit: str, amount: Decimal, specs: Sequence[tuple[PolicyPack, LimitSpec]]
) -> str | None:
    """Why ``amount`` lies outside the first pack's floor or ceiling, if it does."""
    for pack, spec in specs:
        if amount < Decimal(spec.floor) or amount > Decimal(spec.ceiling):
            side = "below the floor" if amount < Decimal(spec.floor) else "above the ceiling"
            bound = spec.floor if amount < Decimal(spec.floor) else spec.ceiling
            return (
                f"{limit} {amount} is {side} {bound} that pack {pack.name} allows"
                f" (floor {spec.floor}, ceiling {spec.ceiling})"
            )
    return None

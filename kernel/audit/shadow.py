"""The shadow report: where a candidate pack decides otherwise than the enforced one.

One report type, read from two sources alike:

- **live** (:func:`live_report`): the differences a shadow recorded while it judged
  beside the enforced pack (``ShadowDiffered``, kernel.dim._shadow), from its
  ``ShadowLoaded`` to its end (retired, promoted, the kernel stopped) or the journal's
  head;
- **history** (:func:`history_report`): the differences replaying the journal with the
  candidate in its pack's place finds (``dirk whatif --pack``'s walk,
  kernel.audit.reverify), over the same window.

Both judge with :func:`kernel.dim.verdict.verdict` on the state before each submission
and compare on :func:`kernel.dim.verdict.outcome_of`, so over the same window of the
same journal the two reports are equal, digest included (the digest leaves the source
out). A report counts the proposals of the candidate's kinds submitted in its window
(``judged``), lists every difference with its flow, agent, principal (tenant/user of
``FlowCreated.on_behalf``) and the money its proposal moves (its cost by currency), and
totals them by reason code, kind, agent, principal and currency.

A promotion records the digest of the live report it was made on
(``ShadowPromoted.report``, with the report's last seq): anyone holding the journal can
compute the same report through that seq and check it. The journal is only read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Sequence

import msgspec

from kernel.audit.counterfactual import Change
from kernel.audit.reverify import rejudge_costed
from kernel.core.events import (
    Event,
    FlowCreated,
    ProposalSubmitted,
    ShadowDiffered,
    ShadowLoaded,
)
from kernel.core.reasons import ReasonCode
from kernel.dim.verdict import money_of
from kernel.journal.store import Journal
from kernel.policy.money import format_money
from kernel.policy.packs import PolicyCatalog, PolicyPack
from kernel.state.shadows import ShadowCount, Shadows


class Difference(msgspec.Struct, frozen=True, kw_only=True):
    """A proposal the candidate judges otherwise than the enforced pack did.

    ``seq`` is the proposal's ProposalSubmitted; ``then`` the enforced verdict and
    ``now`` the candidate's, in ``dirk whatif``'s words; ``reason_code`` and ``detail``
    the candidate's; ``costs`` the proposal's cost by currency (minor units).
    """

    seq: int
    dfid: str
    agent_id: str
    kind: str
    then: str
    now: str
    reason_code: str = ""
    detail: str = ""
    principal: str = ""
    costs: dict[str, int] = {}

    def line(self) -> str:
        """The difference as one line of text."""
        who = f" for {self.principal}" if self.principal else ""
        why = f": {self.reason_code}" if self.reason_code else ""
        detail = f" ({self.detail})" if self.detail else ""
        return (
            f"#{self.seq} flow {self.dfid} {self.kind} by {self.agent_id}{who}:"
            f" {self.then} then, {self.now}{why}{detail}"
        )


class ShadowReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a candidate pack decides otherwise, over the window ``start < seq <= stop``.

    Attributes:
        source: ``live`` (the shadow's records) or ``history`` (a replay); not digested.
        pack / version / hash: the candidate.
        kinds: the kinds it judges.
        start: the seq the window opens after (the shadow's ShadowLoaded, live).
        stop: the last seq the report read.
        judged: proposals of its kinds submitted in the window.
        differences: each differing verdict, in journal order.
        by_reason / by_kind / by_agent / by_principal: differences counted so.
        money: the differing proposals' costs, summed by currency (minor units).
        ended: how the shadow ended (live: retired, promoted, restarted, replaced; "").
    """

    source: str
    pack: str
    version: str
    hash: str
    kinds: list[str]
    start: int
    stop: int
    judged: int
    differences: list[Difference]
    by_reason: dict[str, int]
    by_kind: dict[str, int]
    by_agent: dict[str, int]
    by_principal: dict[str, int]
    money: dict[str, int]
    ended: str = ""

    @property
    def differed(self) -> int:
        """How many verdicts differ."""
        return len(self.differences)


class NoShadow(Exception):
    """The journal records no shadow the report could be about (``code`` says so)."""

    code = ReasonCode.SHADOW_NOT_LOADED


def digest(report: ShadowReport) -> str:
    """The SHA-256 of the report's evidence, as canonical JSON.

    Its source, its end and its last seq are left out: a live report and its replay
    digest alike, and events that change nothing of it (an inbox row verified, another
    pack's flows) leave the digest a reviewer named as it was.
    """
    body = msgspec.to_builtins(report)
    for field in ("source", "ended", "stop"):
        body.pop(field, None)
    return hashlib.sha256(msgspec.json.encode(body, order="sorted")).hexdigest()


async def shadows_of(journal: Journal, stop: int | None = None) -> list[ShadowCount]:
    """Every shadow the journal records (through ``stop``), with its counters."""
    domain = Shadows(None)  # type: ignore[arg-type]  # it reads nothing of the projections
    folds = domain.folds()
    types = ["ShadowLoaded", "ShadowDiffered", "ShadowRetired", "ShadowPromoted", "KernelStarted"]
    for event in await journal.read(1, None if stop is None else stop + 1, types=types):
        folds[type(event.payload)](event)
    return list(domain.shadows.values())


async def live_report(
    journal: Journal, *, shadow: int | None = None, stop: int | None = None
) -> ShadowReport:
    """The report of the shadow loaded at seq ``shadow`` (default: the last one loaded).

    Raises:
        NoShadow: the journal records no shadow (at that seq).
    """
    head = _head(journal, stop)
    count = _chosen(await shadows_of(journal, head), shadow)
    end = count.ended - 1 if count.ended else head
    loaded = (await journal.read(count.loaded, count.loaded + 1))[0].payload
    assert isinstance(loaded, ShadowLoaded)
    recorded = await journal.read(count.loaded + 1, end + 1, types=["ShadowDiffered"])
    differences = [
        _recorded(event, event.payload)
        for event in recorded
        if isinstance(event.payload, ShadowDiffered) and event.payload.shadow == count.hash
    ]
    return await _report(
        journal, "live", (count.name, count.version, count.hash), loaded.kinds,
        (count.loaded, end), differences, count.how,
    )  # fmt: skip


def _head(journal: Journal, stop: int | None) -> int:
    return journal.head_seq if stop is None else min(stop, journal.head_seq)


def _chosen(found: list[ShadowCount], shadow: int | None) -> ShadowCount:
    """The shadow loaded at ``shadow``, or the last loaded; NoShadow when there is none."""
    if shadow is not None:
        found = [s for s in found if s.loaded == shadow]
    if not found:
        where = f" loaded at #{shadow}" if shadow is not None else ""
        raise NoShadow(f"the journal records no shadow pack{where}")
    return found[-1]


def _recorded(event: Event, p: ShadowDiffered) -> Difference:
    """A difference as the shadow recorded it (its seq: the submission that caused it)."""
    return Difference(
        seq=event.caused_by or event.seq,
        dfid=event.dfid or "",
        agent_id=event.agent_id or "",
        kind=p.kind,
        then=p.enforced.words(),
        now=p.judged.would(),
        reason_code=p.judged.reason_code,
        detail=p.judged.detail,
        costs=dict(p.costs),
    )


async def history_report(
    journal: Journal,
    candidates: Sequence[PolicyPack],
    others: Sequence[PolicyPack] = (),
    *,
    start: int = 0,
    stop: int | None = None,
) -> ShadowReport:
    """The report replaying the journal finds for ``candidates`` in their packs' places.

    Args:
        journal: the journal (only read).
        candidates: the candidate pack (its kinds are the report's).
        others: the other packs in force beside it (as the live shadow judges with the
            enforced catalog, the candidate in its pack's place).
        start: count proposals submitted after this seq (a shadow's ShadowLoaded).
        stop: the last seq to read (default: the head).
    """
    head = _head(journal, stop)
    names = {p.name for p in candidates}
    packs = [*candidates, *(p for p in others if p.name not in names)]
    result, proposals = await rejudge_costed(journal, packs, head)
    catalog = PolicyCatalog(packs)
    kinds = sorted({kind for pack in candidates for kind in pack.by_name})
    differences = [
        _replayed(c, money_of(proposals[c.seq], catalog))
        for c in result.changes
        if c.seq in proposals and start < c.seq <= head and c.kind in kinds
    ]
    first = candidates[0]
    return await _report(
        journal, "history", (first.name, first.version, first.hash), kinds, (start, head),
        differences, "",
    )  # fmt: skip


def _replayed(c: Change, costs: dict[str, int]) -> Difference:
    """A difference as replay found it (a verdict change of a submission)."""
    return Difference(
        seq=c.seq, dfid=c.dfid, agent_id=c.agent_id, kind=c.kind, then=c.then, now=c.now,
        reason_code=c.reason_code, detail=c.detail, costs=costs,
    )  # fmt: skip


async def _report(
    journal: Journal,
    source: str,
    pack: tuple[str, str, str],
    kinds: Collection[str],
    window: tuple[int, int],
    differences: list[Difference],
    ended: str,
) -> ShadowReport:
    start, stop = window
    principals, judged = await _principals_and_judged(journal, kinds, start, stop)
    differences = [
        msgspec.structs.replace(d, principal=principals.get(d.dfid, "")) for d in differences
    ]
    money: dict[str, int] = {}
    for d in differences:
        for currency, amount in d.costs.items():
            money[currency] = money.get(currency, 0) + amount
    return ShadowReport(
        source=source,
        pack=pack[0],
        version=pack[1],
        hash=pack[2],
        kinds=sorted(kinds),
        start=start,
        stop=stop,
        judged=judged,
        differences=differences,
        by_reason=_counted(d.reason_code or "-" for d in differences),
        by_kind=_counted(d.kind for d in differences),
        by_agent=_counted(d.agent_id for d in differences),
        by_principal=_counted(d.principal or "-" for d in differences),
        money=dict(sorted(money.items())),
        ended=ended,
    )


async def _principals_and_judged(
    journal: Journal, kinds: Collection[str], start: int, stop: int
) -> tuple[dict[str, str], int]:
    """Each flow's principal (``tenant/user``), and the window's submissions of ``kinds``."""
    principals: dict[str, str] = {}
    for event in await journal.read(1, stop + 1, types=["FlowCreated"]):
        payload = event.payload
        if isinstance(payload, FlowCreated) and payload.on_behalf is not None:
            who = payload.on_behalf.principal
            principals[event.dfid or ""] = f"{who.tenant}/{who.user}"
    judged = sum(
        1
        for event in await journal.read(start + 1, stop + 1, types=["ProposalSubmitted"])
        if isinstance(event.payload, ProposalSubmitted) and event.payload.proposal.kind in kinds
    )
    return principals, judged


def _counted(keys: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def report_lines(report: ShadowReport) -> list[str]:
    """``dirk shadow report``'s text: the totals, each difference, the digest."""
    ended = f", {report.ended}" if report.ended else ""
    lines = [
        f"shadow {report.pack} {report.version} ({report.hash[:16]}), {report.source},"
        f" events after #{report.start} through #{report.stop}{ended}",
        f"  judged {report.judged} proposal(s) of {', '.join(report.kinds) or '-'};"
        f" {report.differed} differ",
    ]
    for title, table in (
        ("by reason", report.by_reason),
        ("by kind", report.by_kind),
        ("by agent", report.by_agent),
        ("by principal", report.by_principal),
    ):
        if table:
            lines.append(f"  {title}: " + ", ".join(f"{k} {n}" for k, n in table.items()))
    if report.money:
        lines.append(
            "  money: " + ", ".join(format_money(a, c) for c, a in report.money.items() if c)
        )
    lines += [f"  {d.line()}" for d in report.differences]
    lines.append(f"digest {digest(report)}")
    return lines

"""The operator inbox's side of the kernel: rows another process wrote, applied as acts.

``dirk decide``, ``dirk agent``, ``dirk rules``, the console and the MCP server write rows into
the journal's operator inbox (:mod:`kernel.inbox`); a running kernel polls it and applies each row
exactly once through the same acts the API offers (:class:`~kernel.acts.OperatorActs`), or records
why it refused it.
"""

from __future__ import annotations

from typing import Any, TypeVar

from kernel import inbox
from kernel.acts import OperatorActs
from kernel.core import events, wall
from kernel.core.errors import KernelShutdown
from kernel.core.reasons import ReasonCode
from kernel.core.wall import InputInvalid
from kernel.inbox import InboxRow
from kernel.policy.contracts import (
    HandshakeRefused,
)
from kernel.runtime.actors import MailboxClosed, Reply
from kernel.runtime.messages import (
    DecideRule,
    RetractRule,
    SetStatus,
    SubmitRule,
)
from kernel.state.projections import AgentStatus
from kernel.state.rulebook import RuleNotInForce, RuleNotPending

M = TypeVar("M")
T = TypeVar("T")


class InboxActs(OperatorActs):
    """The inbox poller, on top of the operator's acts (the Kernel's base)."""

    async def _poll_inbox(self, interval_s: float) -> None:
        """Run the operator inbox poller until the kernel stops."""

        async def decide(row: InboxRow) -> None:
            reply: Reply[Any] = Reply()
            await self._call(self.actors.escalation, inbox.to_decide(row, reply), reply)

        async def amend(row: InboxRow) -> None:
            reply: Reply[Any] = Reply()
            await self._call(self.actors.dim, inbox.to_amend(row, reply), reply)

        async def agent_status(row: InboxRow) -> None:
            checked = self._check_status(inbox.row_fields(row, inbox.AGENT_STATUS_FIELDS))
            reply: Reply[ReasonCode | None] = Reply()
            msg = SetStatus(
                agent_id=checked.agent_id,
                status=AgentStatus(checked.status),
                operator=checked.operator,
                reason=checked.reason,
                inbox_id=row.id,
                reply=reply,
            )
            code = await self._call(self.actors.registry, msg, reply)
            if code is not None:
                raise HandshakeRefused(code, f"no agent {checked.agent_id!r}")

        async def credential(row: InboxRow) -> None:
            await self._issue_credential(inbox.to_credential(row), inbox_id=row.id)

        async def rule(row: InboxRow) -> None:
            body = inbox.row_fields(row, inbox.RULE_FIELDS)
            checked = wall.admit(body, wall.RuleDecisionSpec)
            try:
                await self._rule_act(
                    DecideRule(
                        proposal_seq=checked.proposal_seq,
                        decision=checked.decision,
                        operator=checked.operator,
                        reason=checked.reason,
                        inbox_id=row.id,
                    )
                )
            except RuleNotPending as exc:
                raise InputInvalid("proposal_seq", str(exc)) from exc

        async def rule_change(row: InboxRow) -> None:
            body = inbox.row_fields(row, inbox.RULE_CHANGE_FIELDS)
            action = body.pop("action", None)
            if action not in inbox.RULE_ACTIONS:
                raise InputInvalid("action", f"one of {', '.join(inbox.RULE_ACTIONS)}")
            if action == "retract":
                checked = wall.admit(body, wall.RuleRetractionSpec)
                try:
                    await self._rule_act(
                        RetractRule(
                            rule=checked.rule,
                            operator=checked.operator,
                            reason=checked.reason,
                            inbox_id=row.id,
                        )
                    )
                except RuleNotInForce as exc:
                    raise InputInvalid("rule", str(exc)) from exc
                return
            spec = wall.admit(body, wall.RuleProposalSpec)
            proposal = events.RuleProposed(
                rule=spec.rule,
                title=spec.title,
                content=spec.content,
                labels=list(spec.labels),
                base_version=spec.base_version,
                proposer=spec.operator,
                by_operator=True,
                reason=spec.reason,
            )
            await self._rule_act(
                SubmitRule(
                    proposal=proposal,
                    override=True,
                    operator=spec.operator,
                    reason=spec.reason,
                    inbox_id=row.id,
                )
            )

        async def refuse(row: InboxRow, exc: Exception) -> int:
            operator = row.request.get("operator", "")
            event = await self._record_refusal(
                f"inbox:{inbox.row_type(row)}",
                exc,
                operator if isinstance(operator, str) else "",
                target=row.dfid,
                inbox_id=row.id,
            )
            return event.seq

        handlers = {
            inbox.DECIDE: decide,
            inbox.AMEND: amend,
            inbox.AGENT_STATUS: agent_status,
            inbox.RULE: rule,
            inbox.RULE_CHANGE: rule_change,
            inbox.PROPOSE: self.inbox_agents.propose,
            inbox.CREDENTIAL: credential,
        }
        try:
            await inbox.poll(
                self.journal.path,
                self.clock,
                interval_s,
                self.actors.escalation,
                self.projections,
                handlers,
                refuse,
            )
        except (KernelShutdown, MailboxClosed):
            return

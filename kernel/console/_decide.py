"""A decision made in the browser: the request ``dirk decide`` would post, signed by the console.

The console never decides by itself: it builds the same request ``dirk decide``
builds, checked by the same function (kernel.inbox.prepare.prepare_decision), and
signs it with its own key, a ``door`` in the kernel's keyring, on behalf of the
operator who signed in; the kernel records the operator and, as the signer, the
console. The running kernel (whenever it runs) applies it once and records what it
made of it. The checks here spare the operator a round trip; the kernel checks
everything again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import anyio

from kernel.core.keys import KeyUnusable
from kernel.core.reasons import ReasonCode
from kernel.inbox import Answer, DecideRequest, InboxRequest, RequestRefused, Signer, open_signer
from kernel.inbox.client import keyring_problem, read_answer, taken_seq
from kernel.inbox.prepare import CHOICES, MAX_PARAMS_TEXT, prepare_decision
from kernel.state.projections import Projections
from kernel.state.quorums import Quorums

DECISIONS = CHOICES
__all__ = ["DECISIONS", "MAX_PARAMS_TEXT", "Door", "Refused", "decision_request"]

Refused = RequestRefused
"""A request the console will not post, with its code (as ``dirk decide`` prints it)."""

DOOR = "console"
"""The name the console signs as by default (``dirk operator add console --role door``)."""


def decision_request(
    projections: Projections,
    queued: set[str],
    dfid: str,
    form: Mapping[str, Any],
    operator: str,
) -> DecideRequest:
    """Return the request for a decision form on flow ``dfid`` by ``operator``.

    ``form`` holds ``decision`` (one of DECISIONS), ``reason``, and as the
    decision needs: ``confirm`` (the short hash, to approve HIGH_IMPACT),
    ``params`` (JSON object text, to modify), ``outcome`` and ``external_id``
    (to reconcile).

    Raises:
        Refused: the decision cannot be queued, with the code ``dirk decide`` gives.
    """
    return prepare_decision(
        projections.flows.get(dfid),
        projections.approvals.get(dfid),
        dfid=dfid,
        ballot=projections.domain(Quorums).ballots.get(dfid),
        choice=_text(form, "decision"),
        operator=operator,
        reason=_text(form, "reason").strip(),
        confirm=_text(form, "confirm"),
        params=_text(form, "params"),
        outcome=_text(form, "outcome"),
        external_id=_text(form, "external_id"),
        queued=dfid in queued,
    )


class Door:
    """The console's key: it signs the requests of the operators signed in to it.

    Args:
        location: the journal.
        key: the console's private key file, or a directory holding ``<door>.key``
            (None: ``DIRK_KEY``).
        door: the name the kernel's keyring holds the key under (role ``door``).
        answer_s: how long to wait for the kernel to take a request, so that one it
            refuses at once is shown refused (0: answer queued at once).
    """

    def __init__(
        self,
        location: str,
        key: str | os.PathLike[str] | None = None,
        door: str = DOOR,
        answer_s: float = 0.0,
    ) -> None:
        self.location = location
        self.key = key
        self.door = door
        self.answer_s = answer_s
        self._signer: Signer | None = None

    async def signer(self) -> Signer:
        """Return the console's signer (the key is read once).

        Raises:
            Refused: SIGNATURE_INVALID: no key, an unusable one, or one the keyring refuses.
        """
        if self._signer is None:
            try:
                signer = await open_signer(self.location, self.key, self.door)
            except KeyUnusable as exc:
                raise Refused(
                    ReasonCode.SIGNATURE_INVALID,
                    f"the console has no key to sign with ({exc})",
                ) from None
            problem = keyring_problem(signer, None)
            if problem is not None:
                raise Refused(ReasonCode.SIGNATURE_INVALID, problem)
            self._signer = signer
        return self._signer

    async def post(self, request: InboxRequest, now_ns: int) -> Answer | None:
        """Sign and post ``request``; return what the kernel made of it, if it did in time.

        Raises:
            Refused: the request cannot be signed or would be refused at the kernel's wall.
        """
        signer = await self.signer()
        try:
            row_id = await anyio.to_thread.run_sync(signer.post, request, now_ns)
        except ValueError as exc:  # InputInvalid
            raise Refused(ReasonCode.SCHEMA_INVALID, str(exc)) from None
        if self.answer_s <= 0:
            return None
        seq = None
        with anyio.move_on_after(self.answer_s):
            while seq is None:
                seq = await anyio.to_thread.run_sync(taken_seq, self.location, row_id)
                if seq is None:
                    await anyio.sleep(0.05)
        if seq is None:
            return None
        _, answer = await read_answer(self.location, seq)
        return answer


def _text(form: Mapping[str, Any], key: str) -> str:
    value = form.get(key, "")
    return value if isinstance(value, str) else ""

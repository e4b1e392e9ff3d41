"""Whom a flow acts for, on its spans: ``user.id`` and ``dirk.tenant``, optionally pseudonymised.

Every span of a flow opened on behalf of a principal (``FlowCreated.on_behalf``)
carries the user's id (OpenTelemetry's ``user.id``) and the tenant (``dirk.tenant``),
so a trace viewer filters one user's or one tenant's work. The email never goes on a
span. With a key, the user id is pseudonymised: ``user.id`` is a keyed hash (HMAC-SHA256
of tenant and user, 32 hex digits), the same for the same user under the same key, so
one user's spans still group, while the id itself stays in the journal only. The key
never reaches a span, a log or an event.

:class:`PrincipalSpans` wraps the span projector: it learns each flow's principal from
its ``FlowCreated`` and adds the attributes to the records the projector returns.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping

from opentelemetry.semconv._incubating.attributes.user_attributes import USER_ID

from kernel.core.events import Event, FlowCreated
from kernel.telemetry._drift import TENANT
from kernel.telemetry._projector import SpanProjector
from kernel.telemetry._spans import SpanRecord

PSEUDONYM_KEY_ENV = "DIRK_SPAN_USER_KEY"
"""The environment variable whose value, when set, keys the pseudonyms of user ids."""


def pseudonym(key: bytes, tenant: str, user: str) -> str:
    """The keyed hash that stands for ``user`` of ``tenant`` on spans."""
    message = (
        tenant.encode("utf-8", "surrogatepass") + b"\0" + user.encode("utf-8", "surrogatepass")
    )
    return hmac.new(key, message, hashlib.sha256).hexdigest()[:32]


def principal_attrs(created: FlowCreated, key: bytes | None) -> dict[str, str]:
    """The attributes of a flow's principal on its spans ({} for a flow with none recorded)."""
    behalf = created.on_behalf
    if behalf is None:
        return {}
    who = behalf.principal
    user = pseudonym(key, who.tenant, who.user) if key else who.user
    return {USER_ID: user, TENANT: who.tenant}


def user_key_from_env(env: Mapping[str, str]) -> bytes | None:
    """The pseudonym key ``env`` sets (:data:`PSEUDONYM_KEY_ENV`), or None: ids as they are."""
    value = env.get(PSEUDONYM_KEY_ENV, "")
    return value.encode("utf-8", "surrogatepass") if value else None


class PrincipalSpans(SpanProjector):
    """The span projector whose records carry their flow's principal.

    Args:
        user_key: the key that pseudonymises user ids (None: the ids as recorded).
    """

    def __init__(self, user_key: bytes | None = None) -> None:
        super().__init__()
        self._key = user_key
        self._attrs: dict[str, dict[str, str]] = {}

    def feed(self, events: Iterable[Event]) -> list[SpanRecord]:
        """Take events in seq order; return the ended spans' records, principals added."""
        batch = list(events)
        self._learn(batch)
        records = super().feed(batch)
        for record in records:
            found = self._attrs.get(record.dfid)
            if found:
                record.attrs.update(found)
            elif self._key and record.parent is None and USER_ID in record.attrs:
                # A drift breach about a principal names its user as a flow's spans do.
                attrs = record.attrs
                attrs[USER_ID] = pseudonym(self._key, attrs[TENANT], attrs[USER_ID])
        for dfid in [d for d in self._attrs if not self.is_open(d)]:
            del self._attrs[dfid]
        return records

    def _learn(self, batch: list[Event]) -> None:
        """Keep the principal of each flow ``batch`` opens."""
        for event in batch:
            if event.dfid and isinstance(event.payload, FlowCreated):
                attrs = principal_attrs(event.payload, self._key)
                if attrs and not self.is_open(event.dfid):
                    self._attrs[event.dfid] = attrs

"""Loading a new policy pack version into a running kernel, as an event.

``Kernel.load_pack`` hands the pack to the DIM, which validates it exactly as
``open_kernel`` does (the same PackError messages), records PackLoaded (name,
version, content hash and the hash it replaces) and only then judges with it.
Flows judged before keep their verdicts: each verdict event names the hash of
the pack that decided it. Nothing changes when the pack is invalid.

A new version may add policy kinds but not drop any: flows accepted or waiting
for a human under the old version may still need the kinds they were judged as.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from kernel.core.events import PackLoaded, PackRef
from kernel.policy.packs import PackError, PolicyCatalog, PolicyPack
from kernel.runtime.actors import Outbox
from kernel.runtime.messages import LoadPack
from kernel.state.projections import built_in


def replaced(catalog: PolicyCatalog, pack: PolicyPack, adapters: Collection[str]) -> PolicyCatalog:
    """Return a catalog holding ``pack`` in place of its loaded version.

    Raises:
        PackError: the pack is invalid, drops a kind, or names an adapter nobody registered.
    """
    if not isinstance(pack, PolicyPack):
        raise PackError(f"{pack!r} is not a PolicyPack")
    old = next((p for p in catalog.packs if p.name == pack.name), None)
    packs = [pack if p.name == pack.name else p for p in catalog.packs]
    if old is None:
        packs.append(pack)
    fresh = PolicyCatalog(packs)
    if old is not None:
        dropped = sorted(set(old.by_name) - set(pack.by_name))
        if dropped:
            raise PackError(
                f"pack {pack.name} {pack.version} drops policy kind(s) {', '.join(dropped)}"
                f" that {old.version} defines; flows judged under it may still need them"
            )
    missing = [a for a in fresh.adapters_needed() if a not in adapters and a not in built_in()]
    if missing:
        raise PackError(f"no adapter registered for {', '.join(missing)}")
    return fresh


def load(msg: LoadPack, catalog: PolicyCatalog, active: Mapping[str, PackRef], out: Outbox) -> None:
    """Stage PackLoaded and switch ``catalog`` to the new version (the DIM's handler).

    ``active`` is what the journal says is in force; a version already in force
    records nothing. Proposals handled after this, in this batch too, are judged
    by the new version and their events follow PackLoaded in the journal.
    """
    try:
        fresh = replaced(catalog, msg.pack, msg.adapters)
    except PackError as exc:
        out.reply(msg.reply, exc)
        return
    ref = msg.pack.ref
    staged: dict[str, PackRef] = out.scratch.setdefault("packs", {})
    current = staged.get(ref.name) or active.get(ref.name)
    catalog.adopt(fresh)
    if current is not None and current.hash == ref.hash:
        out.reply(msg.reply, None)
        return
    out.emit(
        PackLoaded(
            pack=ref,
            previous=current.hash if current else "",
            operator=msg.operator,
            reason=msg.reason,
        )
    )
    staged[ref.name] = ref
    out.reply(msg.reply, ref)

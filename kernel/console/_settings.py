"""How one console runs: the settings ``dirk console`` fills from its flags."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    """How one console runs."""

    db: str
    poll_s: float = 0.25
    approval_ttl_s: float | None = 3600.0
    """The kernel's approval TTL, to show each expiry (the journal does not record it)."""
    allowed_hosts: tuple[str, ...] | None = None
    """The names the console answers to (the Host header); None: any. A console on loopback
    answers only to loopback names, so a page elsewhere cannot reach it by DNS rebinding."""
    trace_url: str = ""
    """A link to a flow's trace: ``{trace_id}`` (32 hex digits) and ``{dfid}`` are filled in."""
    key: str | None = None
    """The console's private key (a file, or a directory holding ``<door>.key``); None:
    ``DIRK_KEY``. Without one, the console shows everything and changes nothing."""
    door: str = "console"
    """The name the kernel's keyring holds the console's key under (role ``door``)."""
    answer_s: float = 0.0
    """How long a change waits for the kernel to take it, so that a request the kernel
    refuses at once is shown refused (0: shown queued at once)."""
    tls: bool = False
    """Served over TLS: every cookie is ``Secure`` (as it is for a request a TLS proxy on
    this machine forwards as https)."""
    currency: str = "USD"
    """The currency whose minor units reasons quote (``none``: show the units as recorded)."""

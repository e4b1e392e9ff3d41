"""``python -m kernel.mesh.config``: keys for bus principals, and the nats-server config they need.

::

    python -m kernel.mesh.config key kernel.pem     # a new key (mode 0600), its public half printed
    python -m kernel.mesh.config key bank-executor.pem
    python -m kernel.mesh.config server --kernel kernel.pem --agents-from desk.db \\
        --executor bank=ed25519:... --reader audit=ed25519:... --extra app.json \\
        --listen 127.0.0.1:4222 --store-dir /var/lib/dirk-js > dirk-nats.conf
    nats-server -c dirk-nats.conf

``--agents-from`` reads each agent's current public key from the journal (the verifier
``CredentialIssued`` recorded); ``--agent ID=PUBLIC`` names one by hand. After issuing
or rotating a credential, write the file again and reload the server
(``nats-server --signal reload=<pid>``).

``--extra FILE`` adds an application's own principals: a JSON object naming each one's
key (a public key, or the key file holding its private half) and its subjects, which
must be the application's own (never ``dirk.``, ``_INBOX.`` or a ``$`` API)::

    {"driver": {"key": "driver.pem", "publish": ["sim.*.cue.*"],
                "subscribe": ["sim.*.ask.*"], "responses": true}}
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import msgspec

from kernel.core import keys
from kernel.mesh._config import Grants, server_config
from kernel.mesh._wire import nkey_public


def _pairs(items: Sequence[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, public = item.partition("=")
        if not sep:
            raise ValueError(f"{what} {item!r}: write NAME=PUBLIC_KEY")
        out[name] = public
    return out


def _public(text: str) -> str:
    """A public key given as itself, or as the key file holding its private half."""
    if text.startswith(keys.PREFIX) or (text.startswith("U") and len(text) == 56):
        return text
    return keys.public_text(keys.load_private_key(Path(text)))


def extra_of(path: str) -> dict[str, Grants]:
    """Return the application principals the JSON file at ``path`` names, keys resolved.

    Raises:
        ValueError: the file cannot be read or is not such an object (in one line).
        KeyUnusable: a key is neither a public key nor a usable key file.
    """
    try:
        data = Path(path).read_bytes()
    except (OSError, ValueError) as exc:  # a path that is not text raises ValueError
        raise ValueError(f"--extra {path!r}: {exc}") from None
    try:
        named = msgspec.json.decode(data, type=dict[str, Grants])
    except msgspec.DecodeError as exc:
        raise ValueError(f"--extra {path!r}: {exc}") from None
    return {name: msgspec.structs.replace(g, key=_public(g.key)) for name, g in named.items()}


async def agents_of(db: str) -> dict[str, str]:
    """Return each agent's current public key, as the journal at ``db`` records it."""
    from kernel.core.events import CredentialIssued
    from kernel.journal.opening import open_journal

    found: dict[str, str] = {}
    async with open_journal(db, readonly=True) as journal:
        for event in await journal.read(types=["CredentialIssued"]):
            payload = event.payload
            if isinstance(payload, CredentialIssued) and event.agent_id:
                found[event.agent_id] = payload.verifier
    # Verifiers from before keys (sha256:) name no key: their agents need a new credential.
    return {agent: v for agent, v in found.items() if v.startswith(keys.PREFIX)}


def _agents_from(db: str) -> dict[str, str]:
    try:
        return anyio.run(agents_of, db)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{db}: {exc}") from None
    except Exception as exc:  # a journal that will not open says why, in one line
        raise ValueError(f"{db}: {type(exc).__name__}: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernel.mesh.config", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    key = sub.add_parser("key", help="write a new key file and print its public half")
    key.add_argument("path", type=Path)
    server = sub.add_parser("server", help="print the nats-server configuration")
    server.add_argument("--kernel", required=True, help="the kernel's public key or key file")
    server.add_argument("--agent", action="append", default=[], metavar="ID=PUBLIC")
    server.add_argument("--agents-from", metavar="DB", help="every agent's key from a journal")
    server.add_argument("--executor", action="append", default=[], metavar="ADAPTER=PUBLIC")
    server.add_argument("--reader", action="append", default=[], metavar="NAME=PUBLIC")
    server.add_argument(
        "--extra",
        metavar="FILE",
        help="an application's own principals: JSON {NAME: {key, publish, subscribe, responses}}",
    )
    server.add_argument("--listen", default="127.0.0.1:4222")
    server.add_argument("--store-dir")
    server.add_argument("--tls-cert")
    server.add_argument("--tls-key")
    args = parser.parse_args(argv)
    try:
        if args.command == "key":
            made = keys.write_private_key(args.path)
            public = keys.public_text(made)
            print(public)
            print(f"nkey: {nkey_public(public)}")
            return 0
        if bool(args.tls_cert) != bool(args.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        agents = _agents_from(args.agents_from) if args.agents_from else {}
        agents |= {k: _public(v) for k, v in _pairs(args.agent, "--agent").items()}
        text = server_config(
            kernel=_public(args.kernel),
            agents=agents,
            executors={k: _public(v) for k, v in _pairs(args.executor, "--executor").items()},
            readers={k: _public(v) for k, v in _pairs(args.reader, "--reader").items()},
            extra=extra_of(args.extra) if args.extra else None,
            listen=args.listen,
            store_dir=args.store_dir,
            tls=(args.tls_cert, args.tls_key) if args.tls_cert else None,
        )
    except (ValueError, keys.KeyUnusable, OSError) as exc:
        # One line whatever the file named: a key that is no key is read as a path, and a
        # path may hold a newline or a lone surrogate.
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


def one_line(text: str) -> str:
    """Return ``text`` with every control character and lone surrogate escaped."""
    return "".join(
        c if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF else ascii(c)[1:-1] for c in text
    )


if __name__ == "__main__":
    sys.exit(main())

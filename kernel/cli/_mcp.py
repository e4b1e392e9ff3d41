"""``dirk mcp``: serve a journal's kernel to MCP hosts, over stdio or streamable HTTP.

The SDK is imported only when the command runs (``pip install 'dir-kernel[mcp]'``),
so ``dirk``'s other commands and ``import kernel`` never pay for it.
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from kernel.audit.reverify import PackPathError
from kernel.cli._operator import error
from kernel.cli._proxy import add_proxy
from kernel.cli._replay import packs_from
from kernel.cli._serving import (
    QUIET_LOGGERS,
    Web,
    add_serving_arguments,
    auth_of,
    callers_of,
    transport,
    web_of,
)
from kernel.core.reasons import CliError, ExitCode
from kernel.policy.packs import PackError, PolicyCatalog, PolicyPack

if TYPE_CHECKING:
    from kernel.mcp import Embedded, Follower, Identity


def add_commands(commands: Any) -> None:
    """Add ``mcp`` to ``dirk``'s subparsers."""
    p = commands.add_parser(
        "mcp",
        help="serve the kernel to MCP hosts (stdio; --http HOST:PORT for streamable HTTP)",
        description=(
            "Serve the journal's memory, rulebook and decisions as MCP tools; every agent"
            " write is a proposal the kernel judges. By default the server follows a kernel"
            " running in another process: reads fold the journal, and writes go through its"
            " operator inbox (that kernel must allow the agents). With --kernel it opens the"
            " kernel here, with the memory pack."
        ),
    )
    p.add_argument("--db", help="the journal file (required)")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--agent", metavar="ID", help="over stdio: calls act as this agent")
    who.add_argument("--operator", metavar="NAME", help="over stdio: calls act as this operator")
    p.add_argument(
        "--kernel",
        action="store_true",
        help="open the kernel in this process (no other kernel may run on the journal)",
    )
    p.add_argument(
        "--pack",
        action="append",
        default=[],
        metavar="PATH",
        help=(
            "a policy pack the kernel judges with: FILE.py[:ATTR] or MODULE[:ATTR] (repeatable;"
            " its kinds' schemas go into the propose tool; with --kernel, packs with built-in"
            " adapters only)"
        ),
    )
    p.add_argument(
        "--key",
        metavar="PATH",
        help="a directory of NAME.key files (default: $DIRK_KEY): the server's own, DOOR.key,"
        " signs operator acts; each agent's signs its proposals (dirk operator add)",
    )
    p.add_argument(
        "--door",
        default="mcp",
        metavar="NAME",
        help="the name the kernel's keyring holds the server's key under (default mcp)",
    )
    p.add_argument(
        "--public-url",
        metavar="URL",
        help="with --token-file: the server's MCP URL as hosts reach it (behind a proxy, or"
        " bound to 0.0.0.0), named in its protected-resource metadata (default: from --http)",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="following a kernel: how long a write waits for its answer before QUEUED (default 5)",
    )
    p.add_argument(
        "--currency",
        default="USD",
        metavar="CODE",
        help="the currency whose minor units (cents) reasons quote, shown as such in each"
        " answer's summary (default USD; none: amounts as recorded); detail stays as recorded",
    )
    add_serving_arguments(p, "one 'agent:ID TOKEN' or 'operator:NAME TOKEN' a line")
    p.set_defaults(run=_mcp)
    add_proxy(p.add_subparsers(dest="mcp_command", metavar="{proxy}"))


async def _mcp(args: argparse.Namespace) -> int:
    try:
        import kernel.mcp  # noqa: F401
    except ImportError:
        # The same code as the console's for the same situation.
        return error(
            CliError.EXTRA_MISSING,
            "dirk mcp needs the MCP SDK: pip install 'dir-kernel[mcp]'",
            ExitCode.USAGE,
        )
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    problem = _usage_problem(args)
    if problem is not None:
        return error(CliError.BAD_ARGUMENT, problem, ExitCode.USAGE)
    currency = currency_of(args.currency) or "USD"  # checked above: never the fallback
    callers = callers_of(args)
    if isinstance(callers, int):
        return callers
    try:
        packs = packs_from(args.pack)
    except PackPathError as exc:
        return error(CliError.BAD_PACK_PATH, str(exc), ExitCode.USAGE)
    agents = callers.agents()
    identity = callers.identity()
    web = web_of(args, callers)
    if isinstance(web, int):
        return web
    try:
        async with _backend(args, agents, packs) as backend:
            await serve(backend, identity, web, currency)
    except PackError as exc:
        # Raised on opening the kernel: a pack that needs an adapter dirk mcp has not.
        return error(CliError.BAD_ARGUMENT, str(exc), ExitCode.USAGE)
    return ExitCode.OK


def _usage_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with ``dirk mcp``'s own options (--db, --wait, --currency), or None."""
    if not args.db:
        # Not required by argparse, so that `dirk mcp proxy` (a subcommand) goes without.
        return "dirk mcp needs --db FILE"
    if not (math.isfinite(args.wait) and 0 <= args.wait <= 600):
        return "--wait takes seconds from 0 to 600"
    if currency_of(args.currency) is None:
        return f"--currency takes a currency code (USD, EUR) or none, not {args.currency[:20]!r}"
    return None


def currency_of(text: str) -> str | None:
    """``--currency``'s code in capitals (``usd``: USD), ``none``; None: neither."""
    if text.lower() == "none":
        return "none"
    return text.upper() if len(text) == 3 and text.isascii() and text.isalpha() else None


async def serve(
    backend: Embedded | Follower, identity: Identity, web: Web | None, currency: str = "USD"
) -> None:
    """Serve the MCP tools of ``backend`` to ``identity``'s callers, over ``web`` or stdio.

    Each answer's summary shows amounts in ``currency`` (``none``: as recorded).
    """
    import anyio
    from mcp.server.subscriptions import InMemorySubscriptionBus

    from kernel.mcp import Embedded, build_server, watch_rules

    bus = InMemorySubscriptionBus()
    server = build_server(backend, identity, bus=bus, currency=currency, **auth_of(web))
    async with anyio.create_task_group() as tg:
        if isinstance(backend, Embedded):
            tg.start_soon(watch_rules, bus, backend.kernel.journal)
        await transport(server, web)
        tg.cancel_scope.cancel()


@asynccontextmanager
async def _backend(
    args: argparse.Namespace, agents: list[str], packs: list[PolicyPack]
) -> AsyncIterator[Embedded | Follower]:
    from kernel.mcp import Embedded, Follower

    if not args.kernel:
        catalog = PolicyCatalog(packs)
        yield Follower(
            args.db,
            catalog.schemas,
            scopes={name: kind.scopes for name, kind in catalog.kinds.items()},
            key=args.key,
            door=args.door,
            wait_s=args.wait,
            answer_s=args.wait,
        )
        return
    from kernel.boot import open_kernel
    from kernel.config import KernelConfig
    from kernel.core.events import Principal

    # The kernel this process opens vouches for one local user, as ``dirk serve`` does.
    config = KernelConfig(principal=Principal(tenant="local", user="you"))
    async with open_kernel(
        args.db, packs=packs, adapters={}, allow=agents, config=config
    ) as kernel:
        yield Embedded(kernel)

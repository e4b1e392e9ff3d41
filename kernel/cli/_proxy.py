"""``dirk mcp proxy``: the governing MCP gateway in front of existing MCP servers.

Served as ``dirk mcp`` is (stdio for one ``--agent``; ``--http`` with a token file
of agents), it opens the kernel on ``--db`` with the pack made from the upstreams'
tools (kernel.gateway). The SDK is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING, Any

import anyio

from kernel.cli._operator import error
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

if TYPE_CHECKING:
    from kernel.mcp import Identity


def add_proxy(commands: Any) -> None:
    """Add ``proxy`` under ``dirk mcp``."""
    p = commands.add_parser(
        "proxy",
        help="govern existing MCP servers: each of their tool calls is a proposal",
        description=(
            "Stand in front of the MCP servers a config file names (stdio commands or"
            " streamable-HTTP URLs): each tool the file names is a policy kind with the"
            " tool's own schema and the file's bounds, limits and approval thresholds; a"
            " tool it does not name is refused. Every call is judged, recorded and carried"
            " out once by the kernel opened here on --db. See docs/frameworks.md."
        ),
    )
    p.add_argument("--config", required=True, metavar="FILE", help="the gateway's TOML file")
    # Not ``dest="db"``: dirk refuses a --db that is not there, but the gateway owns its
    # journal (it opens the kernel itself) and creates it on first use.
    p.add_argument(
        "--db",
        dest="gateway_db",
        required=True,
        metavar="FILE",
        help="the gateway's journal file (created on first use)",
    )
    p.add_argument("--agent", metavar="ID", help="over stdio: calls act as this agent")
    add_serving_arguments(p, "one 'agent:ID TOKEN' a line (dirk mcp's format)")
    p.add_argument(
        "--listing",
        metavar="FILE",
        help=(
            "save the upstreams' tools as listed at start (JSON): with the config, what"
            " kernel.gateway.pack_of makes the pack again from, for dirk verify --verdicts"
        ),
    )
    p.set_defaults(run=_proxy)


async def _proxy(args: argparse.Namespace) -> int:
    try:
        from kernel.gateway import ConfigError, read_config
    except ImportError:
        # The same code as dirk mcp's and the console's for the same situation.
        return error(
            CliError.EXTRA_MISSING,
            "dirk mcp proxy needs the MCP SDK: pip install 'dir-kernel[mcp]'",
            ExitCode.USAGE,
        )
    for name in (*QUIET_LOGGERS, "mcp.client"):
        logging.getLogger(name).setLevel(logging.WARNING)
    callers = callers_of(args)
    if isinstance(callers, int):
        return callers
    tokens = callers.tokens
    if any(p.role != "agent" for p in tokens.values()):
        return error(
            CliError.BAD_ARGUMENT, "the gateway serves agents: 'agent:ID TOKEN' lines only"
        )
    try:
        config = read_config(args.config)
    except ConfigError as exc:
        return error(CliError.BAD_ARGUMENT, str(exc), ExitCode.USAGE)
    agents = callers.agents()
    web = web_of(args, callers)
    if isinstance(web, int):
        return web
    return await _govern(args, config, callers.identity(), agents, web)


async def _govern(
    args: argparse.Namespace, config: Any, identity: Identity, agents: list[str], web: Web | None
) -> int:
    """Open the gateway over the upstreams of ``config`` and serve its agents until stopped."""
    from kernel.config import KernelConfig
    from kernel.core.events import Principal
    from kernel.gateway import PackFailure, UpstreamDown, open_gateway, write_listing
    from kernel.policy.packs import PackError

    new = not await anyio.Path(args.gateway_db).exists()
    try:
        async with open_gateway(
            config,
            args.gateway_db,
            identity=identity,
            agents=agents,
            # The kernel this process opens vouches for one local user, as `dirk mcp` does;
            # a caller whose user token names its own principal acts for that one instead.
            kernel_config=KernelConfig(principal=Principal(tenant="local", user="you")),
            server_options=auth_of(web),
        ) as gateway:
            if args.listing:
                try:
                    write_listing(args.listing, gateway.listed)
                except OSError as exc:
                    return error(CliError.BAD_ARGUMENT, f"cannot write --listing: {exc}")
            if new:
                print(f"dirk mcp proxy: created the journal {args.gateway_db}", file=sys.stderr)
            kinds = ", ".join(route.kind for route in gateway.routes.values()) or "none"
            print(f"dirk mcp proxy: governing {kinds}", file=sys.stderr, flush=True)
            await transport(gateway.server, web)
    except (UpstreamDown, PackFailure, PackError) as exc:
        return error(CliError.BAD_ARGUMENT, str(exc))
    return ExitCode.OK

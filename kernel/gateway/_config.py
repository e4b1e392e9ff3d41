"""The gateway's configuration: its upstream MCP servers, and what its pack says of their tools.

A TOML file (``dirk mcp proxy --config FILE``)::

    pack = "gateway"          # the policy pack's name (and version, below)
    version = "0.1.0"
    max_attempts = 3          # refusals in a row that stop a conversation (the retry governor)

    [upstreams.notes]         # an upstream over stdio: the command the gateway starts
    command = ["python", "notes_server.py"]
    timeout_s = 30            # how long one call may take before its outcome is unknown

    [upstreams.pay]           # an upstream over streamable HTTP
    url = "http://127.0.0.1:8700/mcp"

    [tools."pay.transfer"]    # a tool the pack names: "<upstream>.<tool>" (its policy kind)
    impact = "HIGH_IMPACT"
    max = { amount_cents = 1_000_000 }      # invariants: RISK_LIMIT_EXCEEDED beyond
    one_of = { currency = ["EUR", "USD"] }  # CONSTRAINT_VIOLATION otherwise
    limit = { amount_cents = "max_transfer" }  # at most the agent's limit (amendable)
    approve_above = { amount_cents = 50_000 }  # a human approves above this

    [limits.max_transfer]
    default = 200_000
    floor = 0
    ceiling = 1_000_000

    [agents]                  # the tools each agent may call (its manifest); unnamed: all
    ide = ["pay.transfer"]

A tool the file does not name under ``[tools]`` is no policy kind: calling it is
refused and recorded. Everything is checked when the file is read
(:class:`ConfigError` says what and where), before any upstream starts.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Literal

import msgspec

from kernel.core.text import id_problem

UPSTREAM_NAME = re.compile(r"^[A-Za-z0-9-]{1,32}$")
"""An upstream's name: no ``_`` or ``.``, so ``<upstream>_<tool>`` names one tool."""

Amount = int | str
"""An integer, or a decimal string."""


class ConfigError(ValueError):
    """The gateway's configuration cannot be used: it says what and where."""


class UpstreamSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One upstream MCP server.

    Attributes:
        command: over stdio: the program and its arguments (the gateway starts it).
        env: environment variables added to the command's (stdio).
        cwd: the command's working directory (default: the config file's directory).
        url: over streamable HTTP: the server's URL.
        headers: HTTP headers sent with each request (an upstream's own token).
        timeout_s: how long one call may take; past it, its outcome is unknown.
        connect_s: how long connecting (and starting the command) may take.
        attempts: connection attempts per call before it fails (nothing was sent).
        idempotency_key: the argument that takes the kernel's idempotency key; by
            default ``idempotency_key`` when a tool's schema has it; "" for none.
    """

    command: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str = ""
    headers: dict[str, str] = {}
    timeout_s: float = 30.0
    connect_s: float = 15.0
    attempts: int = 2
    idempotency_key: str | None = None


class ToolPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the pack says of one upstream tool (its policy kind).

    Attributes:
        impact: how much an escalated call can hurt (HIGH_IMPACT: approving it takes
            its action hash typed back).
        min: fields with a lower bound (RISK_LIMIT_EXCEEDED below).
        max: fields with an upper bound (RISK_LIMIT_EXCEEDED above).
        one_of: fields with the values allowed (CONSTRAINT_VIOLATION otherwise).
        limit: fields bounded by an agent's limit, by the limit's name (``[limits]``).
        approve_above: fields above whose amount a human approves (APPROVAL_REQUIRED).
        scopes: the scopes a user needs to call the tool, all of them (the kind's
            ``scopes``: the DIM checks them; tools/list shows a user only the tools its
            token's scopes cover).
        read_only: the tool changes nothing (the kind's ``read_only``: a tenant that fails
            open lets such calls through while the journal's store is away).
    """

    impact: Literal["LOW_IMPACT", "HIGH_IMPACT"] = "HIGH_IMPACT"
    min: dict[str, Amount] = {}
    max: dict[str, Amount] = {}
    one_of: dict[str, list[str | int | bool]] = {}
    limit: dict[str, str] = {}
    approve_above: dict[str, Amount] = {}
    scopes: list[str] = []
    read_only: bool = False


class LimitDef(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An agent's limit: its default, and the floor and ceiling an operator may amend it to."""

    default: Amount
    floor: Amount
    ceiling: Amount


class GatewayConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The gateway: its upstreams and its pack.

    Attributes:
        upstreams: the upstream MCP servers by name.
        tools: what the pack says of each tool it names, by ``<upstream>.<tool>``.
        limits: the agents' limits the tools' ``limit`` entries name.
        pack: the pack's name.
        version: the pack's version (the upstream schemas' digest is appended).
        max_attempts: refusals in a row that stop a conversation.
        confidence: the confidence each call is proposed with (MCP clients report none).
        escalate_below_confidence: the pack's confidence threshold.
        base: the directory relative paths start from (the config file's).
        agents: the tools (``<upstream>.<tool>``) each agent may call, by agent id: its
            manifest's capabilities; an agent not named may call every tool the pack names.
    """

    upstreams: dict[str, UpstreamSpec]
    tools: dict[str, ToolPolicy] = {}
    limits: dict[str, LimitDef] = {}
    pack: str = "gateway"
    version: str = "0.1.0"
    max_attempts: int = 3
    confidence: float = 1.0
    escalate_below_confidence: float = 0.5
    base: str = "."
    agents: dict[str, list[str]] = {}


def read_config(path: str | Path) -> GatewayConfig:
    """Read and check the gateway's configuration file.

    Raises:
        ConfigError: unreadable, not TOML, an unknown key, a wrong type, a bad name.
    """
    where = Path(path)
    try:
        data = tomllib.loads(where.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {where}: {type(exc).__name__}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where} is not TOML: {exc}") from None
    data.setdefault("base", str(where.resolve().parent))
    return config_of(data, str(where))


def config_of(data: object, where: str = "the configuration") -> GatewayConfig:
    """Return ``data`` (a decoded TOML or JSON document) as a checked configuration.

    Raises:
        ConfigError: an unknown key, a wrong type, a bad name.
    """
    try:
        config = msgspec.convert(data, GatewayConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    _check(config, where)
    return config


def _check_upstream(name: str, spec: UpstreamSpec, where: str) -> None:
    if not UPSTREAM_NAME.match(name):
        raise ConfigError(f"{where}: upstream {name!r}: a name is 1 to 32 letters, digits or '-'")
    if bool(spec.command) == bool(spec.url):
        raise ConfigError(f"{where}: upstream {name}: give either command (stdio) or url")
    if spec.url and not spec.url.startswith(("http://", "https://")):
        raise ConfigError(f"{where}: upstream {name}: url is http:// or https://")
    if not 0 < spec.timeout_s <= 3600 or not 0 < spec.connect_s <= 600:
        raise ConfigError(f"{where}: upstream {name}: timeout_s and connect_s are positive")
    if not 1 <= spec.attempts <= 10:
        raise ConfigError(f"{where}: upstream {name}: attempts is 1 to 10")


def _check_tool(kind: str, policy: ToolPolicy, config: GatewayConfig, where: str) -> None:
    upstream, dot, tool = kind.partition(".")
    problem = id_problem(kind)
    if not dot or not tool or upstream not in config.upstreams or problem:
        raise ConfigError(
            f"{where}: [tools.{kind!r}]: name a tool as '<upstream>.<tool>' of an upstream"
        )
    for field, name in policy.limit.items():
        if name not in config.limits:
            raise ConfigError(f"{where}: [tools.{kind!r}] limit {field}: no [limits.{name}]")


def _check_agents(config: GatewayConfig, where: str) -> None:
    for agent, kinds in config.agents.items():
        unknown = [k for k in kinds if k not in config.tools]
        if id_problem(agent) or unknown:
            raise ConfigError(
                f"{where}: [agents] {agent!r}: an agent id, and tools the file names"
                + (f" (not {unknown[0]!r})" if unknown else "")
            )


def _check(config: GatewayConfig, where: str) -> None:
    if not config.upstreams:
        raise ConfigError(f"{where}: no [upstreams]")
    for name, spec in config.upstreams.items():
        _check_upstream(name, spec, where)
    for kind, policy in config.tools.items():
        _check_tool(kind, policy, config, where)
    _check_agents(config, where)
    if problem := id_problem(config.pack) or id_problem(config.version):
        raise ConfigError(f"{where}: pack and version are names: {problem}")
    if not 1 <= config.max_attempts <= 100:
        raise ConfigError(f"{where}: max_attempts is 1 to 100")
    if not 0.0 <= config.confidence <= 1.0:
        raise ConfigError(f"{where}: confidence is 0 to 1")

"""``dirk tenant``: declare a tenant, or set one layer of its policy, by a signed request.

``tenant declare --file SPEC.json`` posts the whole spec (its members and their scopes,
its layered policy; kernel.core.events.TenantSpec as JSON), replacing the one before;
``tenant policy TENANT`` sets one layer (``--user``, ``--kind``, ``--tier``) of its
permission or rate, or replaces a user's scopes (``--scopes``). Each posts one signed
request into the operator inbox, as ``dirk grant`` does (docs/identity.md); the running
kernel records it (TenantDeclared, TenantPolicyChanged) and judges by it from the next call.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import msgspec

from kernel.cli._operator import add_act_arguments, error, post_request
from kernel.core.events import TenantSpec
from kernel.core.reasons import CliError, ExitCode
from kernel.core.wall import InputInvalid
from kernel.inbox.requests import ChangeTenantPolicyRequest, DeclareTenantRequest, normalized


def add_commands(commands: Any) -> None:
    """Register ``dirk tenant declare`` and ``dirk tenant policy``."""
    tenant = commands.add_parser("tenant", help="declare a tenant or set a layer of its policy")
    acts = tenant.add_subparsers(dest="act", required=True)

    declare = acts.add_parser("declare", help="declare a tenant from a JSON spec (replaces it)")
    declare.add_argument("--file", required=True, help="the spec: id, name, members, policy")
    add_act_arguments(declare)
    declare.set_defaults(run=_declare)

    policy = acts.add_parser("policy", help="set one layer of a tenant's policy")
    policy.add_argument("tenant", metavar="TENANT", help="the tenant's id")
    policy.add_argument("--tier", default="*", help="the agent tier (default: every tier)")
    policy.add_argument("--user", default="", help="a user's layer (default: none)")
    policy.add_argument("--kind", default="", help="a kind's layer (default: none)")
    policy.add_argument(
        "--permission", choices=("allow", "flag", "deny"), default=None, help="allow, flag or deny"
    )
    policy.add_argument("--rate", type=int, default=None, metavar="N", help="calls per minute")
    policy.add_argument("--scopes", default=None, help="replace --user's scopes: a,b,c")
    add_act_arguments(policy)
    policy.set_defaults(run=_policy)


def _read_spec(path: str) -> TenantSpec:
    return msgspec.json.decode(Path(path).read_bytes(), type=TenantSpec)


async def _declare(args: argparse.Namespace) -> int:
    try:
        spec = _read_spec(args.file)
    except (OSError, msgspec.DecodeError) as exc:
        return error(CliError.BAD_ARGUMENT, f"{args.file}: {exc}"[:300], ExitCode.USAGE)
    request = DeclareTenantRequest(tenant=spec, operator=args.operator, reason=args.reason)
    return await _post(args, request, f"declaration of tenant {spec.id}")


async def _policy(args: argparse.Namespace) -> int:
    scopes = [s for s in args.scopes.split(",") if s] if args.scopes is not None else None
    request = ChangeTenantPolicyRequest(
        tenant=args.tenant,
        tier=args.tier,
        user=args.user,
        kind=args.kind,
        permission=args.permission,
        rate_per_minute=args.rate,
        scopes=scopes,
        operator=args.operator,
        reason=args.reason,
    )
    return await _post(args, request, f"policy of tenant {args.tenant}")


async def _post(
    args: argparse.Namespace, request: DeclareTenantRequest | ChangeTenantPolicyRequest, what: str
) -> int:
    try:
        checked = normalized(request)
    except InputInvalid as exc:
        return error(CliError.BAD_ARGUMENT, f"{exc.field}: {exc.detail}", ExitCode.USAGE)
    return await post_request(args, checked, what)

"""Who calls an MCP tool of dirk: a fixed principal, or one per bearer token.

Over stdio (or in process) the command line, or the embedding code, sets the principal;
over HTTP each request's bearer token names it: a line of the token file, or a signed
user token (kernel.identity) whose subject is the user the call acts for.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

from mcp.server.mcpserver import Context

from kernel.core.reasons import ReasonCode
from kernel.core.text import id_problem
from kernel.identity import PrincipalInvalid, TokenVerifier, principal_of
from kernel.mcp._backend import Principal, ToolRefused


class Identity:
    """Who calls: a fixed principal (stdio, in process), or one per bearer token (HTTP).

    A bearer token is either one of the token file's (the agent or operator it names,
    with the user it binds, if any) or, with ``users``, a signed user token: its
    subject is the user the call acts for, its ``azp`` claim (the OAuth client it was
    issued to) the agent that calls, else ``token_agent``.

    Args:
        default: the principal of a call that carries no token (stdio, in process).
        tokens: principals by bearer token; when given, a call must carry one.
        users: the verifier of signed user tokens (kernel.identity), if the server takes them.
        token_agent: the agent a user token without ``azp`` calls as ("": it must name one).
    """

    def __init__(
        self,
        default: Principal | None = None,
        tokens: Mapping[str, Principal] | None = None,
        *,
        users: TokenVerifier | None = None,
        token_agent: str = "",
    ) -> None:
        self.default = default
        self.tokens = dict(tokens or {})
        self.users = users
        self.token_agent = token_agent

    def of(self, ctx: Context[Any, Any]) -> Principal:
        headers = None
        try:
            headers = ctx.headers
        except ValueError:
            headers = None
        if self.tokens or self.users is not None:
            value = (headers or {}).get("authorization", "")
            scheme, _, token = value.partition(" ")
            if scheme.lower() != "bearer" or not token:
                raise ToolRefused(ReasonCode.INVALID_SESSION, "no valid bearer token")
            return self.of_token(token.strip())
        if self.default is None:
            raise ToolRefused(ReasonCode.UNAUTHORIZED, "this server has no principal")
        return self.default

    def of_token(self, token: str) -> Principal:
        """Return the principal of a bearer ``token``.

        Raises:
            ToolRefused: INVALID_SESSION for a token this server never issued;
                PRINCIPAL_INVALID for a user token that does not verify.
        """
        found = None
        for known, principal in self.tokens.items():
            # Every token is compared, so the time taken says nothing about which was close.
            if hmac.compare_digest(known.encode(), token.encode("utf-8", "replace")):
                found = principal
        if found is not None:
            return found
        if self.users is None or token.count(".") != 2:
            raise ToolRefused(ReasonCode.INVALID_SESSION, "no valid bearer token")
        try:
            claims, kid = self.users.claims(token)
            user = principal_of(claims, self.users.config.tenant_claim, f"token:{kid}")
        except PrincipalInvalid as exc:
            raise ToolRefused(ReasonCode.PRINCIPAL_INVALID, exc.detail, "authorization") from None
        return Principal(role="agent", name=self._agent_of(claims), on_behalf=user)

    def _agent_of(self, claims: Mapping[str, Any]) -> str:
        """The agent a verified user token calls as: its ``azp``, else ``token_agent``."""
        agent = claims.get("azp", self.token_agent) or self.token_agent
        if not isinstance(agent, str) or not agent or id_problem(agent) is not None:
            raise ToolRefused(
                ReasonCode.PRINCIPAL_INVALID, "the user token names no agent (azp)", "authorization"
            )
        return agent[:128]

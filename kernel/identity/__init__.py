"""Who a call is for, as a door authenticates it: signed user tokens and their keys.

A door (MCP, the gateway, the mesh, an embedding host) hands the kernel a
:class:`kernel.core.events.Principal`. Where the door is given a signed user token
rather than a principal it vouches for itself, :class:`TokenVerifier` checks the
token against :class:`UserTokens` (issuer, audience, the provider's public keys) and
answers the principal it names, or :class:`PrincipalInvalid` (PRINCIPAL_INVALID)
with one line that says why. :mod:`kernel.identity._assertions` signs and verifies
the principal a mesh host vouches for on a proposal it forwards.
"""

from kernel.identity._assertions import AssertionSigner, AssertionVerifier
from kernel.identity._keys import KeyFileError, read_keys
from kernel.identity._tokens import PrincipalInvalid, TokenVerifier, UserTokens, principal_of

__all__ = [
    "AssertionSigner",
    "AssertionVerifier",
    "KeyFileError",
    "PrincipalInvalid",
    "TokenVerifier",
    "UserTokens",
    "principal_of",
    "read_keys",
]

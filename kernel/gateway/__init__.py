"""The governing MCP gateway: existing MCP servers behind the kernel (``dirk mcp proxy``).

It stands in front of upstream MCP servers (stdio commands or streamable-HTTP
URLs, named in a TOML file, :func:`read_config`). Each upstream tool the file
names becomes a policy kind whose schema is the tool's own (``tools/list``) and
whose bounds, limits and approval thresholds the file sets (:func:`gateway_pack`);
a tool it does not name is refused on record. Each ``tools/call`` of a client is
one ``Kernel.propose`` (the connection is the conversation, the request id the
tool-call id): judged, recorded and carried out exactly once by an executor that
calls the upstream, with the idempotency key where the tool takes one. An
escalated call answers ESCALATED with the DFID the client follows with
``wait_flow``. :func:`open_gateway` runs it; docs/frameworks.md says how, and its
limits.

Importing this package imports the MCP SDK (``pip install 'dir-kernel[mcp]'``).
"""

from kernel.gateway._config import (
    ConfigError,
    GatewayConfig,
    LimitDef,
    ToolPolicy,
    UpstreamSpec,
    config_of,
    read_config,
)
from kernel.gateway._pack import (
    Listing,
    PackFailure,
    Route,
    ToolInfo,
    gateway_pack,
    pack_of,
    write_listing,
)
from kernel.gateway._server import (
    CALL_META,
    CONVERSATION_META,
    Gateway,
    GatewayServer,
    answer,
    open_gateway,
)
from kernel.gateway._upstream import Upstream, UpstreamDown, UpstreamExecutor

__all__ = [
    "CALL_META",
    "CONVERSATION_META",
    "ConfigError",
    "Gateway",
    "GatewayConfig",
    "GatewayServer",
    "LimitDef",
    "Listing",
    "PackFailure",
    "Route",
    "ToolInfo",
    "ToolPolicy",
    "Upstream",
    "UpstreamDown",
    "UpstreamExecutor",
    "UpstreamSpec",
    "answer",
    "config_of",
    "gateway_pack",
    "open_gateway",
    "pack_of",
    "read_config",
    "write_listing",
]

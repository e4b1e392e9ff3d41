"""The governance pack through the MCP server's ``propose`` tool, in process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.mcp_kernel import memory_kernel, require_mcp

require_mcp()

from mcp import Client  # noqa: E402

from kernel.beliefs import GOVERNANCE_PACK  # noqa: E402
from kernel.mcp import Embedded, Identity, Principal, build_server  # noqa: E402


async def call(c: Client, **policy: Any) -> dict[str, Any]:
    result = await c.call_tool("propose", {"policy": policy, "explain": "belief work"})
    assert result.structured_content is not None, result
    return dict(result.structured_content)


async def test_an_mcp_client_keeps_governed_beliefs(tmp_path: Path) -> None:
    async with memory_kernel(tmp_path / "j.db", GOVERNANCE_PACK) as kernel:
        server = build_server(Embedded(kernel), Identity(Principal(role="agent", name="ide")))
        async with Client(server) as c:
            for observation, source in (("o1", "wire"), ("o2", "registry")):
                seen = await call(
                    c,
                    kind="governance.record_observation",
                    observation=observation,
                    source=source,
                    task="t",
                )
                assert seen["verdict"] == "ACCEPTED", seen
            proposed = await call(
                c,
                kind="governance.propose_proposition",
                proposition="p",
                text="Acme is in Lyon",
                derived_from=["o1"],
                task="t",
            )
            assert proposed["verdict"] == "ACCEPTED", proposed
            assert proposed["result"]["states"] == {"p": "provisional"}
            asserted = await call(
                c,
                kind="governance.attach_support",
                proposition="p",
                observation="o2",
                state="accepted",
                task="t",
            )
            assert asserted["verdict"] == "REJECTED"
            assert asserted["reason_code"] == "DIRECT_CANONICAL_WRITE_FORBIDDEN"
            duplicate = await call(
                c,
                kind="governance.propose_proposition",
                proposition="p2",
                text="Acme is in Lyon",
                derived_from=["o2"],
                task="t",
            )
            assert duplicate["verdict"] == "ACCEPTED"  # transformed into support of p
            assert duplicate["result"]["states"] == {"p": "accepted"}
    graph = kernel.projections.beliefs
    assert graph.propositions["p"].state == "accepted" and "p2" not in graph.propositions

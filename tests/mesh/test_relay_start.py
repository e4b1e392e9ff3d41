"""The relay outlives a slow server at its start: reading its position again after a timeout.

Under load a JetStream API request can time out; the relay's first requests (its stream,
its position bucket, its last position) once let that timeout end the whole mesh, and the
kernel with it. The server here is real; only the first position request is made to fail as
a slow server's would (``nats.errors.TimeoutError``), at the client's edge.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import nats.errors
from nats.js import JetStreamContext

from kernel import KernelConfig, open_kernel
from kernel.mesh import Relay
from tests.support.mesh_helpers import as_admin
from tests.support.nats import (  # noqa: F401
    NatsServer,
    nats_server_fixture,
    principals_fixture,
    reset_bus,
)
from tests.support.principals import LOCAL


class SlowFirstAnswer:
    """A JetStream context whose first ``key_value`` request times out, as a busy server's."""

    def __init__(self, js: JetStreamContext) -> None:
        self._js = js
        self.timeouts = 0

    async def key_value(self, bucket: str) -> Any:
        if self.timeouts == 0:
            self.timeouts += 1
            raise nats.errors.TimeoutError
        return await self._js.key_value(bucket)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._js, name)


async def test_a_timeout_reading_the_position_is_asked_again(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    await reset_bus(nats_server)
    nc = await as_admin(nats_server)
    try:
        slow = SlowFirstAnswer(nc.jetstream())
        async with open_kernel(
            tmp_path / "j.db", packs=[], adapters={}, allow=[], config=KernelConfig(principal=LOCAL)
        ) as kernel:
            relay = Relay(kernel.journal, slow, retry_s=0.01)  # type: ignore[arg-type]
            head = kernel.journal.head_seq
            assert head >= 1  # KernelStarted, at least
            async with anyio.create_task_group() as tg:
                tg.start_soon(relay.run)
                with anyio.fail_after(30):
                    await relay.wait_for(head)
                tg.cancel_scope.cancel()
        assert slow.timeouts == 1
        assert relay.position >= head
    finally:
        await nc.close()

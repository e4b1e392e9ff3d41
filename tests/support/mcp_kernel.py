"""What the MCP tests share: the SDK (an optional extra), and a kernel with the memory pack."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from kernel import MEMORY_PACK, Kernel, Principal, open_kernel
from kernel.config import KernelConfig, Ports, Supervision
from kernel.testing import ManualClock, SeededIds
from tests.support.helpers import LOCAL


def require_mcp() -> None:
    """Skip (outside CI) or fail (under CI=true) when the mcp extra is not installed."""
    if importlib.util.find_spec("mcp") is not None:
        return
    why = "the MCP SDK is not installed: pip install -e '.[test,mcp]'"
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


@asynccontextmanager
async def memory_kernel(
    path: Path,
    *packs: Any,
    allow: tuple[str, ...] = ("ide",),
    adapters: dict[str, Any] | None = None,
    principal: Principal | None = LOCAL,
) -> AsyncIterator[Kernel]:
    """A kernel with the memory pack (and ``packs``), a manual clock and seeded ids.

    It vouches for ``principal`` (None: for nobody, so a call that names no user is refused).
    """
    async with open_kernel(
        path,
        packs=[*packs, MEMORY_PACK],
        adapters=adapters or {},
        allow=allow,
        config=KernelConfig(
            principal=principal,
            ports=Ports(clock=ManualClock(), ids=SeededIds(5)),
            supervision=Supervision(inbox_poll_s=None),
        ),
    ) as kernel:
        yield kernel

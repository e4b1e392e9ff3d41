"""The principal the test kernels' host vouches for: one local user (docs/identity.md).

A kernel opened with no principal refuses every proposal PRINCIPAL_MISSING; the tests that
are not about principals run as this user, as a single-user host would.
"""

from __future__ import annotations

from kernel.core.events import Principal

LOCAL = Principal(tenant="local", user="tester")
"""The default principal of the suite's kernels (``KernelConfig.principal``)."""

"""No function in kernel/ grows past cyclomatic complexity 20, and few past 10 (issue 39).

A function with a branch per event type, per pack part or per error is how
``narrative._more`` reached 63 and ``_check_pack`` 50: a type goes into a table (the
narrative's ``WORDS``, the span fold's ``_FOLD``), a rule into a named step (the pack
checks' ``_PackCheck``). Measured with radon, as ``radon cc -s -n C kernel`` shows it.
kernel/state/ keeps its own stricter ceiling (tests/state/test_complexity.py).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from radon.complexity import cc_visit

import kernel

KERNEL = Path(kernel.__file__).parent
CEILING = 20
"""No function anywhere in kernel/ above this."""
OVER_TEN_AT_MOST = 60
"""Functions in kernel/ above complexity 10, at most: 134 when issue 39 was written, its goal
60 (reached); lower this as functions come down, never raise it."""
OVER_THE_CEILING: set[str] = set()
"""The functions still above the ceiling (31 when issue 39 was written, none now): the set
only shrinks, and it is empty."""

# Packages whose every function already stays under the ceiling, with how many over 10
# each may keep: the count may only fall.
PACKAGES: dict[str, int] = {
    "audit/counterfactual.py": 1,
    "audit/narrative.py": 0,
    "audit/_words.py": 0,
    "audit/_flow_words.py": 0,
    "audit/_state_words.py": 0,
    "beliefs": 0,
    "console": 0,
    "context": 2,
    "core": 4,
    "escalation": 0,
    "execution": 0,
    "frameworks": 0,
    "gateway": 4,
    "inbox": 6,
    "journal": 7,
    "mcp": 7,
    "mesh": 4,
    "policy": 3,
    "proofs/bundle.py": 0,
    "proofs/check.py": 0,
    "state": 0,
    "telemetry": 5,
}


@cache
def _blocks(where: Path) -> list[tuple[str, int]]:
    modules = sorted(where.rglob("*.py")) if where.is_dir() else [where]
    found: list[tuple[str, int]] = []
    for module in modules:
        for block in cc_visit(module.read_text()):
            name = f"{module.relative_to(KERNEL.parent)}:{block.lineno} {block.fullname}"
            found.append((name, block.complexity))
    return found


def _over(found: list[tuple[str, int]], ceiling: int) -> list[str]:
    return [f"{name} {n}" for name, n in found if n > ceiling]


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_a_package_done_keeps_under_the_ceiling_and_its_count(package: str) -> None:
    found = _blocks(KERNEL / package)
    assert found  # the package itself, not a path that moved
    assert _over(found, CEILING) == []
    over_ten = _over(found, 10)
    assert len(over_ten) <= PACKAGES[package], "; ".join(over_ten)


# Issue 39's two targets for the whole kernel, as a ratchet: no function joins those above
# the ceiling, and the count over 10 only falls.
def test_no_function_in_the_kernel_is_more_complex_than_the_ceiling() -> None:
    found = _blocks(KERNEL)
    assert len(found) > 1000  # the whole kernel, not an empty directory
    over = {name.split(":")[0] + " " + name.split(" ", 1)[1] for name, n in found if n > CEILING}
    assert over <= OVER_THE_CEILING, sorted(over - OVER_THE_CEILING)


def test_few_functions_in_the_kernel_are_over_ten() -> None:
    over_ten = _over(_blocks(KERNEL), 10)
    assert len(over_ten) <= OVER_TEN_AT_MOST, f"{len(over_ten)} over 10: " + "; ".join(over_ten)


def test_the_measure_sees_a_branchy_function() -> None:
    branches = "".join(f"    if x == {n}:\n        return {n}\n" for n in range(CEILING))
    [block] = cc_visit(f"def f(x):\n{branches}    return -1\n")
    assert block.complexity == CEILING + 1

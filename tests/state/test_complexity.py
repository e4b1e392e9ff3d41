"""Every function in kernel/state/ stays at cyclomatic complexity 10 or less (issue 28).

The folds run for every event replayed, and a fold that grows a branch per domain
or per event type is how ``Projections.apply`` once reached 54: a type goes into a
table (``kernel.state.domain``), a rule into a named step. Measured with radon, as
``radon cc -s -n C kernel/state`` shows it.
"""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_visit

import kernel.state

CEILING = 10
STATE = Path(kernel.state.__file__).parent


def test_no_function_in_kernel_state_is_more_complex_than_the_ceiling() -> None:
    found: list[str] = []
    modules = sorted(STATE.rglob("*.py"))
    assert len(modules) > 10  # the package itself, not an empty directory
    for module in modules:
        for block in cc_visit(module.read_text()):
            if block.complexity > CEILING:
                where = module.relative_to(STATE.parent.parent)
                found.append(f"{where}:{block.lineno} {block.fullname} {block.complexity}")
    assert found == [], f"over {CEILING}: " + "; ".join(found)


def test_the_measure_sees_a_branchy_function() -> None:
    branches = "".join(f"    if x == {n}:\n        return {n}\n" for n in range(CEILING))
    [block] = cc_visit(f"def f(x):\n{branches}    return -1\n")
    assert block.complexity == CEILING + 1

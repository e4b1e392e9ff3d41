"""No module reaches into another module's private members.

A name with a leading underscore is its module's own: ``obj._name`` is allowed on
``self``, ``cls`` and ``super()``, for names the accessing module itself defines
(classes of one module may use each other's privates: one module, one reader), and
for the namedtuple API (``_replace``). Everything else is a reach-in: it is how
``open_kernel`` used to finish a Kernel through 15 of its privates. The few left
are listed below with why; an entry that is no longer needed fails too, so the list
only shrinks.
"""

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.support import ROOT

KERNEL = ROOT / "kernel"

NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_fields", "_make"})

ALLOWED: dict[tuple[str, str], str] = {
    ("kernel/cli/_completion.py", "_SubParsersAction"): (
        "argparse names the type of add_subparsers() only privately (typeshed uses it too);"
        " the completion script walks the parser's subcommands through it"
    ),
    ("kernel/cli/_proofs.py", "_SubParsersAction"): "as above: argparse's subparsers",
    ("kernel/cli/_verify.py", "_SubParsersAction"): "as above: argparse's subparsers",
    ("kernel/mcp/_server.py", "_tool_manager"): (
        "the mcp SDK has no public way to reach a registered tool's schema, which the server"
        " narrows to the packs' kinds"
    ),
    ("kernel/mcp/_tools.py", "_tool_manager"): (
        "as above: the mcp SDK; each tool's parameters get the descriptions its docstring"
        " gives (the SDK describes none)"
    ),
    ("kernel/telemetry/_sampling.py", "_root"): (
        "OpenTelemetry's ParentBased sampler keeps its delegates private; the kernel asks"
        " whether each is a ratio on the trace id"
    ),
    ("kernel/telemetry/_sampling.py", "_remote_parent_sampled"): "as above: ParentBased",
    ("kernel/telemetry/_sampling.py", "_remote_parent_not_sampled"): "as above: ParentBased",
    ("kernel/telemetry/_sampling.py", "_local_parent_sampled"): "as above: ParentBased",
    ("kernel/telemetry/_sampling.py", "_local_parent_not_sampled"): "as above: ParentBased",
    ("kernel/telemetry/_sink.py", "_root"): "as above: ParentBased",
}


def _own_names(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions, classes, attributes set on self."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and _is_own(node.value)
        ):
            names.add(node.attr)  # set on self: one of its own (set on another object: a reach-in)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {name for name in names if name.startswith("_")}


def _is_own(receiver: ast.expr) -> bool:
    if isinstance(receiver, ast.Name):
        return receiver.id in ("self", "cls")
    return (
        isinstance(receiver, ast.Call)
        and isinstance(receiver.func, ast.Name)
        and receiver.func.id == "super"
    )


def reach_ins(path: Path) -> Iterator[tuple[str, int, str]]:
    """Yield (attribute, line, receiver) for each private member of another module used."""
    tree = ast.parse(path.read_text())
    own = _own_names(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or name.startswith("__") or name in NAMEDTUPLE_API:
            continue
        if _is_own(node.value) or name in own:
            continue
        yield name, node.lineno, ast.unparse(node.value)


def test_no_module_reaches_into_another_modules_private_members() -> None:
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(KERNEL.rglob("*.py")):
        module = path.relative_to(ROOT).as_posix()
        for name, line, receiver in reach_ins(path):
            found.setdefault((module, name), []).append(f"{module}:{line}: {receiver}.{name}")
    unexplained = [where for key, wheres in found.items() if key not in ALLOWED for where in wheres]
    assert not unexplained, "private members reached from another module:\n" + "\n".join(
        unexplained
    )
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"allowed reach-ins no longer made (remove them from ALLOWED): {stale}"


def test_the_lifecycle_modules_reach_into_nothing() -> None:
    # The modules that open and run a kernel, a journal and the mesh (three of them used
    # to finish their objects through privates), named so that no allow-list entry can
    # ever cover them.
    for module in (
        "boot.py",
        "journal/opening.py",
        "mesh/_bridge.py",
        "api/facade.py",
        "api/lifetime.py",
    ):
        assert list(reach_ins(KERNEL / module)) == [], module


def test_the_check_sees_a_reach_in(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "class K:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "    def peer(self, other):\n"
        "        return other._mine + super()._base\n"
        "def finish(kernel, point):\n"
        "    kernel._checkpointer = None\n"
        "    kernel._stop()\n"
        "    return point._replace(x=1)\n"
    )
    found = [(name, receiver) for name, _, receiver in reach_ins(module)]
    assert found == [("_checkpointer", "kernel"), ("_stop", "kernel")]

"""Inter-actor messages live in one module, one union per receiving actor, and mypy checks sends."""

import ast
import textwrap
import typing
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kernel.context import ContextCompiler
from kernel.dim import IntegrityModule
from kernel.escalation import EscalationDesk
from kernel.execution import ExecutionEngine
from kernel.guards import GuardRunner
from kernel.registry import Registry
from kernel.runtime import messages

KERNEL = Path(messages.__file__).parents[1]

VOCABULARY = {"core", "policy", "adapters", "state", "runtime"}
"""The layers kernel/runtime/messages.py may import: vocabulary and state, never an actor."""

UNIONS = {
    Registry: messages.RegistryMessage,
    ContextCompiler: messages.CompilerMessage,
    IntegrityModule: messages.DimMessage,
    EscalationDesk: messages.EscalationMessage,
    ExecutionEngine: messages.ExecutionMessage,
    GuardRunner: messages.GuardMessage,
}


def kernel_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kernel."):
            found.add(node.module.removeprefix("kernel.").split(".")[0])
    return found


def message_types() -> set[type]:
    return {t for union in UNIONS.values() for t in typing.get_args(union)}


def test_the_messages_module_imports_only_vocabulary() -> None:
    imported = kernel_imports(KERNEL / "runtime" / "messages.py")
    assert imported, "the scan found no import at all"
    assert imported <= VOCABULARY, imported - VOCABULARY


@pytest.mark.parametrize("actor", list(UNIONS), ids=lambda actor: actor.__name__)
def test_each_actor_handles_exactly_its_union(actor: type[Any]) -> None:
    assert typing.get_type_hints(actor.handle)["msg"] == UNIONS[actor]


def test_every_message_is_declared_in_the_messages_module_and_frozen() -> None:
    for message in message_types():
        assert message.__module__ == "kernel.runtime.messages", message
        assert issubclass(message, msgspec.Struct), message
        assert message.__struct_config__.frozen, message


def test_no_actor_module_declares_a_message_class() -> None:
    names = {message.__name__ for message in message_types()}
    for path in KERNEL.rglob("*.py"):
        if path.name == "messages.py":
            continue
        declared = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)}
        assert not declared & names, (path.name, declared & names)


def test_mypy_refuses_a_message_sent_to_the_wrong_actor(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api")
    source = tmp_path / "wrong.py"
    source.write_text(
        textwrap.dedent(
            """
            from kernel.runtime.actors import Mailbox, Outbox
            from kernel.runtime.supervision import ChildSpec
            from kernel.runtime.messages import (
                Compile, DimMessage, EscalationMessage, Escalate, Tick,
            )
            from kernel.registry import Registry

            def sends(out: Outbox, dim: Mailbox[DimMessage], esc: Mailbox[EscalationMessage],
                      registry: Registry) -> None:
                out.send(esc, Tick())
                out.send(dim, Escalate(dfid="f"))  # line 8: the DIM takes no Escalate
                dim.send_nowait(Compile(dfid="f", attempt=1))  # line 9: nor a Compile
                ChildSpec("registry", lambda: registry, dim)  # line 10: wrong actor for the mailbox
            """
        ).lstrip()
    )
    stdout, _, status = api.run(
        [
            "--strict",
            "--follow-imports=silent",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(source),
        ]
    )
    assert status == 1, stdout
    lines = {int(line.split(":")[1]) for line in stdout.splitlines() if ": error:" in line}
    assert lines == {11, 12, 13}, stdout

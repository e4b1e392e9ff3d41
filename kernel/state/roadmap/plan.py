"""Reading the repository's contract and task list, strictly, and the path patterns they use.

Both files are TOML (``.roadmap/contract.toml``, ``.roadmap/tasks.toml``; the ESAA
paper's are YAML, which would need a parser outside the standard library). An
``esaa.open`` proposal carries their text; the DIM validates it here (a refusal names
the file, the field and what is wrong: SCHEMA_INVALID), the git adapter checks it is
what the repository holds at the commit named, and the fold reads it again with the
same function. Nothing a file says is trusted before it passed :func:`read_plan`:
unknown fields, a pattern that could reach outside the tree, a dependency on a task
that does not exist, a cycle, a task with no acceptance check, all refuse the whole
roadmap (fail closed).

Patterns are globs over repository paths: ``*`` matches within one segment, ``?`` one
character of a segment, and a segment ``**`` any number of segments (none included):
``src/**`` is every file under ``src``, ``**/*.md`` every Markdown file. Task patterns
are the same over task ids (no segments: ``*`` matches any run of characters).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import TypeVar

import msgspec

from kernel.core.text import id_problem
from kernel.state.roadmap.model import (
    CONTRACT_FILE,
    TASK_KINDS,
    TASK_TYPES,
    TASKS_FILE,
    AgentContract,
    Check,
    Contract,
    TaskSpec,
)

MAX_FILE_CHARS = 32 * 1024
"""The most a contract or task list may hold (both travel in one proposal)."""
MAX_TASKS = 500
MAX_AGENTS = 64
MAX_CHECKS = 32
MAX_LIST = 64
"""The most patterns, kinds, dependencies or acceptance checks in any one list."""
MAX_PATTERN = 200
MAX_PATH = 255
MAX_SEGMENTS = 32
MAX_TIMEOUT_S = 24 * 3600

TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
"""A task id (a hotfix's adds ``.fixN``: ids in proposals may be up to 80 characters)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
_SEGMENT = re.compile(r"[A-Za-z0-9._+-]+\Z")
_PATTERN_SEGMENT = re.compile(r"[A-Za-z0-9._+*?-]+\Z")
_TASK_PATTERN = re.compile(r"[A-Za-z0-9._*?-]{1,80}\Z")
_T = TypeVar("_T")


class PlanInvalid(Exception):
    """A contract or task list that cannot be in force: ``where`` names the file and field."""

    def __init__(self, where: str, detail: str) -> None:
        super().__init__(f"{where}: {detail}")
        self.where = where
        self.detail = detail


class _Project(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str = ""


class _ContractFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    project: _Project = _Project()
    checks: dict[str, Check] = {}
    agents: dict[str, AgentContract] = {}


class _TasksFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    tasks: list[TaskSpec] = []


def read_plan(contract_text: object, tasks_text: object) -> tuple[Contract, list[TaskSpec]]:
    """Return the contract and the tasks the two files' texts declare, validated.

    Raises:
        PlanInvalid: either text is not a valid file of its kind (the first problem found).
    """
    contract = read_contract(contract_text)
    tasks = read_tasks(tasks_text, contract)
    return contract, tasks


def read_contract(text: object) -> Contract:
    """Return the contract ``text`` declares (see :func:`read_plan`)."""
    raw = _decoded(text, CONTRACT_FILE, _ContractFile)
    _check_name(raw.project.name, f"{CONTRACT_FILE}: $.project.name", optional=True)
    _bounded(raw.checks, MAX_CHECKS, f"{CONTRACT_FILE}: $.checks")
    _bounded(raw.agents, MAX_AGENTS, f"{CONTRACT_FILE}: $.agents")
    for name, check in raw.checks.items():
        _check_check(name, check)
    if not raw.agents:
        raise PlanInvalid(f"{CONTRACT_FILE}: $.agents", "no agent: nobody could do anything")
    for agent, contract in raw.agents.items():
        _check_agent(agent, contract)
    return Contract(project=raw.project.name, checks=raw.checks, agents=raw.agents)


def read_tasks(text: object, contract: Contract) -> list[TaskSpec]:
    """Return the tasks ``text`` declares, checked against ``contract``'s checks."""
    tasks = _decoded(text, TASKS_FILE, _TasksFile).tasks
    if not tasks:
        raise PlanInvalid(f"{TASKS_FILE}: $.tasks", "no task")
    _bounded(tasks, MAX_TASKS, f"{TASKS_FILE}: $.tasks")
    ids: set[str] = set()
    for n, task in enumerate(tasks):
        where = f"{TASKS_FILE}: $.tasks[{n}]"
        if task.id in ids:
            raise PlanInvalid(f"{where}.id", f"task {task.id!r} is declared twice")
        ids.add(task.id)
        _check_task(task, where, contract)
    for n, task in enumerate(tasks):
        for dep in task.depends_on:
            if dep not in ids or dep == task.id:
                what = "itself" if dep == task.id else "no declared task"
                raise PlanInvalid(f"{TASKS_FILE}: $.tasks[{n}].depends_on", f"{dep!r} is {what}")
    cycle = _cycle(tasks)
    if cycle:
        raise PlanInvalid(f"{TASKS_FILE}: $.tasks", f"dependencies form a cycle: {cycle}")
    return tasks


def _decoded(text: object, name: str, kind: type[_T]) -> _T:
    if not isinstance(text, str):
        raise PlanInvalid(name, f"not text: {type(text).__name__}")
    if len(text) > MAX_FILE_CHARS:
        raise PlanInvalid(name, f"{len(text)} characters, over {MAX_FILE_CHARS}")
    problem = _text_problem(text)
    if problem:
        raise PlanInvalid(name, problem)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanInvalid(name, f"not TOML: {exc}") from None
    try:
        return msgspec.convert(data, type=kind)
    except msgspec.ValidationError as exc:
        raise PlanInvalid(name, str(exc)) from None


def _text_problem(text: str) -> str | None:
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        return f"a lone surrogate at character {exc.start}: not UTF-8 text"
    return None


def _bounded(items: Sequence[object] | Mapping[str, object], most: int, where: str) -> None:
    if len(items) > most:
        raise PlanInvalid(where, f"{len(items)} entries, over {most}")


def _check_name(name: str, where: str, *, optional: bool = False) -> None:
    if optional and not name:
        return
    problem = id_problem(name)
    if problem is not None or not name or len(name) > 256:
        raise PlanInvalid(where, f"{name[:64]!r} is not a name ({problem or 'empty or too long'})")


def _check_check(name: str, check: Check) -> None:
    where = f"{CONTRACT_FILE}: $.checks.{name[:64]}"
    if not _NAME.match(name):
        raise PlanInvalid(where, "a check's name is letters, digits, '.', '_', '-' (up to 64)")
    if not check.argv or not check.argv[0]:
        raise PlanInvalid(f"{where}.argv", "a check runs a command: argv[0] is its program")
    _bounded(check.argv, MAX_LIST, f"{where}.argv")
    for n, arg in enumerate(check.argv):
        problem = id_problem(arg)
        if problem is not None or len(arg) > 1024:
            raise PlanInvalid(f"{where}.argv[{n}]", problem or "over 1024 characters")
    if not 1 <= check.timeout_s <= MAX_TIMEOUT_S:
        raise PlanInvalid(f"{where}.timeout_s", f"{check.timeout_s} is not in 1..{MAX_TIMEOUT_S}")


def _check_agent(agent: str, contract: AgentContract) -> None:
    where = f"{CONTRACT_FILE}: $.agents.{agent[:64]}"
    _check_name(agent, where)
    for part in ("kinds", "paths", "tasks"):
        _bounded(getattr(contract, part), MAX_LIST, f"{where}.{part}")
    for n, kind in enumerate(contract.kinds):
        if kind not in TASK_KINDS:
            granted = ", ".join(sorted(TASK_KINDS))
            raise PlanInvalid(f"{where}.kinds[{n}]", f"{kind[:64]!r} is not one of {granted}")
    for n, pattern in enumerate(contract.paths):
        problem = path_pattern_problem(pattern)
        if problem:
            raise PlanInvalid(f"{where}.paths[{n}]", problem)
    for n, pattern in enumerate(contract.tasks):
        if not _TASK_PATTERN.match(pattern):
            raise PlanInvalid(f"{where}.tasks[{n}]", f"{pattern[:64]!r} is not a task pattern")


def _check_task(task: TaskSpec, where: str, contract: Contract) -> None:
    if not TASK_ID.match(task.id):
        raise PlanInvalid(f"{where}.id", "a task id is letters, digits, '.', '_', '-' (up to 64)")
    problem = id_problem(task.title)
    if problem is not None or not task.title.strip() or len(task.title) > 200:
        raise PlanInvalid(f"{where}.title", problem or "a title is one line of up to 200")
    if task.kind not in TASK_TYPES:
        raise PlanInvalid(f"{where}.kind", f"{task.kind[:64]!r} is not one of {TASK_TYPES}")
    if task.phase and not _NAME.match(task.phase):
        raise PlanInvalid(f"{where}.phase", f"{task.phase[:64]!r} is not a phase name")
    _check_task_lists(task, where, contract)


def _check_task_lists(task: TaskSpec, where: str, contract: Contract) -> None:
    for part in ("depends_on", "files", "acceptance"):
        _bounded(getattr(task, part), MAX_LIST, f"{where}.{part}")
    for n, pattern in enumerate(task.files):
        problem = path_pattern_problem(pattern)
        if problem:
            raise PlanInvalid(f"{where}.files[{n}]", problem)
    if not task.acceptance:
        raise PlanInvalid(f"{where}.acceptance", "no check: nothing could ever accept it")
    for check in task.acceptance:
        if check not in contract.checks:
            raise PlanInvalid(f"{where}.acceptance", f"{check[:64]!r} is no check of the contract")


def _cycle(tasks: Sequence[TaskSpec]) -> str:
    """Return the tasks caught in a dependency cycle (Kahn's algorithm), or ""."""
    waiting = {task.id: len(set(task.depends_on)) for task in tasks}
    needed_by = _needed_by(tasks)
    ready = [task_id for task_id, count in waiting.items() if count == 0]
    while ready:
        for after in needed_by.get(ready.pop(), ()):
            waiting[after] -= 1
            if waiting[after] == 0:
                ready.append(after)
    return ", ".join(sorted(task_id for task_id, count in waiting.items() if count))


def _needed_by(tasks: Sequence[TaskSpec]) -> dict[str, list[str]]:
    """Each task, and the tasks that depend on it."""
    needed_by: dict[str, list[str]] = {}
    for task in tasks:
        for dep in set(task.depends_on):
            needed_by.setdefault(dep, []).append(task.id)
    return needed_by


# --- paths and patterns -----------------------------------------------------------------


def path_problem(path: object) -> str | None:
    """Return why ``path`` is not a repository path a patch may name, or None.

    Relative, ``/``-separated, segments of letters, digits and ``._+-``; never ``.``,
    ``..`` or ``.git`` (in any case), never under ``.roadmap/`` (the contract and the
    task list are changed by no agent).
    """
    if not isinstance(path, str):
        return f"not text: {type(path).__name__}"
    if not path or len(path) > MAX_PATH:
        return f"a path is 1 to {MAX_PATH} characters"
    segments = path.split("/")
    if len(segments) > MAX_SEGMENTS:
        return f"more than {MAX_SEGMENTS} segments"
    for segment in segments:
        if not _SEGMENT.match(segment) or segment in (".", ".."):
            return f"segment {segment[:64]!r}: letters, digits and '._+-' only, never '.' or '..'"
        if segment.lower() == ".git":
            return "git's own files are no patch's to change"
    if segments[0] == ".roadmap":
        return "the roadmap's files (the contract, the task list) are changed by no agent"
    return None


def path_pattern_problem(pattern: object) -> str | None:
    """Return why ``pattern`` is not a path pattern (see the module docstring), or None."""
    if not isinstance(pattern, str):
        return f"not text: {type(pattern).__name__}"
    if not pattern or len(pattern) > MAX_PATTERN:
        return f"a pattern is 1 to {MAX_PATTERN} characters"
    for segment in pattern.split("/"):
        if segment == "**":
            continue
        if not _PATTERN_SEGMENT.match(segment) or segment in (".", "..") or "**" in segment:
            return (
                f"segment {segment[:64]!r}: letters, digits, '._+-' and the wildcards"
                " '*', '?' (or a whole segment '**'), never '.' or '..'"
            )
    return None


def matches(path: str, patterns: Iterable[str]) -> bool:
    """Whether ``path`` matches one of the path ``patterns``."""
    return any(_path_regex(p).match(path) for p in patterns)


def task_matches(task_id: str, patterns: Iterable[str]) -> bool:
    """Whether ``task_id`` matches one of the task ``patterns``."""
    return any(_task_regex(p).match(task_id) for p in patterns)


@lru_cache(maxsize=1024)
def _path_regex(pattern: str) -> re.Pattern[str]:
    parts: list[str] = []
    segments = pattern.split("/")
    for n, segment in enumerate(segments):
        last = n == len(segments) - 1
        if segment == "**":
            # Any number of whole segments: none at all, or "a/", "a/b/"... (a file, last).
            parts.append(".+" if last else "(?:[^/]+/)*")
            continue
        parts.append(_wild(segment, "[^/]") + ("" if last else "/"))
    return re.compile("".join(parts) + r"\Z")


@lru_cache(maxsize=1024)
def _task_regex(pattern: str) -> re.Pattern[str]:
    return re.compile(_wild(pattern, ".") + r"\Z")


def _wild(text: str, one: str) -> str:
    return "".join(f"{one}*" if c == "*" else one if c == "?" else re.escape(c) for c in text)

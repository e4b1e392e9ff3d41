"""Reading the repository's contract and task list: strict, fail closed, with the field named."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.state.roadmap.model import CONTRACT_FILE, TASKS_FILE
from kernel.state.roadmap.plan import (
    PlanInvalid,
    matches,
    path_pattern_problem,
    path_problem,
    read_contract,
    read_plan,
    task_matches,
)
from policies.esaa import CONTRACT_FILE as PACK_CONTRACT_FILE
from policies.esaa import TASKS_FILE as PACK_TASKS_FILE
from tests.esaa.kit import CONTRACT, TASKS
from tests.support import ROOT
from tests.support.hostile import hostile_text


def test_the_kits_files_read_as_written() -> None:
    contract, tasks = read_plan(CONTRACT, TASKS)
    assert contract.project == "kit"
    assert sorted(contract.checks) == ["ok", "tests"]
    assert contract.checks["ok"].timeout_s == 30
    assert contract.agents["ada"].paths == ["pkg/**"]
    assert [t.id for t in tasks] == ["T-1", "T-2", "T-3", "T-4"]
    assert tasks[1].depends_on == ["T-1"] and tasks[1].kind == "qa"
    assert tasks[0].kind == "impl"  # the default


def test_the_pack_and_the_domain_name_the_same_files() -> None:
    assert (PACK_CONTRACT_FILE, PACK_TASKS_FILE) == (CONTRACT_FILE, TASKS_FILE)


BAD_CONTRACTS = [
    ("not TOML", "[agents.ada\n", "not TOML"),
    ("an unknown field", CONTRACT.replace("[agents.ada]", "[agents.ada]\ncolour = 1"), "colour"),
    (
        "a kind nobody may be granted",
        CONTRACT.replace('kinds = ["esaa.claim"', 'kinds = ["esaa.open"', 1),
        "$.agents.eve.kinds[0]",
    ),
    ("a path leaving the tree", CONTRACT.replace('"pkg/**"]', '"../**"]', 1), "paths[0]"),
    ("an absolute path", CONTRACT.replace('"pkg/**"]', '"/etc/*"]', 1), "paths[0]"),
    ("** inside a segment", CONTRACT.replace('"pkg/**"]', '"pkg/a**"]', 1), "paths[0]"),
    ("a check with no command", CONTRACT.replace("argv = [", "argv = [] #", 1), "argv"),
    ("a check with no time", CONTRACT.replace("timeout_s = 60", "timeout_s = 0"), "timeout_s"),
    ("a wrong type", CONTRACT.replace("timeout_s = 60", 'timeout_s = "60"'), "timeout_s"),
    ("no agent", CONTRACT.split("[agents.ada]")[0], "no agent"),
    ("a task pattern with a slash", CONTRACT.replace('"T-4"]', '"T/4"]'), "tasks[0]"),
    (
        "a control in an agent id",
        CONTRACT.replace("[agents.ada]", '[agents."a\\u001bda"]'),
        "agents",
    ),
]


@pytest.mark.parametrize(
    ("text", "where"), [c[1:] for c in BAD_CONTRACTS], ids=[c[0] for c in BAD_CONTRACTS]
)
def test_a_contract_that_cannot_be_in_force_is_refused_naming_why(text: str, where: str) -> None:
    with pytest.raises(PlanInvalid) as refused:
        read_plan(text, TASKS)
    assert refused.value.where.startswith(CONTRACT_FILE)
    assert where in str(refused.value)


BAD_TASKS = [
    ("no task", "", "no task"),
    (
        "a task twice",
        TASKS + '\n[[tasks]]\nid = "T-1"\ntitle = "x"\nacceptance = ["ok"]\n',
        "twice",
    ),
    ("an unknown dependency", TASKS.replace('depends_on = ["T-1"]', 'depends_on = ["T-7"]'), "T-7"),
    ("itself", TASKS.replace('depends_on = ["T-1"]', 'depends_on = ["T-2"]'), "itself"),
    (
        "a cycle",
        TASKS.replace('id = "T-1"', 'id = "T-1"\ndepends_on = ["T-4"]'),
        "cycle: T-1, T-2, T-4",
    ),
    ("no acceptance", TASKS.replace('acceptance = ["ok"]', "acceptance = []", 1), "acceptance"),
    ("an unknown check", TASKS.replace('acceptance = ["ok"]', 'acceptance = ["x"]', 1), "'x'"),
    ("an unknown kind", TASKS.replace('kind = "qa"', 'kind = "deploy"'), "kind"),
    ("a bad id", TASKS.replace('id = "T-1"', 'id = "T 1"'), "$.tasks[0].id"),
    ("a title of two lines", TASKS.replace('"its tests"', '"its\\ntests"'), "title"),
    ("a bad file pattern", TASKS.replace('"pkg/one.py"', '"pkg/../one.py"'), "files[0]"),
]


@pytest.mark.parametrize(
    ("text", "where"), [c[1:] for c in BAD_TASKS], ids=[c[0] for c in BAD_TASKS]
)
def test_a_task_list_that_cannot_be_in_force_is_refused_naming_why(text: str, where: str) -> None:
    with pytest.raises(PlanInvalid) as refused:
        read_plan(CONTRACT, text)
    assert refused.value.where.startswith(TASKS_FILE)
    assert where in str(refused.value)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(contract=hostile_text(max_size=200), tasks=hostile_text(max_size=200))
def test_no_text_reads_as_anything_but_a_plan_or_a_refusal(contract: str, tasks: str) -> None:
    try:
        read_plan(contract, tasks)
    except PlanInvalid as exc:
        assert exc.where.startswith((CONTRACT_FILE, TASKS_FILE))


@settings(max_examples=100, deadline=None, derandomize=True)
@given(value=st.one_of(st.integers(), st.none(), st.lists(st.text()), st.binary()))
def test_what_is_not_text_is_refused(value: object) -> None:
    with pytest.raises(PlanInvalid, match="not text"):
        read_contract(value)


@pytest.mark.parametrize(
    ("pattern", "path", "matched"),
    [
        ("pkg/**", "pkg/a.py", True),
        ("pkg/**", "pkg/a/b/c.py", True),
        ("pkg/**", "pkg", False),
        ("pkg/**", "pkgs/a.py", False),
        ("pkg/*.py", "pkg/a.py", True),
        ("pkg/*.py", "pkg/a/b.py", False),
        ("**/*.md", "README.md", True),
        ("**/*.md", "docs/a/b.md", True),
        ("docs/**/index.md", "docs/index.md", True),
        ("docs/**/index.md", "docs/a/b/index.md", True),
        ("a?c.py", "abc.py", True),
        ("a?c.py", "a/c.py", False),
        ("a.py", "aXpy", False),
    ],
)
def test_a_path_pattern_matches_segments_as_globs_do(
    pattern: str, path: str, matched: bool
) -> None:
    assert path_pattern_problem(pattern) is None
    assert matches(path, [pattern]) is matched


@pytest.mark.parametrize(
    ("pattern", "task", "matched"),
    [
        ("T-1*", "T-1", True),
        ("T-1*", "T-1.fix1", True),
        ("T-1", "T-1.fix1", False),
        ("*", "x", True),
    ],
)
def test_a_task_pattern_matches_ids(pattern: str, task: str, matched: bool) -> None:
    assert task_matches(task, [pattern]) is matched


@pytest.mark.parametrize(
    "path",
    ["", "/abs", "a//b", "a/./b", "../x", "a/..", ".git/config", "a/.GIT/x", ".roadmap/tasks.toml",
     "a b.py", "a\\b.py", "é.py", "a\x1b.py", "x" * 300],
)  # fmt: skip
def test_a_path_outside_the_writable_tree_is_refused(path: str) -> None:
    assert path_problem(path) is not None


@pytest.mark.parametrize("path", ["a.py", "pkg/sub/a_b-c+d.py", ".gitignore", "docs/.nojekyll"])
def test_a_plain_relative_path_is_a_path(path: str) -> None:
    assert path_problem(path) is None


def test_the_files_docs_coding_agents_shows_read() -> None:
    text = (ROOT / "docs" / "coding-agents.md").read_text()
    contract, tasks = re.findall(r"```toml\n(.*?)```", text, re.S)
    assert sorted(read_contract(contract).agents) == ["ada"]
    # Its one task depends on one the page leaves out: add it, and the list reads.
    first = '[[tasks]]\nid = "T-1"\ntitle = "slugify()"\nacceptance = ["tests"]\n\n'
    [_, task] = read_plan(contract, first + tasks)[1]
    assert (task.id, task.depends_on, task.acceptance) == ("T-2", ["T-1"], ["tests"])

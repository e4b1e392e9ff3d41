"""One file's git diff: what ``file_diff`` makes, git applies and the DIM reads the same way."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.state.roadmap.diffs import DiffInvalid, parse_diff
from policies.esaa import ZERO, blob_id, file_diff, init_repository
from tests.support.hostile import hostile_text

BEFORE = "one\ntwo\nthree\n"
AFTER = "one\n2\nthree\nfour\n"


def git(repo: Path, *args: str, input: str | None = None) -> str:
    done = subprocess.run(
        ["git", *args], cwd=repo, input=input, capture_output=True, text=True, check=True
    )
    return done.stdout


def test_a_diff_names_both_versions_by_blob_id() -> None:
    diff = file_diff("a/b.txt", BEFORE, AFTER)
    read = parse_diff("a/b.txt", diff)
    assert (read.old, read.new) == (blob_id(BEFORE), blob_id(AFTER))
    assert (read.hunks, read.added, read.removed) == (1, 2, 1)
    created = parse_diff("n.txt", file_diff("n.txt", None, "x\n"))
    assert created.created and not created.deleted and created.new == blob_id("x\n")
    deleted = parse_diff("n.txt", file_diff("n.txt", "x\n", None))
    assert deleted.deleted and not deleted.created
    empty = parse_diff("e.txt", file_diff("e.txt", None, ""))
    assert empty.created and empty.hunks == 0
    with pytest.raises(ValueError, match="no change"):
        file_diff("a", "x", "x")


def test_blob_ids_are_gits(tmp_path: Path) -> None:
    for text in ("", "x", "é\r\n", "no newline"):
        (tmp_path / "f").write_bytes(text.encode())
        assert blob_id(text) == git(tmp_path, "hash-object", "f").strip()
    assert not ZERO.strip("0")


lines = st.lists(
    st.sampled_from(["a", "b", "", " x", "é", "tab\there", "cr\r", "\x0c", "z" * 30]), max_size=12
)
texts = st.builds(lambda ls, end: "\n".join(ls) + end, lines, st.sampled_from(["", "\n"]))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("diffs") / "repo"
    init_repository(root, {"keep": ""})
    return root


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(before=st.none() | texts, after=st.none() | texts)
def test_git_applies_what_file_diff_makes_and_the_dim_reads_it(
    repo: Path, before: str | None, after: str | None
) -> None:
    if before == after:
        return
    path = "dir/f.txt"
    target = repo / path
    target.parent.mkdir(exist_ok=True)
    target.unlink(missing_ok=True)
    if before is not None:
        target.write_bytes(before.encode())
    diff = file_diff(path, before, after)
    read = parse_diff(path, diff)
    assert read.old == (blob_id(before) if before is not None else "")
    assert read.new == (blob_id(after) if after is not None else "")
    git(repo, "apply", "--whitespace=nowarn", "-", input=diff)
    if after is None:
        assert not target.exists()
    else:
        assert target.read_bytes() == after.encode()


def _diff(*lines: str) -> str:
    return "\n".join(lines) + "\n"


A, B = blob_id("a\n"), blob_id("b\n")
HEAD = ("diff --git a/f b/f", f"index {A}..{B} 100644", "--- a/f", "+++ b/f")
SWAP = ("@@ -1 +1 @@", "-a", "+b")
NEW = f"index {ZERO}..{B}"
ODD = [
    ("another path", _diff("diff --git a/g b/g", HEAD[1], "--- a/g", "+++ b/g", *SWAP)),
    ("a rename", _diff(HEAD[0], "similarity index 90%", "rename from f", "rename to g")),
    ("a mode change", _diff(HEAD[0], "old mode 100644", "new mode 100755")),
    ("no index line", _diff(HEAD[0], "--- a/f", "+++ b/f", *SWAP)),
    ("a short index", _diff(HEAD[0], "index 123..456 100644", *HEAD[2:], *SWAP)),
    (
        "a symlink",
        _diff(
            HEAD[0], "new file mode 120000", NEW, "--- /dev/null", "+++ b/f", "@@ -0,0 +1 @@", "+x"
        ),
    ),
    ("counts that do not add up", _diff(*HEAD, "@@ -1 +1,2 @@", "-a", "+b")),
    ("a line that is no hunk's", _diff(*HEAD, *SWAP, "junk")),
    ("an empty hunk line", _diff(*HEAD, "@@ -1,2 +1,2 @@", "-a", "+b", "")),
    ("binary", _diff(HEAD[0], HEAD[1], "GIT binary patch", "literal 1", "Kc${NkU;qFB0RR91")),
    ("headers of another file", _diff(*HEAD[:2], "--- a/g", "+++ b/g", *SWAP)),
    (
        "a new file that removes",
        _diff(HEAD[0], "new file mode 100644", NEW, "--- /dev/null", "+++ b/f", *SWAP),
    ),
    ("a changed file from blob 0", _diff(HEAD[0], NEW + " 100644", *HEAD[2:], *SWAP)),
    ("no hunk", _diff(*HEAD)),
    ("two diffs in one", _diff(*HEAD, *SWAP, *HEAD, *SWAP)),
]


@pytest.mark.parametrize("text", [c[1] for c in ODD], ids=[c[0] for c in ODD])
def test_what_is_not_one_plain_diff_of_its_path_is_refused(text: str) -> None:
    with pytest.raises(DiffInvalid):
        parse_diff("f", text)


def test_a_plain_diff_with_a_last_line_without_newline_reads() -> None:
    diff = file_diff("f", "a\n", "b")
    assert diff.endswith("+b\n\\ No newline at end of file\n")
    assert parse_diff("f", diff).added == 1
    with pytest.raises(DiffInvalid, match="line feed"):
        parse_diff("f", diff[:-1])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(path=hostile_text(max_size=20), text=hostile_text(max_size=300) | st.builds(
    lambda body: "diff --git a/f b/f\n" + body, hostile_text(max_size=200)))  # fmt: skip
def test_no_text_reads_as_anything_but_a_diff_or_a_refusal(path: str, text: str) -> None:
    try:
        parse_diff(path, text)
    except DiffInvalid:
        pass

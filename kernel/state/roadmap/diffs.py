"""A strict reader of one file's git diff: which file it changes, from which version to which.

A ``file_patch`` proposal maps each path to the unified diff of that one file, as
``git diff --full-index`` writes it (``policies.esaa.file_diff`` makes one). The DIM
reads each diff here, and refuses what it cannot read plainly: the path in the headers
must be the path it is filed under, the ``index`` line must name the version it was
made against (git blob ids, 7 to 40 hex digits), every hunk's line counts must add up,
and nothing else may appear (no renames, copies, mode changes, binary patches or
quoted paths). That leaves no room for the DIM and ``git apply`` to read one diff as
two different changes: the adapter applies each diff with git and checks again that
it touches only its path (kernel.state.roadmap names the rules; policies.esaa.git).

What this reader does not do is apply anything: whether the hunks fit the file is
git's to say, at execution (docs/coding-agents.md, "Patches that do not apply").
"""

from __future__ import annotations

import re

import msgspec

MAX_DIFF_CHARS = 48 * 1024
_INDEX = re.compile(r"index ([0-9a-f]{7,40})\.\.([0-9a-f]{7,40})(?: (100644|100755))?\Z")
_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(?: .*)?\Z")
_MODES = ("100644", "100755")
NO_NEWLINE = "\\ No newline at end of file"


class DiffInvalid(Exception):
    """A diff the DIM will not judge; the message says what is wrong and where."""


class FileDiff(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """What one file's diff does: ``old`` and ``new`` are blob ids ("" for none)."""

    path: str
    old: str
    new: str
    hunks: int = 0
    added: int = 0
    removed: int = 0

    @property
    def created(self) -> bool:
        """Whether the diff creates the file."""
        return not self.old

    @property
    def deleted(self) -> bool:
        """Whether the diff deletes the file."""
        return not self.new


def parse_diff(path: str, text: object) -> FileDiff:
    """Return what the diff ``text`` of file ``path`` does.

    Raises:
        DiffInvalid: the text is not one plain git diff of ``path`` (the message says why).
    """
    lines = _lines_of(text)
    if lines[0] != f"diff --git a/{path} b/{path}":
        raise DiffInvalid(f"line 1 is not 'diff --git a/{path} b/{path}'")
    at, created, deleted = _mode_line(lines, 1)
    old, new, at = _index_line(lines, at, created, deleted)
    if at == len(lines):
        if not (created or deleted):
            raise DiffInvalid("no hunk: only an empty file created or deleted has none")
        return FileDiff(path=path, old=old, new=new)
    at = _file_lines(lines, at, path, created, deleted)
    hunks, added, removed = _hunks(lines, at)
    if (created and removed) or (deleted and added):
        raise DiffInvalid("a new file only gains lines, a deleted one only loses them")
    return FileDiff(path=path, old=old, new=new, hunks=hunks, added=added, removed=removed)


def _lines_of(text: object) -> list[str]:
    if not isinstance(text, str):
        raise DiffInvalid(f"not text: {type(text).__name__}")
    if len(text) > MAX_DIFF_CHARS:
        raise DiffInvalid(f"{len(text)} characters, over {MAX_DIFF_CHARS}")
    if not text.endswith("\n"):
        raise DiffInvalid("a diff ends with a line feed")
    return text[:-1].split("\n")


def _mode_line(lines: list[str], at: int) -> tuple[int, bool, bool]:
    line = lines[at] if at < len(lines) else ""
    for word, created in (("new", True), ("deleted", False)):
        prefix = f"{word} file mode "
        if line.startswith(prefix):
            if line[len(prefix) :] not in _MODES:
                raise DiffInvalid(f"line {at + 1}: a file mode is 100644 or 100755")
            return at + 1, created, not created
    return at, False, False


def _index_line(lines: list[str], at: int, created: bool, deleted: bool) -> tuple[str, str, int]:
    found = _INDEX.match(lines[at]) if at < len(lines) else None
    if found is None:
        raise DiffInvalid(
            f"line {at + 1} is not 'index OLD..NEW': a patch names the blob it was made against"
        )
    old, new, mode = found.groups()
    if mode and (created or deleted):
        raise DiffInvalid(f"line {at + 1}: a mode there is for a changed file only")
    zero_old, zero_new = not old.strip("0"), not new.strip("0")
    if zero_old != created or zero_new != deleted:
        raise DiffInvalid(
            f"line {at + 1}: a new file comes from blob 0, a deleted one goes to blob 0,"
            " and only they do"
        )
    return ("" if created else old), ("" if deleted else new), at + 1


def _file_lines(lines: list[str], at: int, path: str, created: bool, deleted: bool) -> int:
    want_old = "--- /dev/null" if created else f"--- a/{path}"
    want_new = "+++ /dev/null" if deleted else f"+++ b/{path}"
    if lines[at : at + 2] != [want_old, want_new]:
        raise DiffInvalid(f"lines {at + 1}-{at + 2} are not '{want_old}' and '{want_new}'")
    return at + 2


def _hunks(lines: list[str], at: int) -> tuple[int, int, int]:
    hunks = added = removed = 0
    while at < len(lines):
        found = _HUNK.match(lines[at])
        if found is None:
            raise DiffInvalid(f"line {at + 1} is not a hunk header '@@ -a,b +c,d @@'")
        old_count, new_count = (int(n) if n is not None else 1 for n in found.group(2, 4))
        at, minus, plus = _hunk_body(lines, at + 1, old_count, new_count)
        hunks, added, removed = hunks + 1, added + plus, removed + minus
    if not hunks:
        raise DiffInvalid("no hunk")
    return hunks, added, removed


def _hunk_body(lines: list[str], at: int, old_left: int, new_left: int) -> tuple[int, int, int]:
    """Read one hunk's lines; return where the next starts and the lines it removes and adds."""
    minus = plus = 0
    start = at
    while old_left > 0 or new_left > 0:
        kind = lines[at][:1] if at < len(lines) else "@"
        if kind not in (" ", "-", "+"):
            raise DiffInvalid(f"line {at + 1}: the hunk from line {start} does not add up")
        old_left -= kind != "+"
        new_left -= kind != "-"
        minus += kind == "-"
        plus += kind == "+"
        if old_left < 0 or new_left < 0:
            raise DiffInvalid(f"line {at + 1}: the hunk from line {start} does not add up")
        at += 1
        if at < len(lines) and lines[at] == NO_NEWLINE:
            at += 1
    return at, minus, plus

"""The adapter of the repository under work: opens the roadmap, commits patches, runs checks.

:class:`GitWorkTree` is the ``git`` adapter of the ``esaa`` pack. It owns one git
working tree (keep it the kernel's: it is reset to the branch's head before each
operation) and carries out three kinds of intent, each at most once per key:

- ``esaa.open``: checks that the commit named is the branch's head and that the
  contract and task list proposed are byte for byte what the repository holds there,
  and that each file it names (``files``) has there the blob id named. A read: nothing
  changes.
- ``esaa.file_patch``: applies each file's diff with ``git apply`` to a private index
  built from the head, commits it (the message carries ``Dirk-Key: <key>`` as its last
  line; a patch whose own message or task carries such a line is refused), and moves
  the branch with a compare-and-swap (``git update-ref NEW OLD``). That one ref update
  *is* the effect: a crash before it leaves nothing behind, a crash after it leaves a
  commit that :meth:`GitWorkTree.lookup` finds by its key, so the kernel records it
  after a restart without a second commit. The commit id is the receipt.
- ``esaa.run_check``: runs the contract's command (the intent carries it: the DIM put
  it there from the contract) in the working tree, in its own process group, with a
  time limit and an environment of its own (nothing of the kernel's), and keeps the
  result under ``.git/dirk/runs/<key>.json`` so a repeated call answers the same.

Before a patch is applied it is checked again, with git's own reader: each diff must
touch exactly the path it is filed under, and the version it was made against (its
``index`` line) must be the one the head holds. What fails these checks, or does not
apply, is refused for good with no effect (``AdapterError(transient=False)``): the
flow ends EXECUTION_FAILED and the journal says why.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio

from kernel.adapters import AdapterError, ExecutionIntent, Receipt

CONTRACT_FILE = ".roadmap/contract.toml"
TASKS_FILE = ".roadmap/tasks.toml"
KEY_TRAILER = "Dirk-Key"
TASK_TRAILER = "Dirk-Task"
OUTPUT_CHARS = 2000
"""How much of a check's output (its end) the receipt keeps."""

_INDEX = re.compile(r"^index ([0-9a-f]{7,40})\.\.", re.M)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_KEY = re.compile(r"[0-9A-Za-z_-]{1,128}\Z")
_TRAILERS = frozenset({KEY_TRAILER.casefold(), TASK_TRAILER.casefold()})
# The paths a patch may name (kernel.state.roadmap.plan.path_problem says which exactly):
# tree_files leaves out the others, which no agent could change anyway.
_PATCHABLE = re.compile(r"(?!.*(^|/)\.\.?(/|$))[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+){0,31}\Z")


class GitFailed(Exception):
    """A git command that failed: what it was, and what git said."""


class GitWorkTree:
    """The ``git`` adapter: one working tree, one branch, every effect once per key.

    Args:
        path: the working tree (a git repository with at least one commit).
        branch: the branch patches go to (default: the one checked out).
        run_env: the environment a check runs with (default: ``PATH`` and ``LANG``
            only: the kernel's own environment, its secrets included, never reaches
            code an agent wrote).
        author: the name and e-mail patches are committed under.
        now_ns: the clock a commit's date is read from (default: git's own, the
            wall clock); a simulation passes its clock so its commits repeat.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        branch: str | None = None,
        run_env: Mapping[str, str] | None = None,
        author: tuple[str, str] = ("dirk", "dirk@localhost"),
        now_ns: Callable[[], int] | None = None,
    ) -> None:
        self.path = Path(path)
        self._branch = branch
        self._run_env = dict(run_env) if run_env is not None else _plain_env()
        self._author = author
        self._now_ns = now_ns
        self._lock: anyio.Lock | None = None

    # --- the adapter contract -------------------------------------------------------

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        """Carry out an ``esaa.open``, ``esaa.file_patch`` or ``esaa.run_check`` intent."""
        handler = {
            "esaa.open": self._open,
            "esaa.file_patch": self._patch,
            "esaa.run_check": self._run,
        }.get(intent.kind)
        if handler is None:
            raise AdapterError(f"the git adapter does not carry out {intent.kind}")
        if not _KEY.match(intent.key):
            raise AdapterError(f"not an idempotency key: {intent.key[:64]!r}")
        async with self._locked():
            try:
                await self._resolve()
                # The tree may lag the branch (a crash after a commit, before the reset).
                await self._sync()
                return await handler(intent)
            except GitFailed as exc:
                # Before the branch moved nothing happened, and a retry may get through
                # (an index.lock left by someone, a full disk freed).
                raise AdapterError(str(exc), transient=True, outcome_unknown=False) from exc

    async def lookup(self, key: str) -> Receipt | None:
        """Return the receipt of what ``key`` did (a commit, a check run), or None."""
        if not _KEY.match(key):
            return None
        async with self._locked():
            try:
                await self._resolve()
                commit = await self._commit_of(key)
                if commit:
                    await self._sync()  # found after a crash: the tree may lag the branch
                    return await self._patch_receipt(commit)
            except GitFailed as exc:
                raise AdapterError(str(exc), transient=True) from exc
            return self._stored_run(key)

    def after_effect(self, intent: ExecutionIntent, external_id: str) -> None:
        """Called once an effect is durable, before its receipt is returned (a test's hook)."""

    # --- esaa.open ------------------------------------------------------------------

    async def _open(self, intent: ExecutionIntent) -> Receipt:
        params = intent.params
        commit, head = str(params.get("commit", "")), await self._head()
        if commit != head:
            raise AdapterError(
                f"the roadmap opens at the branch's head ({head[:12]}), not at {commit[:12]}"
            )
        for path, field in ((CONTRACT_FILE, "contract"), (TASKS_FILE, "tasks")):
            held = await self._git_bytes("show", f"{commit}:{path}", check=False)
            proposed = params.get(field)
            if not isinstance(proposed, str) or held != proposed.encode():
                raise AdapterError(
                    f"{path} at {commit[:12]} is not the text proposed: the roadmap opens with"
                    " what the repository holds"
                )
        named = params.get("files") or {}
        if named:
            held_files = _blobs(await self._git("ls-tree", "-r", "-z", commit))
            wrong = sorted(p for p, blob in named.items() if held_files.get(p) != blob)
            if wrong:
                raise AdapterError(
                    f"{len(wrong)} file(s) named are not those versions at {commit[:12]}:"
                    f" {', '.join(wrong[:5])}"
                )
        return Receipt(external_id=f"roadmap@{commit}", detail={"commit": commit})

    # --- esaa.file_patch ------------------------------------------------------------

    async def _patch(self, intent: ExecutionIntent) -> Receipt:
        commit = await self._commit_of(intent.key)
        if commit:
            return await self._patch_receipt(commit)  # the key's effect is there already
        patches = intent.params.get("patches")
        if not isinstance(patches, Mapping) or not patches:
            raise AdapterError("a patch changes at least one file")
        _check_message(intent)
        head = await self._head()
        for path in sorted(patches):
            await self._check_diff(head, path, patches[path])
        combined = "".join(patches[path] for path in sorted(patches))
        tree = await self._tree_with(head, combined, intent.key)
        commit = await self._commit(intent, tree, head)
        moved = await self._git("update-ref", self._ref(), commit, head, check=False)
        if moved is None:
            raise GitFailed(f"the branch moved from {head[:12]} while the patch was applied")
        self.after_effect(intent, commit)
        await self._sync()
        return await self._patch_receipt(commit)

    async def _check_diff(self, head: str, path: str, diff: object) -> None:
        """Refuse a diff that touches another path than its own, or another version."""
        if not isinstance(diff, str):
            raise AdapterError(f"{path}: a diff is text")
        listed = await self._git("apply", "--numstat", "-z", "-", input=diff.encode(), check=False)
        if listed is None:
            raise AdapterError(f"{path}: git cannot read the diff")
        entries = listed.split("\0")
        fields = entries[0].split("\t") if len(entries) == 2 and not entries[1] else []
        if len(fields) != 3 or fields[2] != path or fields[0] == "-":
            raise AdapterError(f"{path}: the diff does not change exactly that one text file")
        declared = _INDEX.search(diff)
        held = await self._git("rev-parse", "--verify", "-q", f"{head}:{path}", check=False)
        current = (held or "").strip()
        old = declared.group(1) if declared else ""
        fresh = not old.strip("0")
        if not declared or (fresh and current) or (not fresh and not current.startswith(old)):
            raise AdapterError(
                f"{path}: the patch was made against blob {old[:12] or '?'}, the head holds"
                f" {current[:12] or 'no such file'}: it does not apply"
            )

    async def _tree_with(self, head: str, combined: str, key: str) -> str:
        """Apply the patch to a private index built from ``head``; return the tree."""
        index = Path(await self._git_dir()) / f"dirk-index-{key}"
        index.unlink(missing_ok=True)
        env = {"GIT_INDEX_FILE": str(index)}
        try:
            await self._git("read-tree", head, env=env)
            applied = await self._git(
                "apply", "--cached", "--whitespace=nowarn", "-", input=combined.encode(), env=env,
                check=False, errors=True,
            )  # fmt: skip
            if isinstance(applied, GitFailed):
                raise AdapterError(f"the patch does not apply: {applied}")
            tree = await self._git("write-tree", env=env)
        finally:
            index.unlink(missing_ok=True)
        return (tree or "").strip()

    async def _commit(self, intent: ExecutionIntent, tree: str, head: str) -> str:
        task = str(intent.params.get("task", ""))
        title = str(intent.params.get("message", "")).strip() or f"{task}: patch"
        message = f"{title}\n\n{TASK_TRAILER}: {task}\n{KEY_TRAILER}: {intent.key}\n"
        made = await self._git(
            "commit-tree", tree, "-p", head, "-F", "-", input=message.encode(), env=self._dates()
        )
        return (made or "").strip()

    async def _commit_of(self, key: str) -> str:
        """The commit on the branch that carried out ``key`` ("" if none).

        Only the message's last line counts, which the adapter writes after everything an
        agent wrote: a ``Dirk-Key`` line earlier in a message names no effect.
        """
        found = await self._git(
            "log", "--format=%H%x00%B%x00", "-F", f"--grep={KEY_TRAILER}: {key}", self._ref()
        )
        fields = str(found or "").split("\0")
        for commit, message in zip(fields[0::2], fields[1::2], strict=False):
            if message.rstrip("\n").rpartition("\n")[2] == f"{KEY_TRAILER}: {key}":
                return commit.strip()
        return ""

    async def _patch_receipt(self, commit: str) -> Receipt:
        names = await self._git(
            "diff-tree", "-r", "-z", "--no-commit-id", "--name-only", "--root", commit
        )
        paths = sorted(p for p in (names or "").split("\0") if p)
        listed = _blobs(await self._git("ls-tree", "-z", commit, "--", *paths)) if paths else {}
        files = {path: listed.get(path, "") for path in paths}  # "": deleted by the commit
        return Receipt(external_id=commit, detail={"commit": commit, "files": files})

    # --- esaa.run_check -------------------------------------------------------------

    async def _run(self, intent: ExecutionIntent) -> Receipt:
        stored = self._stored_run(intent.key)
        if stored is not None:
            return stored
        argv, timeout_s = intent.params.get("argv"), intent.params.get("timeout_s")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise AdapterError("no command: a check runs what the roadmap's contract names")
        if not isinstance(timeout_s, int) or timeout_s <= 0:
            raise AdapterError("no time limit: a check runs within the contract's timeout_s")
        head = await self._head()
        code, timed_out, output = await self._spawn(argv, timeout_s)
        detail = {
            "check": str(intent.params.get("check", "")),
            "passed": code == 0 and not timed_out,
            "exit_code": code,
            "timed_out": timed_out,
            "commit": head,
            "output": output,
        }
        receipt = Receipt(external_id=f"run:{intent.key}", detail=detail)
        await self._store_run(intent.key, receipt)
        self.after_effect(intent, receipt.external_id)
        return receipt

    async def _spawn(self, argv: list[str], timeout_s: int) -> tuple[int | None, bool, str]:
        """Run ``argv`` in the tree, in its own process group; (exit code, timed out, output)."""
        try:
            process = await anyio.open_process(
                argv,
                cwd=self.path,
                env=self._run_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise AdapterError(f"the check cannot start: {exc}") from exc
        tail = bytearray()
        timed_out = False
        async with process:
            with anyio.move_on_after(timeout_s) as limit:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_drain, process.stdout, tail)
                    await process.wait()
                    _kill_group(process.pid)  # what it left running holds the pipe open
            if limit.cancelled_caught:
                timed_out = True
                _kill_group(process.pid)
                await process.wait()
        code = None if timed_out else process.returncode
        text = _CONTROLS.sub("", bytes(tail[-OUTPUT_CHARS * 2 :]).decode("utf-8", "replace"))
        return code, timed_out, text[-OUTPUT_CHARS:]

    def _runs_dir(self) -> Path:
        return self.path / ".git" / "dirk" / "runs"

    def _stored_run(self, key: str) -> Receipt | None:
        try:
            raw = (self._runs_dir() / f"{key}.json").read_bytes()
        except FileNotFoundError:
            return None
        data = json.loads(raw)
        return Receipt(external_id=data["external_id"], detail=data["detail"])

    async def _store_run(self, key: str, receipt: Receipt) -> None:
        runs = self._runs_dir()
        runs.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"external_id": receipt.external_id, "detail": receipt.detail})
        temporary = runs / f"{key}.tmp"
        temporary.write_text(body)
        os.replace(temporary, runs / f"{key}.json")  # atomic: a crash leaves it or nothing

    # --- git ----------------------------------------------------------------------------

    def _locked(self) -> anyio.Lock:
        # One operation at a time: a check must not run while the tree is reset under it.
        if self._lock is None:
            self._lock = anyio.Lock()
        return self._lock

    async def _resolve(self) -> None:
        """Settle the branch once: the one given, or the one checked out at the first call."""
        if self._branch is None:
            found = await self._git("symbolic-ref", "--short", "HEAD", check=False)
            if not found:
                raise GitFailed(f"no branch checked out in {self.path}")
            self._branch = found.strip()

    def _ref(self) -> str:
        return f"refs/heads/{self._branch}"

    async def _head(self) -> str:
        return ((await self._git("rev-parse", "--verify", self._ref())) or "").strip()

    async def _git_dir(self) -> str:
        found = (await self._git("rev-parse", "--absolute-git-dir")) or ""
        return found.strip()

    async def _sync(self) -> None:
        """Make the working tree the branch's head (after a crash, it may not be yet)."""
        ref = self._ref()
        await self._git("symbolic-ref", "HEAD", ref)
        await self._git("reset", "-q", "--hard", ref)

    def _dates(self) -> dict[str, str]:
        name, email = self._author
        env = {
            "GIT_AUTHOR_NAME": name,
            "GIT_AUTHOR_EMAIL": email,
            "GIT_COMMITTER_NAME": name,
            "GIT_COMMITTER_EMAIL": email,
        }
        if self._now_ns is not None:
            stamp = f"@{self._now_ns() // 1_000_000_000} +0000"
            env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = stamp
        return env

    async def _git_bytes(self, *args: str, check: bool = True) -> bytes | None:
        result = await anyio.run_process(["git", *args], cwd=self.path, env=_git_env(), check=False)
        if result.returncode != 0:
            if check:
                raise GitFailed(_failed(args, result.stderr))
            return None
        return result.stdout

    async def _git(
        self,
        *args: str,
        input: bytes | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        errors: bool = False,
    ) -> Any:
        """Run git; return its output, or on failure raise (``check``), return the
        failure (``errors``) or None."""
        result = await anyio.run_process(
            ["git", *args], cwd=self.path, env=_git_env(env), input=input, check=False
        )
        if result.returncode == 0:
            return result.stdout.decode("utf-8", "replace")
        failure = GitFailed(_failed(args, result.stderr))
        if check and not errors:
            raise failure
        return failure if errors else None


def _blobs(listing: str) -> dict[str, str]:
    """Each file's blob id, from ``git ls-tree -r -z`` (``mode type id<TAB>path``)."""
    found = {}
    for entry in listing.split("\0"):
        meta, _, path = entry.partition("\t")
        parts = meta.split(" ")
        if path and len(parts) == 3 and parts[1] == "blob":
            found[path] = parts[2]
    return found


def tree_files(
    path: str | os.PathLike[str], commit: str = "HEAD", under: tuple[str, ...] = ("",)
) -> dict[str, str]:
    """Return each file of the repository at ``commit`` (its paths starting with one of
    ``under``) with its blob id: what an ``esaa.open`` names as ``files``.

    For the agent that opens a roadmap: a read of the repository, which the git
    adapter checks again at the commit.
    """
    listing = subprocess.run(
        ["git", "ls-tree", "-r", "-z", commit],
        cwd=path,
        env=_git_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {
        p: blob
        for p, blob in _blobs(listing).items()
        if p.startswith(under) and _PATCHABLE.match(p) and not p.startswith(".roadmap/")
    }


def _failed(args: tuple[str, ...], stderr: bytes) -> str:
    said = stderr.decode("utf-8", "replace").strip().splitlines()
    return f"git {args[0]} failed: {said[-1] if said else 'no message'}"[:500]


def _git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Git with no configuration of the user's or the system's (no hooks, no signing)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "HOME": os.devnull,
    }
    env.update(extra or {})
    return env


def _check_message(intent: ExecutionIntent) -> None:
    """Refuse a patch whose text would carry the adapter's own trailers.

    The adapter finds a key's commit by its ``Dirk-Key`` trailer: one an agent wrote into
    its message (or its task id) would answer another flow's patch with this commit, and
    that patch would never be applied.
    """
    task = str(intent.params.get("task", ""))
    if "\n" in task or "\r" in task:
        raise AdapterError("a task id is one line")
    text = f"{intent.params.get('message', '')}\n{task}"
    for line in text.splitlines():
        name = line.strip().partition(":")[0].strip().casefold()
        if name in _TRAILERS:
            raise AdapterError(
                f"the patch's message carries a {name.title()} line: only the adapter writes one"
            )


def _plain_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}


async def _drain(stream: Any, tail: bytearray) -> None:
    """Read a process's output to its end, keeping only the last part."""
    async for chunk in stream:
        tail += chunk
        if len(tail) > OUTPUT_CHARS * 8:
            del tail[: -OUTPUT_CHARS * 4]


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def init_repository(
    path: str | os.PathLike[str],
    files: Mapping[str, str],
    *,
    message: str = "initial commit",
    branch: str = "main",
    now_ns: int | None = None,
) -> str:
    """Create a git repository at ``path`` holding ``files``, in one commit; return its id.

    For examples and tests: the repository under work, with its ``.roadmap/`` files.
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    env = _git_env(
        {
            "GIT_AUTHOR_NAME": "dirk",
            "GIT_AUTHOR_EMAIL": "dirk@localhost",
            "GIT_COMMITTER_NAME": "dirk",
            "GIT_COMMITTER_EMAIL": "dirk@localhost",
        }
    )
    if now_ns is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"@{now_ns // 1_000_000_000} +0000"

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=root, env=env, capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    git("init", "-q", "-b", branch)
    for name, text in files.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    git("add", "--all")
    git("commit", "-q", "-m", message)
    return git("rev-parse", "HEAD")

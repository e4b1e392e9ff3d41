"""The directory artifact store: one file per artifact, named by its reference.

``<root>/ab/cdef...`` holds the bytes whose SHA-256 is ``abcdef...``. A put writes a
temporary file in the same directory, flushes it to disk and renames it into place,
so a reader never sees half an artifact and a crash leaves at most a stray ``.tmp``
file, which :meth:`DirectoryArtifacts.refs` ignores. Any tool that copies files
(rsync, object-store sync) can mirror it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio

from kernel.artifacts.port import ArtifactStoreError, checked, is_ref, ref_of

T = TypeVar("T")


class DirectoryArtifacts:
    """Artifacts as files under a root directory (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.location = str(root)

    def _path(self, ref: str) -> Path:
        digest = ref.removeprefix("sha256:")
        return self.root / digest[:2] / digest[2:]

    async def _run(self, fn: Callable[[], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(fn)
        except OSError as exc:
            raise ArtifactStoreError(self.location, f"cannot be used ({exc})") from None

    async def put(self, data: bytes) -> str:
        raw = checked(data)
        ref = ref_of(raw)
        path = self._path(ref)

        def write() -> None:
            if path.exists():
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(raw)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

        await self._run(write)
        return ref

    async def get(self, ref: str) -> bytes | None:
        if not is_ref(ref):
            return None
        path = self._path(ref)

        def read() -> bytes | None:
            try:
                return path.read_bytes()
            except FileNotFoundError:
                return None

        return await self._run(read)

    async def size(self, ref: str) -> int | None:
        if not is_ref(ref):
            return None
        path = self._path(ref)

        def stat() -> int | None:
            try:
                return path.stat().st_size
            except FileNotFoundError:
                return None

        return await self._run(stat)

    async def delete(self, ref: str) -> bool:
        if not is_ref(ref):
            return False
        path = self._path(ref)

        def remove() -> bool:
            try:
                path.unlink()
            except FileNotFoundError:
                return False
            return True

        return await self._run(remove)

    async def refs(self) -> list[str]:
        def walk() -> list[str]:
            found = []
            for sub in self.root.iterdir():
                if not sub.is_dir() or len(sub.name) != 2:
                    continue
                for item in sub.iterdir():
                    ref = f"sha256:{sub.name}{item.name}"
                    if is_ref(ref):
                        found.append(ref)
            return sorted(found)

        return await self._run(walk)

    async def aclose(self) -> None:
        return None


async def open_store(location: str, readonly: bool) -> DirectoryArtifacts:
    """Open (and create, unless ``readonly``) the directory store at ``location``."""
    root = Path(location)

    def make() -> None:
        if readonly:
            if not root.is_dir():
                raise ArtifactStoreError(location, "is not a directory")
            return
        root.mkdir(parents=True, exist_ok=True)

    try:
        await anyio.to_thread.run_sync(make)
    except OSError as exc:
        raise ArtifactStoreError(location, f"cannot be opened ({exc})") from None
    return DirectoryArtifacts(root)

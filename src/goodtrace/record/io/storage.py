"""Where segment files go: a local (or NFS) directory, or any fsspec URL (s3://, gs://, ...).

Local storage keeps the open segment's file descriptor (``O_APPEND``, no buffered file object,
so no lock a thread stuck in a hung filesystem could hold at interpreter exit) and writes each
chunk with one ``write``: one system call per flush, no open, stat or fsync per flush, and a
hard kill loses only what was not yet written. A write is whole or undone: when one fails
part-way (a full disk), the file is truncated back to where the chunk began; only if that fails
too does a torn line stay behind, and :class:`TornWriteError` tells the writer never to append
after it. ``check`` tells whether
the open segment was deleted (one ``fstat``; ``thorough`` also looks its path up).

Object stores cannot append: the open segment is uploaded whole (overwriting the same key) and
closed segments are never touched again; the parent "directory" is made once, not per upload.
"""

from __future__ import annotations

import errno
import os
from typing import Any, Protocol


class TornWriteError(OSError):
    """A write failed part-way and the partial line could not be removed."""


class Storage(Protocol):
    """One rank's view of the run directory. Paths are relative, '/'-separated."""

    remote: bool
    description: str

    def append(self, path: str, data: bytes) -> None:
        """Append all of ``data`` or nothing (raise); :class:`TornWriteError` if part stayed."""
        ...

    def put(self, path: str, data: bytes) -> None: ...

    def close_file(self, path: str) -> None: ...

    def check(self, path: str, *, thorough: bool = False) -> str | None:
        """None while ``path`` is still the file being written; else what happened to it.
        ``thorough`` also looks the path up (a replaced file, NFS's renamed-on-delete files)."""
        ...

    def forget(self, path: str) -> None:
        """Drop the open handle of ``path`` without writing anything more to it."""
        ...


def is_url(run_dir: str) -> bool:
    return "://" in run_dir and not run_dir.startswith("file://")


def local_path(run_dir: str) -> str:
    return run_dir[len("file://") :] if run_dir.startswith("file://") else run_dir


def open_storage(run_dir: str | os.PathLike[str]) -> Storage:
    text = os.fspath(run_dir)
    if not text:
        raise ValueError("run_dir must not be empty")
    if is_url(text):
        return FsspecStorage(text)
    return LocalStorage(local_path(text))


class _OpenFile:
    __slots__ = ("fd", "identity")

    def __init__(self, fd: int, identity: tuple[int, int]) -> None:
        self.fd = fd
        self.identity = identity


class LocalStorage:
    remote = False

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.description = self.root
        self._open: dict[str, _OpenFile] = {}

    def _full(self, path: str) -> str:
        return os.path.join(self.root, *path.split("/"))

    def _open_file(self, path: str) -> _OpenFile:
        full = self._full(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(full, flags, 0o644)
        except FileNotFoundError:  # the rank directory does not exist (yet, or any more)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            fd = os.open(full, flags, 0o644)
        try:
            st = os.fstat(fd)
            handle = _OpenFile(fd, (st.st_dev, st.st_ino))
        except OSError:
            os.close(fd)
            raise
        self._open[path] = handle
        return handle

    def append(self, path: str, data: bytes) -> None:
        handle = self._open.get(path) or self._open_file(path)
        view = memoryview(data)
        done = 0
        try:
            while done < len(data):
                written = os.write(handle.fd, view[done:])
                if written <= 0:
                    raise OSError(errno.EIO, "write returned 0 bytes")
                done += written
        except OSError as exc:
            if done:  # remove the part that was written: never leave a partial line
                try:
                    os.ftruncate(handle.fd, os.fstat(handle.fd).st_size - done)
                except OSError:
                    self.forget(path)
                    raise TornWriteError(exc.errno, f"{exc.strerror} (a partial line stayed behind)") from exc
            raise

    def put(self, path: str, data: bytes) -> None:
        full = self._full(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        tmp = full + ".tmp"
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.replace(tmp, full)

    def check(self, path: str, *, thorough: bool = False) -> str | None:
        handle = self._open.get(path)
        if handle is None:
            return None
        try:  # one call on the open file: no path lookup (a round trip per component on NFS)
            if os.fstat(handle.fd).st_nlink == 0:
                return "the run directory or the segment file was deleted"
        except OSError as exc:  # NFS answers ESTALE for a file another client deleted
            return f"the segment file is gone ({exc.strerror})"
        if not thorough:
            return None
        try:
            st = os.stat(self._full(path))
        except FileNotFoundError:
            return "the run directory or the segment file was deleted"
        if (st.st_dev, st.st_ino) != handle.identity:
            return "the segment file was replaced by another file"
        return None

    def forget(self, path: str) -> None:
        handle = self._open.pop(path, None)
        if handle is not None:
            try:
                os.close(handle.fd)
            except OSError:
                pass

    def close_file(self, path: str) -> None:
        handle = self._open.pop(path, None)
        if handle is not None:
            try:
                os.fsync(handle.fd)  # once per segment: at rotation and at finish
            except OSError:
                pass
            finally:
                os.close(handle.fd)


class FsspecStorage:
    remote = True

    def __init__(self, url: str) -> None:
        try:
            import fsspec
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise RuntimeError(
                f"run directory {url!r} is a URL: install fsspec (pip install 'goodtrace[remote]')"
            ) from exc
        self.fs: Any
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.description = url
        self._made: set[str] = set()

    def append(self, path: str, data: bytes) -> None:  # pragma: no cover - not used remotely
        raise NotImplementedError("object stores cannot append")

    def put(self, path: str, data: bytes) -> None:
        full = self.root.rstrip("/") + "/" + path
        parent = full.rsplit("/", 1)[0]
        if parent not in self._made:  # object stores have no directories: one call per prefix
            try:
                self.fs.makedirs(parent, exist_ok=True)
            except Exception:
                pass
            self._made.add(parent)
        self.fs.pipe_file(full, data)

    def check(self, path: str, *, thorough: bool = False) -> str | None:
        return None

    def forget(self, path: str) -> None:
        return None

    def close_file(self, path: str) -> None:
        return None

"""Where segment files go: a local (or NFS) directory, or any fsspec URL (s3://, gs://, ...).

Local storage appends to the open segment, so a hard kill loses only what was not yet written.
Object stores cannot append: the current segment is uploaded whole (overwriting the same key)
every upload interval, and closed segments are never touched again.
"""

from __future__ import annotations

import os
from typing import IO, Any, Protocol


class Storage(Protocol):
    """One rank's view of the run directory. Paths are relative, '/'-separated."""

    remote: bool
    description: str

    def append(self, path: str, data: bytes) -> None: ...

    def put(self, path: str, data: bytes) -> None: ...

    def close_file(self, path: str) -> None: ...


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


class LocalStorage:
    remote = False

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.description = self.root
        self._open: dict[str, IO[bytes]] = {}

    def append(self, path: str, data: bytes) -> None:
        handle = self._open.get(path)
        if handle is None:
            full = os.path.join(self.root, *path.split("/"))
            os.makedirs(os.path.dirname(full), exist_ok=True)
            handle = open(full, "ab")  # noqa: SIM115 - kept open across flushes
            self._open[path] = handle
        handle.write(data)
        handle.flush()  # into the OS: survives a kill of this process

    def put(self, path: str, data: bytes) -> None:
        full = os.path.join(self.root, *path.split("/"))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        tmp = full + ".tmp"
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.replace(tmp, full)

    def close_file(self, path: str) -> None:
        handle = self._open.pop(path, None)
        if handle is not None:
            handle.flush()
            try:
                os.fsync(handle.fileno())
            except OSError:
                pass
            handle.close()


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

    def append(self, path: str, data: bytes) -> None:  # pragma: no cover - not used remotely
        raise NotImplementedError("object stores cannot append")

    def put(self, path: str, data: bytes) -> None:
        full = self.root.rstrip("/") + "/" + path
        parent = full.rsplit("/", 1)[0]
        try:
            self.fs.makedirs(parent, exist_ok=True)
        except Exception:
            pass
        self.fs.pipe_file(full, data)

    def close_file(self, path: str) -> None:
        return None

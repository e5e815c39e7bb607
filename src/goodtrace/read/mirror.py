"""Runs on object storage (any fsspec URL): an incremental local mirror that the DuckDB reader reads.

One flat listing of the run (on S3 one request per 1,000 objects, not one per rank directory),
then only what is new or changed since the last mirror is fetched, in parallel on a bounded
pool of threads. A run compacted with ``goodtrace compact`` is mirrored with its Parquet copy
(``RUN/compact/``), and the segments that copy covers unchanged are not fetched at all. Every
failure is one :class:`RemoteReadError` line (a :class:`NotARunError`) naming the URL and the
reason (a URL that holds no run is a plain ``NotARunError``, as a local path is). ``fsspec``
is imported only here, when a URL is read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

from goodtrace.read.chunk_files import DIGEST_HEAD as _DIGEST_HEAD
from goodtrace.read.chunk_files import DIGEST_TAIL as _DIGEST_TAIL
from goodtrace.read.compact import (
    COMPACT_DIR,
    COMPACT_FORMAT,
    COMPACT_MANIFEST,
    COMPACT_RECORDS,
    MODEL_PREFIX,
)
from goodtrace.read.environment import MIRROR_SOURCE, count_from_environment, keyed_dir
from goodtrace.read.loaded import Progress
from goodtrace.read.segments import SEGMENT_SUFFIX, NotARunError

__all__ = ["DEFAULT_THREADS", "MIRROR_STATE", "RemoteReadError", "fetch_files", "mirror_cache_dir", "mirror_run"]

DEFAULT_THREADS = 32  # fetches in flight; GOODTRACE_MIRROR_THREADS overrides
MIRROR_STATE = "MIRROR.json"  # in the mirror: what each local file was fetched as (size, tag)
_MANIFEST = f"{COMPACT_DIR}/{COMPACT_MANIFEST}"
_PARQUET = f"{COMPACT_DIR}/{COMPACT_RECORDS}"
# Listing fields that change when an object is rewritten, by filesystem (S3, GCS, Azure, local...).
_BLOCK = 8 * 2**20  # bytes a fetch copies at a time
# A grown object is fetched as its new bytes (three requests) from this size on, whole (one) below
_APPEND_FROM = 2**20
# A file fetched from a byte on: its header line is found in its first this many bytes (else it is fetched whole)
_HEADER_PROBE = 4096
_TAG_FIELDS = ("ETag", "etag", "md5Hash", "generation", "content_md5", "mtime", "LastModified", "last_modified")


class RemoteReadError(NotARunError):
    """The run's URL could not be listed or one of its files not fetched (the message says why)."""


@dataclasses.dataclass(frozen=True)
class _Remote:
    path: str  # the filesystem's path of the object
    size: int | None
    tag: str | None

    def state(self) -> list[Any]:
        return [self.size, self.tag]


def mirror_cache_dir(url: str, cache_dir: str | None = None) -> str:
    """The local folder that mirrors ``url``: in ``$GOODTRACE_CACHE_DIR`` (default
    ``$XDG_CACHE_HOME/goodtrace/runs``, i.e. ``~/.cache/goodtrace/runs``), ``<hash of the
    URL>/<the URL's last name>``, so that what names a run by its folder (the trace's run name)
    shows the run's own name."""
    name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1].split("://")[-1]
    if not name or name in (".", "..") or name.startswith("."):
        name = "run"
    return os.path.join(keyed_dir(url, cache_dir=cache_dir), name)


def mirror_run(
    url: str,
    *,
    cache_dir: str | None = None,
    progress: Progress | None = None,
    threads: int | None = None,
    use_compact: bool = True,
) -> str:
    """Copy a run on object storage (any fsspec URL: s3://, gs://, ...) into a local cache and
    return that directory, which DuckDB then reads like any local run.

    Only files that are new, or whose size or tag (ETag, generation, mtime) changed since the
    last mirror of the same URL, are fetched, ``threads`` (``$GOODTRACE_MIRROR_THREADS``,
    default 32) at a time: rotated segments never change, so re-reading a live run fetches its
    open segments only, and of an open segment that grew, only the bytes it gained (appended
    to its mirrored file, which keeps its inode: see ``_Fetcher._append``). Segments gone from
    the source go from the mirror. When the run has a compacted copy this reader understands,
    it is fetched too, and a segment it covers (same size as when compacted) is read from it
    rather than fetched; ``use_compact=False`` (a reader of the JSON lines alone) fetches every
    segment and leaves the copy as it is."""
    workers = _threads(threads)
    try:
        import fsspec
    except ImportError:
        raise RemoteReadError(f"{url!r}: reading a run from a URL needs fsspec (pip install 'goodtrace[remote]')") from None
    try:
        fs, root = fsspec.core.url_to_fs(url)
    except Exception as exc:  # unknown protocol, a missing driver (s3fs, gcsfs), a malformed URL
        raise RemoteReadError(f"{url!r}: cannot list the run ({_reason(exc)})") from None
    if progress is not None:
        progress("listing the run", 0, 1)
    remote = _list_run(fs, root.rstrip("/"), url)
    if progress is not None:
        progress("listing the run", 1, 1)
    segments = {rel: obj for rel, obj in remote.items() if _is_segment(rel)}
    compacted = _MANIFEST in remote and _PARQUET in remote
    if not segments and not compacted:
        raise NotARunError(f"{url!r} holds no goodtrace records (no rank-*/*{SEGMENT_SUFFIX} files)")
    local = mirror_cache_dir(url, cache_dir)
    os.makedirs(local, exist_ok=True)
    _write_atomically(os.path.join(local, MIRROR_SOURCE), url + "\n")
    state = _read_state(local)
    fetcher = _Fetcher(fs, url, local, state, workers, progress)
    wanted: dict[str, _Remote] = {}
    covered: dict[str, int] = {}
    if compacted:
        # Kept when mirrored (an unusable copy too, so that it is not fetched again); when used,
        # fetched first: its manifest says which segments need not be fetched at all.
        wanted.update({_MANIFEST: remote[_MANIFEST], _PARQUET: remote[_PARQUET]})
        wanted.update({rel: obj for rel, obj in remote.items() if _is_model(rel)})  # the stored run model
        if use_compact:
            fetcher.fetch(wanted, "fetching the compacted copy")
            covered = _covered_segments(local)
    for rel, obj in segments.items():
        if obj.size is None or covered.get(rel) != obj.size:
            wanted[rel] = obj
    fetcher.fetch({rel: obj for rel, obj in wanted.items() if rel not in (_MANIFEST, _PARQUET) and not _is_model(rel)},
                  "fetching rank files")
    _remove_unwanted(local, set(wanted))
    _write_state(local, {rel: state[rel] for rel in wanted if rel in state})
    return local


def _threads(threads: int | None) -> int:
    if threads is None:
        try:
            threads = count_from_environment("GOODTRACE_MIRROR_THREADS", "threads")
        except ValueError as exc:
            raise RemoteReadError(str(exc)) from None
        return DEFAULT_THREADS if threads is None else threads
    if threads < 1:
        raise RemoteReadError(f"the mirror needs at least one thread, got {threads}")
    return threads


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())  # one line, whatever the library put in its message
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _list_run(fs: Any, root: str, url: str) -> dict[str, _Remote]:
    """Every object under the run, by '/'-separated path relative to it, from one flat listing
    (``find`` without a depth: a glob of rank-*/ would list every rank directory on its own)."""
    with contextlib.suppress(Exception):  # a long-lived process must see what changed since
        fs.invalidate_cache(root)
    try:
        listing = fs.find(root, detail=True)
    except FileNotFoundError:
        listing = {}
    except Exception as exc:  # missing credentials, an unreachable endpoint, no such bucket
        raise RemoteReadError(f"{url!r}: cannot list the run ({_reason(exc)})") from None
    prefix = root + "/"
    found: dict[str, _Remote] = {}
    for path, info in listing.items():
        if not path.startswith(prefix) or info.get("type", "file") != "file":
            continue
        rel = path[len(prefix):]
        tag = next((str(info[key]) for key in _TAG_FIELDS if info.get(key) is not None), None)
        size = info.get("size")
        found[rel] = _Remote(path, int(size) if isinstance(size, (int, float)) else None, tag)
    return found


def _is_segment(rel: str) -> bool:
    parts = rel.split("/")
    return (len(parts) == 2 and parts[0].startswith("rank-") and parts[1].endswith(SEGMENT_SUFFIX)
            and not parts[1].startswith("."))


def _covered_segments(local: str) -> dict[str, int]:
    """Segment -> its size when compacted, from the mirrored manifest; empty when this reader
    would not use the compacted copy (another format, unreadable, or not a whole Parquet file)."""
    try:
        with open(os.path.join(local, COMPACT_DIR, COMPACT_MANIFEST), encoding="utf-8") as handle:
            manifest = json.load(handle)
        with open(os.path.join(local, COMPACT_DIR, COMPACT_RECORDS), "rb") as handle:
            head = handle.read(4)
            handle.seek(-4, os.SEEK_END)
            tail = handle.read(4)
    except (OSError, ValueError):
        return {}
    if not isinstance(manifest, dict) or manifest.get("format") != COMPACT_FORMAT or head != b"PAR1" or tail != b"PAR1":
        return {}
    covered: dict[str, int] = {}
    for entry in manifest.get("files", []):
        if isinstance(entry, dict) and isinstance(entry.get("path"), str) and isinstance(entry.get("size"), int):
            covered[entry["path"].replace(os.sep, "/")] = entry["size"]
    return covered


class _Fetcher:
    """Fetches what changed since the state says it was fetched, in parallel, into the mirror."""

    def __init__(self, fs: Any, url: str, local: str, state: dict[str, list[Any]], workers: int,
                 progress: Progress | None) -> None:
        self.fs, self.url, self.local, self.state = fs, url, local, state
        self.workers, self.progress = workers, progress

    def changed(self, rel: str, obj: _Remote) -> bool:
        dest = os.path.join(self.local, *rel.split("/"))
        try:
            size = os.path.getsize(dest)
        except OSError:
            return True
        if obj.size is None or size != obj.size:
            return True
        known = self.state.get(rel)
        if known is None:  # a mirror from before the state was kept: the size must do
            self.state[rel] = obj.state()
            return False
        return bool(known != obj.state())

    def fetch(self, objects: dict[str, _Remote], what: str) -> None:
        todo = [(rel, obj) for rel, obj in objects.items() if self.changed(rel, obj)]
        if not todo:
            return
        if self.progress is not None:
            self.progress(what, 0, len(todo))
        for rel in {rel.rsplit("/", 1)[0] for rel, _ in todo if "/" in rel}:
            os.makedirs(os.path.join(self.local, *rel.split("/")), exist_ok=True)
        pool = ThreadPoolExecutor(max_workers=min(self.workers, len(todo)), thread_name_prefix="goodtrace-mirror")
        try:
            pending: set[Future[str]] = {pool.submit(self._get, rel, obj) for rel, obj in todo}
            done_count = 0
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                for future in done:
                    rel = future.result()  # the first failure ends the mirror, as one line
                    self.state[rel] = objects[rel].state()
                    done_count += 1
                if self.progress is not None:
                    self.progress(what, done_count, len(todo))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _get(self, rel: str, obj: _Remote) -> str:
        dest = os.path.join(self.local, *rel.split("/"))
        part = f"{dest}.{os.getpid()}.part"  # two readers of one URL never share a partial file
        try:
            if self._append(rel, obj, dest):
                return rel
        except Exception:  # fetched whole below, which says what fails
            pass
        try:
            self.fs.get_file(obj.path, part)
            os.replace(part, dest)
        except Exception as exc:
            with contextlib.suppress(OSError):
                os.remove(part)
            raise RemoteReadError(f"{self.url!r}: cannot fetch {obj.path!r} ({_reason(exc)})") from None
        return rel


    def _append(self, rel: str, obj: _Remote, dest: str) -> bool:
        """Of an object that grew since it was mirrored whole (an open segment: a live run),
        fetch only the bytes after the mirrored ones and append them to the mirror's file, which
        keeps its inode, so that the segment cache's prefix of it stays valid and a report
        parses only the new lines. From :data:`_APPEND_FROM` bytes mirrored, and only while the
        object still begins with the mirrored bytes (their first 4 KiB and last 64 KiB: the
        test the cache makes of a prefix); False when it cannot be grown so (then it is fetched
        whole)."""
        known = self.state.get(rel)
        try:
            have = os.path.getsize(dest)
        except OSError:
            return False
        if not known or known[0] != have or have < _APPEND_FROM or obj.size is None or obj.size <= have:
            return False
        try:
            import fcntl
        except ImportError:  # not on a POSIX system: no lock to append under
            return False
        head, tail = min(_DIGEST_HEAD, have), max(min(_DIGEST_HEAD, have), have - _DIGEST_TAIL)
        with open(dest, "rb") as mirrored:
            first = mirrored.read(head)
            mirrored.seek(tail)
            last = mirrored.read(have - tail)
        if bytes(self.fs.cat_file(obj.path, start=0, end=head)) != first or (
                tail < have and bytes(self.fs.cat_file(obj.path, start=tail, end=have)) != last):
            return False  # rewritten, not grown
        part = f"{dest}.{os.getpid()}.grown"
        try:
            with open(part, "wb") as copy:
                if _copy_range(self.fs, obj.path, have, obj.size, copy):
                    return False  # shorter than listed: replaced since
            with open(dest, "ab") as target, open(part, "rb") as new:
                fcntl.flock(target, fcntl.LOCK_EX)  # another reader of this URL appends too
                if os.fstat(target.fileno()).st_size != have:
                    return False  # it did, or replaced the file: fetched whole
                shutil.copyfileobj(new, target, _BLOCK)
        finally:
            with contextlib.suppress(OSError):
                os.remove(part)
        return True


def fetch_files(sources: dict[str, tuple[str, int]], dest: str, threads: int | None = None,
                starts: Mapping[str, int] | None = None) -> dict[str, str]:
    """Fetch files of a run on object storage into ``dest`` (what a Ray task on a cluster
    node does with its own sessions): ``sources`` maps a key to the file's URL and the bytes
    to fetch (its first ``size``: what the driver mirrored, so both read the same records of a
    growing file); returns key -> the local copy, at ``dest/rank-N/<file>`` (the name the
    warnings give it). ``starts``: of a file read from a byte on (the part of an open segment
    after the prefix the segment cache holds), that byte: its copy is then its header line and
    the bytes from there (shorter than ``size`` by what was left out). A file shorter than
    ``size``, or one that cannot be fetched, is a :class:`RemoteReadError`."""
    try:
        import fsspec
    except ImportError:
        raise RemoteReadError("reading a run from a URL needs fsspec on every node (pip install 'goodtrace[remote]')") \
            from None

    def get(key: str) -> str:
        url, size = sources[key]
        folder, name = url.rstrip("/").rsplit("/", 2)[-2:]
        local = os.path.join(dest, folder, name)
        os.makedirs(os.path.dirname(local), exist_ok=True)
        try:
            fs, path = fsspec.core.url_to_fs(url)
            start = (starts or {}).get(key, 0)
            if start > 0 and _fetch_from(fs, path, start, size, local):
                return local
            with fs.open(path, "rb") as source, open(local, "wb") as copy:
                left = size
                while left > 0:
                    block = source.read(min(left, _BLOCK))
                    if not block:
                        raise EOFError(f"{left:,} of its {size:,} bytes are gone (it was cut short or replaced)")
                    copy.write(block)
                    left -= len(block)
        except Exception as exc:
            raise RemoteReadError(f"{url!r}: cannot fetch ({_reason(exc)})") from None
        return local

    if not sources:
        return {}
    with ThreadPoolExecutor(max_workers=min(_threads(threads), len(sources)),
                            thread_name_prefix="goodtrace-fetch") as pool:
        return dict(zip(sources, pool.map(get, sources), strict=True))


def _fetch_from(fs: Any, path: str, start: int, size: int, local: str) -> bool:
    """Write to ``local`` the header line of the object at ``path`` and its bytes ``start`` to
    ``size`` (ranged reads); False, having written nothing, when ``start`` is within the first
    line or that line is longer than :data:`_HEADER_PROBE` (then the caller fetches it whole)."""
    first = bytes(fs.cat_file(path, start=0, end=min(size, _HEADER_PROBE)))
    header = first.find(b"\n") + 1
    if not 0 < header <= start:
        return False
    with open(local, "wb") as copy:
        copy.write(first[:header])
        missing = _copy_range(fs, path, start, size, copy)
    if missing:
        raise EOFError(f"{missing:,} of its {size:,} bytes are gone (it was cut short or replaced)")
    return True


def _copy_range(fs: Any, path: str, start: int, end: int, out: Any) -> int:
    """Bytes ``start`` to ``end`` of the object at ``path`` written to ``out``, by ranged reads
    of :data:`_BLOCK` (no request for the object's size); returns how many of them the object
    lacked (0: all there)."""
    for begin in range(start, end, _BLOCK):
        stop = min(begin + _BLOCK, end)
        block = bytes(fs.cat_file(path, start=begin, end=stop))
        out.write(block)
        if len(block) != stop - begin:
            return end - begin - len(block)
    return 0


def _remove_unwanted(local: str, wanted: Iterable[str]) -> None:
    """Segments gone from the source (or read from the compacted copy), and a compacted copy
    the source no longer has, go from the mirror."""
    keep = set(wanted)
    for entry in os.listdir(local):
        folder = os.path.join(local, entry)
        if entry.startswith("rank-") and os.path.isdir(folder):
            for name in os.listdir(folder):
                rel = f"{entry}/{name}"
                if name.endswith(SEGMENT_SUFFIX) and rel not in keep:
                    with contextlib.suppress(OSError):
                        os.remove(os.path.join(folder, name))
    compact = os.path.join(local, COMPACT_DIR)
    stored = [f"{COMPACT_DIR}/{name}" for name in os.listdir(compact) if _is_model(f"{COMPACT_DIR}/{name}")] \
        if os.path.isdir(compact) else []
    for rel in (_MANIFEST, _PARQUET, *stored):
        if rel not in keep:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(local, *rel.split("/")))


def _is_model(rel: str) -> bool:
    """A table of the run model a compaction stored (RUN/compact/model-*.parquet)."""
    folder, _, name = rel.partition("/")
    return folder == COMPACT_DIR and name.startswith(MODEL_PREFIX) and name.endswith(".parquet") and "/" not in name


def _read_state(local: str) -> dict[str, list[Any]]:
    try:
        with open(os.path.join(local, MIRROR_STATE), encoding="utf-8") as handle:
            state = json.load(handle)
    except (OSError, ValueError):
        return {}
    if not isinstance(state, dict) or not isinstance(state.get("files"), dict):
        return {}
    return {k: v for k, v in state["files"].items() if isinstance(v, list)}


def _write_state(local: str, files: dict[str, list[Any]]) -> None:
    _write_atomically(os.path.join(local, MIRROR_STATE), json.dumps({"format": 1, "files": files}))


def _write_atomically(target: str, text: str) -> None:
    """``text`` into ``target``, whole or not at all (another reader of the same URL may be
    writing it too: each writes its own temporary file)."""
    partial = f"{target}.{os.getpid()}.part"
    with open(partial, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(partial, target)

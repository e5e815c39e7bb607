"""Runs on object storage: an incremental local mirror that the DuckDB reader reads."""

from __future__ import annotations

import hashlib
import os

from goodtrace.read.loaded import Progress
from goodtrace.read.segments import SEGMENT_SUFFIX, NotARunError, list_segments

__all__ = ["mirror_run"]


def mirror_run(url: str, *, cache_dir: str | None = None, progress: Progress | None = None) -> str:
    """Copy a run on object storage (any fsspec URL: s3://, gs://, ...) into a local cache and
    return that directory. Only segments that are new or whose size changed since the last
    mirror are fetched (rotated segments never change), so re-reading a live run is cheap.

    The cache is ``$GOODTRACE_CACHE_DIR`` (default ``~/.cache/goodtrace/runs``), one folder per
    URL. DuckDB then reads it like any local run."""
    try:
        import fsspec
    except ImportError:
        raise NotARunError(f"{url!r}: reading a run from a URL needs fsspec (pip install 'goodtrace[remote]')") from None
    try:
        fs, root = fsspec.core.url_to_fs(url)
        listing = fs.glob(root.rstrip("/") + "/rank-*/*" + SEGMENT_SUFFIX, detail=True)
    except Exception as exc:  # unknown protocol, missing credentials, network errors
        raise NotARunError(f"{url!r}: cannot list the run ({type(exc).__name__}: {exc})") from None
    remote: dict[str, tuple[str, int | None]] = {}
    for path, info in sorted(listing.items()):
        rank_dir, name = path.rsplit("/", 2)[-2:]
        if not rank_dir.startswith("rank-") or name.startswith(".") or os.sep in name:
            continue
        remote[os.path.join(rank_dir, name)] = (path, info.get("size"))
    if not remote:
        raise NotARunError(f"{url!r} holds no goodtrace records (no rank-*/*{SEGMENT_SUFFIX} files)")
    base = cache_dir or os.environ.get("GOODTRACE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "goodtrace", "runs"
    )
    local = os.path.join(base, hashlib.sha256(url.encode()).hexdigest()[:16])
    os.makedirs(local, exist_ok=True)
    with open(os.path.join(local, "SOURCE"), "w", encoding="utf-8") as handle:
        handle.write(url + "\n")
    for done, (relative, (path, size)) in enumerate(remote.items()):
        dest = os.path.join(local, relative)
        if size is None or not os.path.exists(dest) or os.path.getsize(dest) != size:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            try:
                fs.get_file(path, dest + ".part")
            except Exception as exc:
                raise NotARunError(f"{url!r}: cannot fetch {path!r} ({type(exc).__name__}: {exc})") from None
            os.replace(dest + ".part", dest)
        if progress is not None:
            progress("fetching rank files", done + 1, len(remote))
    for _, stale in list_segments(local):  # a segment gone from the source goes from the mirror
        if os.path.relpath(stale, local) not in remote:
            os.remove(stale)
    return local

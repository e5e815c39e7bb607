"""Per-file work of the reader on many files at once: a header read, a stat, a prefix check,
a range copy. On a network filesystem (NFS, Lustre, GPFS) each is one or more round trips
that the server answers many at a time, so a loop over thousands of rank files waits for each
in turn when it need not: :func:`io_map` runs such calls on a few threads (the GIL is released
while they wait), in order. On a local filesystem it runs them in a loop: there each call is a
few microseconds of Python that the threads only contend for (a re-report of 1,600 ranks paid
0.5-0.8 s for them)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from goodtrace.record.io.storage import is_url

__all__ = ["IO_THREADS", "MOUNT_TABLE", "NETWORK_FILESYSTEMS", "io_map", "locks_across_hosts", "mount_of",
           "on_network_filesystem", "stat_or_none"]

IO_THREADS = 16  # calls in flight (an NFS client sends them over one connection: the server's slots decide)
_MANY = 8  # fewer items: a plain loop

T = TypeVar("T")
R = TypeVar("R")


def io_map(fn: Callable[[T], R], items: Iterable[T], where: str) -> list[R]:
    """``[fn(x) for x in items]``, on :data:`IO_THREADS` threads when there are many items and
    they lie on a network filesystem or behind a URL (``where``: a path on the filesystem the
    calls go to, or the URL). ``fn`` returns its errors rather than raising them (the first one
    raised is re-raised here, the other calls having run)."""
    work = list(items)
    # where the mount table cannot be read (macOS), threads: on a local disk they cost a little
    # contention, on a network share a loop would wait for every round trip in turn; a URL's
    # calls are requests
    if len(work) < _MANY or not (is_url(where) or on_network_filesystem(where, unknown=True)):
        return [fn(x) for x in work]
    with ThreadPoolExecutor(max_workers=min(IO_THREADS, len(work)), thread_name_prefix="goodtrace-io") as pool:
        return list(pool.map(fn, work))


def stat_or_none(path: str) -> os.stat_result | None:
    """The file's stat, None when it is gone or cannot be reached (a per-file call for :func:`io_map`)."""
    try:
        return os.stat(path)
    except OSError:
        return None


# Filesystem types (``/proc/self/mounts``) whose every call is a round trip to a server; FUSE
# ones too (sshfs, gcsfuse, s3fs, ...).
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "9p", "afs",
    "wekafs", "pvfs2", "orangefs", "panfs",
})


MOUNT_TABLE = "/proc/self/mounts"  # Linux's; other systems have none to read


def mount_of(path: str) -> tuple[str, frozenset[str]] | None:
    """The type and options of the mount that holds ``path``, from the mount table
    (:data:`MOUNT_TABLE`); None where there is none to read."""
    try:
        real = os.path.realpath(path)
        with open(MOUNT_TABLE, encoding="utf-8", errors="replace") as handle:
            mounts = handle.read().splitlines()
    except OSError:
        return None
    found, kind, options = "", "", ""
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[1])  # "\040" is a space
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(found):
            found, kind, options = point, parts[2], parts[3] if len(parts) > 3 else ""
    return kind, frozenset(options.split(","))


def on_network_filesystem(path: str, *, unknown: bool = False) -> bool:
    """Whether ``path`` lies on a network (or FUSE) filesystem: the type of the mount that holds
    it, from the mount table (:data:`MOUNT_TABLE`); ``unknown`` where there is none to read."""
    mount = mount_of(path)
    if mount is None:
        return unknown
    kind = mount[0]
    return kind in NETWORK_FILESYSTEMS or kind == "fuse" or kind.startswith("fuse.")


# The filesystems a ring file is made on (record/io/native_writer) whose locks one host's kernel
# keeps for itself; NFS's reach the server unless mounted ``nolock`` or ``local_lock=``.
LOCAL_FILESYSTEMS = frozenset({"ext4", "ext3", "ext2", "xfs", "tmpfs", "overlay", "btrfs", "zfs"})


def locks_across_hosts(path: str) -> bool:
    """Whether a free POSIX lock on the file at ``path`` proves that no process of any host holds
    it: a local filesystem (only this host writes it), or NFS with its lock service (not
    ``nolock``, not ``local_lock=all`` or ``posix``). False where the mount table cannot say."""
    mount = mount_of(path)
    if mount is None:
        return False
    kind, options = mount
    if kind in LOCAL_FILESYSTEMS:
        return True
    if kind in ("nfs", "nfs4"):
        return "nolock" not in options and not options & {"local_lock=all", "local_lock=posix"}
    return False

"""A rank's closed segments reduced during the job, by a process of its own (optional, off by
default: ``Config.compact_interval_s``, ``GOODTRACE_COMPACT_INTERVAL_S``).

``python -m goodtrace.read.rank_compact ROOT RANK_DIR SESSION INTERVAL PARENT_PID`` is started
by the recorder (:mod:`goodtrace.record.io.compactor`) when it opens a session on a local or
NFS run directory. Every ``INTERVAL`` seconds it reduces the session's segments the writer has
rotated away from (every one but the last) into the segment cache, as a report would
(:func:`compact_session`: the fold's map of each file, ``extract_segments``, kept as a chunk of
kind ``model``; the reference rank's detail too when the rank is 0), in a folder of its own,
``RUN/compact/cache/ranks/<rank dir>/<session>/``: one writer per folder, whatever the other
ranks do, and the report reads every such folder beside its own (``segment_cache.rank_chunks``).
Chunks are merged as a report merges its own (``SegmentCache.merging``).

When its standard input ends (the recorder's ``finish()`` closed the pipe, or the job's process
died) or the job's process is gone, it reduces the session's files once more, this time also
the last segment when the session finished (its finish record is in it), and exits. It runs at
the lowest CPU priority, with one DuckDB thread; whatever fails is written to ``compact.log`` in
its folder and never reaches the job, which does not wait for it.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import sys
import tempfile
import time
import traceback

from goodtrace.read import detail, duckdb_sql
from goodtrace.read.cache_keep import closed_files, file_identities, last_segments, store_closed
from goodtrace.read.compact import COMPACT_DIR
from goodtrace.read.discovery import collect_sessions, count_lines, int_or_none, read_header
from goodtrace.read.engine import Engine, fold_sessions
from goodtrace.read.file_skips import FileSkips
from goodtrace.read.segment_cache import CACHE_DIR, RANKS_DIR, Hit, SegmentCache
from goodtrace.read.segments import SEGMENT_SUFFIX, segment_order
from goodtrace.record.process import pid_alive

__all__ = ["compact_session", "rank_cache_folder"]

LOG_NAME = "compact.log"


def rank_cache_folder(root: str, rank_dir: str, session: str) -> str:
    """Where the compactor of ``session`` (of the rank directory ``rank_dir``) keeps its chunks."""
    return os.path.join(root, COMPACT_DIR, CACHE_DIR, RANKS_DIR, rank_dir, session)


def _session_files(root: str, rank_dir: str, session: str) -> list[str]:
    folder = os.path.join(root, rank_dir)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [os.path.join(folder, name) for name in sorted(names, key=segment_order)
            if name.startswith(session + ".") and name.endswith(SEGMENT_SUFFIX) and os.path.isfile(os.path.join(folder, name))]


def compact_session(root: str, rank_dir: str, session: str, *, final: bool) -> None:
    """Reduce the closed segments of ``session`` not kept yet into its folder of the segment
    cache; ``final``: the session's process is gone, so its last segment is read too (and kept
    when the session finished)."""
    paths = _session_files(root, rank_dir, session)
    if not paths:
        return
    files: list[tuple[str, object]] = []
    for p in paths:
        with contextlib.suppress(OSError):
            files.append((p, read_header(p)))

    def lines_of(p: str) -> int | None:
        try:
            return count_lines(p)
        except OSError:
            return None

    drafts = collect_sessions(files, [], lines_of, {})
    if not drafts:
        return
    draft = next(iter(drafts.values()))
    drafts = {session: draft}
    main_tids = {0: int_or_none(draft.header.get("main_tid"))}
    fid_of = {p: i for i, p in enumerate(draft.files)}
    path_of = {i: p for p, i in fid_of.items()}
    sid_of_fid = {i: 0 for i in path_of}
    identities = file_identities(root, drafts, main_tids, {})
    last = last_segments(drafts, files)[0]
    wanted = [p for p in draft.files if p in identities and (final or p != last)]
    folder = rank_cache_folder(root, rank_dir, session)
    os.makedirs(folder, exist_ok=True)
    cache = SegmentCache(folder)
    reference = draft.header.get("rank") == 0
    kinds = [("model", duckdb_sql.SEGMENT_NAMES)] + ([("detail", detail.DETAIL_NAMES)] if reference else [])
    found = {kind: cache.find(kind, {fid_of[p]: identities[p] for p in wanted}) for kind, _ in kinds}
    todo = [p for p in wanted if any(fid_of[p] not in hits for hits in found.values())]
    if not todo:
        return
    tmpdir = tempfile.mkdtemp(prefix="goodtrace-compact-")
    try:
        con = duckdb_sql.connect(tmpdir)
        try:
            con.execute("SET threads=1")
            for statement in duckdb_sql.MODEL_TABLES:
                con.execute(statement)
            duckdb_sql.insert_rows(con, "sessmain", list(main_tids.items()))
            skips = FileSkips()
            model_hits = found["model"]
            for fid in _load_for_merge(cache, con, "model", model_hits, sid_of_fid):
                del model_hits[fid]
            for fid, hit in model_hits.items():
                skips.add_stored(path_of[fid], hit.skipped)
            fold = [p for p in wanted if fid_of[p] not in model_hits]
            fold_sessions(con, {0: fold} if fold else {}, fid_of, main_tids, tmpdir, Engine(workers=1), None, 0,
                          len(fold), skips)
            closed = closed_files(con, drafts, files) & set(wanted)
            for kind, tables in kinds:
                hits = found[kind]
                if kind == "detail":
                    detail.create_detail_tables(con)
                    for fid in _load_for_merge(cache, con, kind, hits, sid_of_fid):
                        del hits[fid]
                    detail.extract_details(
                        con, [(skips.substitutes.get(p, p), 0, fid_of[p]) for p in sorted(closed, key=lambda q: fid_of[q])
                              if fid_of[p] not in hits], [])
                store_closed(cache, con, root, kind, tables, {fid_of[p]: identities[p] for p in closed}, hits, skips,
                             path_of)
        finally:
            con.close()
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _load_for_merge(cache: SegmentCache, con: object, kind: str, hits: dict[int, Hit],
                    sid_of_fid: dict[int, int]) -> set[int]:
    """The rows of the chunks the next one of ``kind`` will hold (:meth:`SegmentCache.merging`),
    loaded first (returns the files whose chunk could not be read)."""
    merged = cache.merging(kind)
    wanted = {fid: hit for fid, hit in hits.items() if hit.chunk in merged}
    return cache.load(con, kind, wanted, sid_of_fid) if wanted else set()


def _parent_gone(parent: int) -> bool:
    return os.getppid() != parent or not pid_alive(parent)


def _log(folder: str, text: str) -> None:
    with contextlib.suppress(OSError):
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, LOG_NAME), "a", encoding="utf-8") as handle:
            handle.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")


def serve(root: str, rank_dir: str, session: str, interval: float, parent: int) -> None:
    """Compact every ``interval`` seconds until standard input ends or ``parent`` is gone; then
    once more, finally."""
    if os.getpriority(os.PRIO_PROCESS, 0) < 19:  # started by hand: the job's threads first, always
        with contextlib.suppress(OSError):
            os.nice(19 - os.getpriority(os.PRIO_PROCESS, 0))
    folder = rank_cache_folder(root, rank_dir, session)
    final = False
    while not final:
        try:
            ready, _, _ = select.select([sys.stdin.fileno()], [], [], interval)
        except (OSError, ValueError):
            ready = []
            time.sleep(interval)
        if ready:
            try:
                data = os.read(sys.stdin.fileno(), 4096)
            except OSError:
                data = b""
            final = not data
        final = final or _parent_gone(parent)
        try:
            compact_session(root, rank_dir, session, final=final)
        except Exception:
            _log(folder, traceback.format_exc().rstrip())


def main(argv: list[str]) -> int:
    try:
        root, rank_dir, session, interval, parent = argv[0], argv[1], argv[2], float(argv[3]), int(argv[4])
    except (IndexError, ValueError):
        print("usage: python -m goodtrace.read.rank_compact ROOT RANK_DIR SESSION INTERVAL PARENT_PID", file=sys.stderr)
        return 2
    serve(root, rank_dir, session, interval, parent)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

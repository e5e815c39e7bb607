"""One mapping of each session's clock onto its attempt's reference clock (reader side).

:func:`loaded_clocks` turns each session's clock samples (``SessionRecords.clock``) into one
:class:`SessionClock` per session, mapping that session's monotonic times onto the
monotonic clock of its attempt's reference session (and to wall time through the reference's
anchor). Sessions without measurements fall back to their (wall, monotonic) anchors, which is
exact on one host and NTP-accurate across hosts. The offsets themselves are measured in the job
(:mod:`goodtrace.record.clocksync`): ``reference = local + offset_ns``, accurate to rtt/2.
"""

from __future__ import annotations

import bisect
import dataclasses
from array import array
from collections.abc import Mapping, Sequence

from goodtrace.read.loaded import LoadedRun, SessionRecords

__all__ = ["ClockSource", "SessionClock", "align", "loaded_clocks"]


@dataclasses.dataclass(frozen=True)
class SessionClock:
    """How one session's monotonic times map onto its reference session's clock.

    ``source`` is ``"reference"`` (the session is the reference), ``"measured"`` (from its
    clock records) or ``"anchor"`` (from the wall/monotonic anchors of both headers).
    ``times`` and ``offsets`` are the samples kept (on this session's clock, sorted by time, and
    their offsets), as compact columns: a week-long session has hundreds of them, every rank's
    are held.
    """

    session_id: str
    reference_session: str
    source: str
    times: array[int]
    offsets: array[int]
    anchor_offset_ns: int
    reference_wall_minus_mono_ns: int

    def offset_at(self, t: int) -> int:
        """Offset (ns) to add to this session's time ``t``; linear between measurements."""
        times, offsets = self.times, self.offsets
        if not times:
            return self.anchor_offset_ns
        index = bisect.bisect_left(times, t)
        if index <= 0:
            return offsets[0]
        if index >= len(times):
            return offsets[-1]
        ta, oa, tb, ob = times[index - 1], offsets[index - 1], times[index], offsets[index]
        if tb == ta:
            return ob
        return oa + (ob - oa) * (t - ta) // (tb - ta)

    def to_reference(self, t: int) -> int:
        """This session's monotonic ``t`` on the reference session's monotonic clock."""
        return t + self.offset_at(t)

    def wall_ns(self, t: int) -> int:
        """This session's monotonic ``t`` as wall-clock ns, via the reference's anchor."""
        return self.to_reference(t) + self.reference_wall_minus_mono_ns


@dataclasses.dataclass(frozen=True)
class ClockSource:
    """What the mapping of one session is built from: its anchor and its clock samples."""

    key: str
    rank: int
    wall_minus_mono_ns: int
    samples: array[int]  # t, offset_ns, rtt_ns of each sample on its own clock, flat


def align(attempt: Sequence[ClockSource], *, reference_rank: int = 0, max_rtt_factor: float = 4.0) -> dict[str, SessionClock]:
    """The mapping of every session of one attempt onto its reference session's clock.

    The reference is the session of ``reference_rank`` (the rank the offsets were measured
    against), else the lowest rank present. Measurements whose round trip exceeds
    ``max_rtt_factor`` times that session's best round trip are ignored (a congested exchange
    is less accurate than an earlier or later quiet one); sessions without measurements fall
    back to the wall/monotonic anchors.
    """
    result: dict[str, SessionClock] = {}
    if not attempt:
        return result
    candidates = [s for s in attempt if s.rank == reference_rank] or sorted(attempt, key=lambda s: s.rank)
    reference = candidates[0]
    ref_anchor = reference.wall_minus_mono_ns
    for source in attempt:
        anchor = source.wall_minus_mono_ns - ref_anchor
        if source is reference:
            result[source.key] = SessionClock(source.key, reference.key, "reference", array("q"), array("q"), 0,
                                              ref_anchor)
            continue
        flat = source.samples
        samples = sorted(s for s in zip(flat[0::3], flat[1::3], flat[2::3], strict=True) if s[2] >= 0)
        if samples and reference.rank == reference_rank:
            best = min(rtt for _, _, rtt in samples)
            limit = max(best * max_rtt_factor, best + 100_000)
            kept = [s for s in samples if s[2] <= limit]
            result[source.key] = SessionClock(source.key, reference.key, "measured", array("q", (t for t, _, _ in kept)),
                                              array("q", (o for _, o, _ in kept)), anchor, ref_anchor)
        else:
            result[source.key] = SessionClock(source.key, reference.key, "anchor", array("q"), array("q"), anchor,
                                              ref_anchor)
    return result


def loaded_clocks(run: LoadedRun, attempts: Sequence[Sequence[int]],
                  records_of: Mapping[int, SessionRecords] | None = None) -> dict[int, SessionClock]:
    """Per session index of a loaded run, its mapping (``attempts``: session indexes of each;
    ``records_of``: each session's clock samples, as the analysis took them when it cut it; by
    default the run's records)."""
    out: dict[int, SessionClock] = {}
    for members in attempts:
        sources = []
        for index in members:
            info = run.sessions[index]
            records = (records_of if records_of is not None else run.session_records).get(index)
            sources.append(ClockSource(str(index), info.rank, info.wall_anchor - info.mono_anchor,
                                       records.clock if records is not None else array("q")))
        out.update({int(k): v for k, v in align(sources).items()})
    return out



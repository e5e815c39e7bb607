"""One mapping of each session's clock onto its attempt's reference clock (reader side).

:func:`clock_offsets` turns the ``clock`` records of a :class:`goodtrace.read.sessions.Run` into
one :class:`SessionClock` per session, mapping that session's monotonic times onto the
monotonic clock of its attempt's reference session (and to wall time through the reference's
anchor). Sessions without measurements fall back to their (wall, monotonic) anchors, which is
exact on one host and NTP-accurate across hosts. The offsets themselves are measured in the job
(:mod:`goodtrace.record.clocksync`): ``reference = local + offset_ns``, accurate to rtt/2.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import operator
from collections.abc import Callable

from goodtrace import schema
from goodtrace.read.sessions import Run, Session

__all__ = ["SessionClock", "clock_offsets", "session_clocks"]


@dataclasses.dataclass(frozen=True)
class SessionClock:
    """How one session's monotonic times map onto its reference session's clock.

    ``source`` is ``"reference"`` (the session is the reference), ``"measured"`` (from its
    clock records) or ``"anchor"`` (from the wall/monotonic anchors of both headers).
    ``samples`` are ``(t, offset_ns, rtt_ns)`` on this session's clock, sorted by ``t``.
    """

    session_id: str
    reference_session: str
    source: str
    samples: tuple[tuple[int, int, int], ...]
    anchor_offset_ns: int
    reference_wall_minus_mono_ns: int

    def offset_at(self, t: int) -> int:
        """Offset (ns) to add to this session's time ``t``; linear between measurements."""
        samples = self.samples
        if not samples:
            return self.anchor_offset_ns
        index = bisect.bisect_left(samples, (t,))
        if index <= 0:
            return samples[0][1]
        if index >= len(samples):
            return samples[-1][1]
        (ta, oa, _), (tb, ob, _) = samples[index - 1], samples[index]
        if tb == ta:
            return ob
        return oa + (ob - oa) * (t - ta) // (tb - ta)

    def to_reference(self, t: int) -> int:
        """This session's monotonic ``t`` on the reference session's monotonic clock."""
        return t + self.offset_at(t)

    def wall_ns(self, t: int) -> int:
        """This session's monotonic ``t`` as wall-clock ns, via the reference's anchor."""
        return self.to_reference(t) + self.reference_wall_minus_mono_ns


def _wall_minus_mono(session: Session) -> int:
    return int(session.header[schema.F_WALL]) - int(session.header[schema.F_MONO])


def clock_offsets(run: Run, *, max_rtt_factor: float = 4.0) -> dict[str, SessionClock]:
    """Per session id, the mapping of its clock onto its attempt's reference session.

    The reference of an attempt is the session whose rank the clock records name
    (``attrs.reference_rank``, rank 0 by default), else the lowest rank present. Measurements
    whose round trip exceeds ``max_rtt_factor`` times that session's best round trip are ignored
    (a congested exchange is less accurate than an earlier or later quiet one).
    """
    result: dict[str, SessionClock] = {}
    for sessions in run.attempts():
        if not sessions:
            continue
        wanted_reference = 0
        for session in sessions:
            for record in session.of_kind(schema.CLOCK):
                attrs = record.get(schema.F_ATTRS)
                if isinstance(attrs, dict) and isinstance(attrs.get("reference_rank"), int):
                    wanted_reference = int(attrs["reference_rank"])
                    break
        candidates = [s for s in sessions if s.rank == wanted_reference] or sorted(sessions, key=lambda s: s.rank)
        reference = candidates[0]
        ref_anchor = _wall_minus_mono(reference)
        for session in sessions:
            anchor = _wall_minus_mono(session) - ref_anchor
            if session is reference:
                result[session.session_id] = SessionClock(
                    session.session_id, reference.session_id, "reference", (), 0, ref_anchor
                )
                continue
            samples = _clock_samples(session)
            if samples and reference.rank == wanted_reference:
                best = min(rtt for _, _, rtt in samples)
                limit = max(best * max_rtt_factor, best + 100_000)
                kept = tuple(s for s in samples if s[2] <= limit)
                result[session.session_id] = SessionClock(
                    session.session_id, reference.session_id, "measured", kept, anchor, ref_anchor
                )
            else:
                result[session.session_id] = SessionClock(
                    session.session_id, reference.session_id, "anchor", (), anchor, ref_anchor
                )
    return result


def _clock_samples(session: Session) -> list[tuple[int, int, int]]:
    samples: list[tuple[int, int, int]] = []
    for record in session.of_kind(schema.CLOCK):
        offset, rtt, t = record.get(schema.F_OFFSET), record.get(schema.F_RTT), record.get(schema.F_T)
        if isinstance(offset, int) and isinstance(rtt, int) and isinstance(t, int) and rtt >= 0:
            samples.append((t, offset, rtt))
    samples.sort()
    return samples


def session_clocks(run: Run) -> dict[str, Callable[[int], int]]:
    """Per session id, a function mapping its monotonic ns onto aligned wall-clock ns.

    Uses the measured clock offsets (:func:`clock_offsets`).
    """
    clocks = clock_offsets(run)
    result: dict[str, Callable[[int], int]] = {}
    for session in run.sessions:
        clock = clocks.get(session.session_id)
        if clock is None:
            result[session.session_id] = session.wall_ns
        elif len(clock.samples) <= 1:  # a constant shift: skip the per-call interpolation
            shift = clock.offset_at(0) + clock.reference_wall_minus_mono_ns
            result[session.session_id] = functools.partial(operator.add, shift)
        else:
            result[session.session_id] = clock.wall_ns
    return result

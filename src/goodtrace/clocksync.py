"""Clock alignment across ranks: measure each rank's offset to a reference rank, align timelines.

Measuring (framework-neutral): :func:`measure_offset` runs an NTP-like ping-pong between this
rank and the reference rank through two callables, ``send(peer, values)`` and
``recv(peer) -> values`` (lists of ints), and keeps the sample with the smallest round trip.
The result says ``reference_clock = local_clock + offset_ns`` with an error of at most
``rtt_ns / 2``. torch.distributed (``goodtrace.integrations.torch``) and JAX adapters supply the
callables; the recorder stores each measurement as a ``clock`` record.

Aligning (reader side, no framework needed): :func:`clock_offsets` turns the ``clock`` records
of a :class:`goodtrace.reader.Run` into one :class:`SessionClock` per session, mapping that
session's monotonic times onto the monotonic clock of its attempt's reference session (and to
wall time through the reference's anchor). Sessions without measurements fall back to their
(wall, monotonic) anchors, which is exact on one host and NTP-accurate across hosts.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from goodtrace import schema

if TYPE_CHECKING:
    from goodtrace.reader import Run, Session

__all__ = [
    "OffsetSample",
    "SessionClock",
    "clock_offsets",
    "estimate_offset",
    "measure_offset",
]

Send = Callable[[int, Sequence[int]], None]
Recv = Callable[[int], Sequence[int]]


@dataclasses.dataclass(frozen=True)
class OffsetSample:
    """``reference_clock ≈ local_clock + offset_ns``, accurate to ``rtt_ns / 2``."""

    offset_ns: int
    rtt_ns: int


def estimate_offset(t0: int, t1: int, t2: int, t3: int) -> OffsetSample:
    """One ping-pong: sent at local ``t0``, received at reference ``t1``, answered at reference
    ``t2``, answer received at local ``t3``. Assumes symmetric one-way delays (as NTP does)."""
    return OffsetSample(offset_ns=((t1 - t0) + (t2 - t3)) // 2, rtt_ns=(t3 - t0) - (t2 - t1))


def measure_offset(
    *,
    rank: int,
    world_size: int,
    clock: Callable[[], int],
    send: Send,
    recv: Recv,
    rounds: int = 16,
    reference_rank: int = 0,
) -> OffsetSample:
    """Every rank calls this together. The reference rank answers ``rounds`` pings from each
    other rank in turn (and returns a zero offset); every other rank returns its min-RTT sample.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if not 0 <= reference_rank < world_size or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} / reference rank {reference_rank} not in a world of {world_size}")
    if rank == reference_rank:
        for peer in range(world_size):
            if peer == reference_rank:
                continue
            for _ in range(rounds):
                recv(peer)
                t1 = clock()
                send(peer, (t1, clock()))
        return OffsetSample(0, 0)
    best: OffsetSample | None = None
    for _ in range(rounds):
        t0 = clock()
        send(reference_rank, (t0,))
        answer = recv(reference_rank)
        t3 = clock()
        sample = estimate_offset(t0, int(answer[0]), int(answer[1]), t3)
        if best is None or sample.rtt_ns < best.rtt_ns:
            best = sample
    assert best is not None  # rounds >= 1
    return best


# ---------------------------------------------------------------------------------- reader side


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

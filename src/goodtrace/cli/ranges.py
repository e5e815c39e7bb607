"""The command line's range forms: ``--steps A:B`` and ``--ranks 0,3,8-15``."""

from __future__ import annotations

__all__ = ["format_ranks", "parse_ranks", "parse_steps"]


def parse_steps(text: str) -> tuple[int | None, int | None]:
    """``"A:B"`` (inclusive), ``"A:"``, ``":B"`` or a single step ``"A"``."""
    parts = text.split(":")
    try:
        if len(parts) == 1:
            step = int(parts[0])
            return step, step
        if len(parts) == 2:
            first = int(parts[0]) if parts[0].strip() else None
            last = int(parts[1]) if parts[1].strip() else None
        else:
            raise ValueError
    except ValueError:
        raise ValueError(f"bad step range {text!r}: expected A:B (inclusive), A:, :B or A") from None
    if first is not None and last is not None and last < first:
        raise ValueError(f"bad step range {text!r}: it is empty (A:B includes both ends, so A must not be after B)")
    return first, last


def parse_ranks(text: str) -> frozenset[int]:
    """``"0,3,8-15"`` -> {0, 3, 8, ..., 15}."""
    ranks: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                low, high = (int(x) for x in part.split("-", 1))
                if high < low or low < 0:
                    raise ValueError
                ranks.update(range(low, high + 1))
            else:
                value = int(part)
                if value < 0:
                    raise ValueError
                ranks.add(value)
    except ValueError:
        raise ValueError(f"bad rank list {text!r}: expected e.g. 0,3,8-15") from None
    if not ranks:
        raise ValueError(f"bad rank list {text!r}: no rank in it")
    return frozenset(ranks)


def format_ranks(ranks: set[int] | frozenset[int]) -> str:
    """{0, 1, 2, 5, 7, 8} -> ``"0-2,5,7-8"`` (the form :func:`parse_ranks` reads)."""
    parts: list[str] = []
    ordered = sorted(ranks)
    start = 0
    for i, rank in enumerate(ordered):
        if i + 1 == len(ordered) or ordered[i + 1] != rank + 1:
            first = ordered[start]
            parts.append(str(first) if first == rank else f"{first}-{rank}")
            start = i + 1
    return ",".join(parts)

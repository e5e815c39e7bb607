"""Metric names in the live line's gathered vectors: each metric has a slot (a 48-bit hash of
its name, the same on every rank), and a log interval announces, in a region of its vector, the
names no gather has carried yet, so that every rank learns every other rank's names without
a second collective."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

NAME_FLOATS = 128  # names announced in a log interval: (slot, byte count, bytes 6 per float)...
NAME_CHARS = 100  # names learned from other ranks are cut to this
NAME_BYTES_PER_FLOAT = 6
MAX_KNOWN_NAMES = 100_000


class MetricNames:
    """This rank's slots and the names it knows (its own and those the gathers announced)."""

    def __init__(self, warn: Callable[[str, str], None]) -> None:
        self._warn = warn
        self._slots: dict[str, int] = {}  # name -> slot (48-bit hash)
        self.names: dict[int, str] = {}  # slot -> name, ours and learned from the gathers

    def slot(self, name: str) -> int:
        """The metric's slot: a 48-bit hash of its name, the same on every rank."""
        slot = self._slots.get(name)
        if slot is None:
            digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=6).digest()
            slot = int.from_bytes(digest, "big")
            if len(self._slots) < MAX_KNOWN_NAMES:
                self._slots[name] = slot
        return slot

    def announce(self, names: list[str]) -> list[float]:
        """Floats naming the slots of ``names`` that no gather has named yet, as many as fit."""
        region: list[float] = []
        for name in names:
            slot = self.slot(name)
            if slot in self.names:
                continue
            data = name[:NAME_CHARS].encode("utf-8", "surrogatepass")
            words = -(-len(data) // NAME_BYTES_PER_FLOAT)
            if len(region) + 2 + words > NAME_FLOATS:
                continue  # announced in a later log interval; until then other ranks show its slot
            region.append(float(slot))
            region.append(float(len(data)))
            padded = data.ljust(words * NAME_BYTES_PER_FLOAT, b"\0")
            for i in range(0, len(padded), NAME_BYTES_PER_FLOAT):
                region.append(float(int.from_bytes(padded[i: i + NAME_BYTES_PER_FLOAT], "big")))
            if len(self.names) < MAX_KNOWN_NAMES:
                self.names[slot] = name  # we know it; the gather tells the others
        return region

    def learn(self, vectors: Sequence[Sequence[float]], start: int, count_at: int) -> None:
        """Read the names other ranks announced in a gathered log interval (``vectors`` of this
        log interval's layout; the region starts at ``start``, its length is at ``count_at``)."""
        for vector in vectors:
            used = min(int(vector[count_at]), NAME_FLOATS)
            region = vector[start: start + used]
            i = 0
            while i + 2 <= used:
                slot, length = int(region[i]), int(region[i + 1])
                words = -(-length // NAME_BYTES_PER_FLOAT)
                data = b"".join(int(w).to_bytes(NAME_BYTES_PER_FLOAT, "big") for w in region[i + 2: i + 2 + words])
                i += 2 + words
                name = data[:length].decode("utf-8", "surrogatepass")
                known = self.names.get(slot)
                if known is None:
                    if len(self.names) < MAX_KNOWN_NAMES:
                        self.names[slot] = name
                elif not known.startswith(name):
                    self._warn(f"slot:{slot}", f"metric names {known!r} and {name!r} share a live slot "
                               "(a 48-bit hash collision): the live line merges them")

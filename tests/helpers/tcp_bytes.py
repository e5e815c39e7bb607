"""What this process sent and received over TCP, measured by the kernel: the sum of
``tcpi_bytes_acked`` and ``tcpi_bytes_received`` (``TCP_INFO``, Linux 4.1+) over every TCP
socket the process holds open. On loopback every byte sent is acknowledged at once, so the
first is the bytes sent. Sockets closed between two readings drop out of the sum: read it
around a window in which the sockets stay open (a gloo group's do)."""

from __future__ import annotations

import os
import socket
import stat
import struct
from typing import NamedTuple

_TCP_INFO_LEN = 232
_BYTES_ACKED_AT = 120  # u64 tcpi_bytes_acked, then u64 tcpi_bytes_received


class TcpBytes(NamedTuple):
    sockets: int
    sent: int
    received: int


def tcp_bytes() -> TcpBytes:
    """This process's open TCP sockets, and their bytes sent and received since they opened."""
    sockets = sent = received = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            dup = socket.socket(fileno=os.dup(fd))
        except (OSError, ValueError):
            continue
        try:
            if dup.type != socket.SOCK_STREAM or dup.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            info = dup.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
            if len(info) < _BYTES_ACKED_AT + 16:
                continue
            acked, got = struct.unpack_from("QQ", info, _BYTES_ACKED_AT)
            sockets += 1
            sent += acked
            received += got
        except OSError:
            continue
        finally:
            dup.close()  # the duplicate only
    return TcpBytes(sockets, sent, received)

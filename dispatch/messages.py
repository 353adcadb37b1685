"""The message format between a worker, its fork server and its jobs: JSON, each message preceded
by its length (4 bytes, network order), descriptors passed beside it where asked.

Standard library only: the fork server, its job processes and the zygote read it before
anything else of jobman is imported.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

_HEADER = struct.Struct("!I")


def send_msg(sock: socket.socket, obj: Any, fds: list[int] | None = None) -> None:
    """Send one message (and ``fds``, with its header) whole on a blocking socket."""
    data = json.dumps(obj, separators=(",", ":")).encode()
    if fds:
        socket.send_fds(sock, [_HEADER.pack(len(data))], fds)
        sock.sendall(data)
    else:
        sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exactly(sock: socket.socket, size: int, into: bytearray) -> bool:
    while len(into) < size:
        chunk = sock.recv(size - len(into))
        if not chunk:
            return False
        into.extend(chunk)
    return True


def recv_msg(sock: socket.socket, with_fds: bool = False) -> tuple[Any, list[int]] | None:
    """The next message and the descriptors sent with it; None at the end of the stream."""
    fds: list[int] = []
    head = bytearray()
    if with_fds:
        data, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, 4)
        if not data:
            return None
        head.extend(data)
    if not _recv_exactly(sock, _HEADER.size, head):
        return None
    (size,) = _HEADER.unpack(head)
    body = bytearray()
    if not _recv_exactly(sock, size, body):
        return None
    return json.loads(body), fds


class Frames:
    """Messages read from a non-blocking socket as they arrive."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        """The messages completed by ``data``; a partial one waits for the rest."""
        self.buffer.extend(data)
        out = []
        while len(self.buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self.buffer)
            if len(self.buffer) < _HEADER.size + size:
                break
            out.append(json.loads(self.buffer[_HEADER.size:_HEADER.size + size]))
            del self.buffer[:_HEADER.size + size]
        return out

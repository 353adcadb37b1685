"""The message format between a worker, its fork server and its jobs: JSON, each message preceded
by its length (4 bytes, network order), descriptors passed beside it where asked.

Every message is one JSON object of at most :data:`MAX_MESSAGE_BYTES`; a reader refuses anything
else with :class:`MalformedMessage`, and :func:`job_request` checks what a job may ask of its worker,
since a job's process runs code the worker must not trust.

Standard library only: the fork server, its job processes and the zygote read it before
anything else of jobman is imported.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator
from typing import Any

_HEADER = struct.Struct("!I")
# Well above a job's largest storable state (4 MiB of JSON), so that limit keeps its own clearer reason.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# How a job's report may say its call ended; CRASHED: a rank of a gang job was killed.
JOB_STATUSES = ("DONE", "INCOMPLETE", "FAILED", "CRASHED")
_STEP_LIMIT = 2**63  # a metric's step is a 64-bit integer in the database


class MalformedMessage(ValueError):
    """A message that breaks the format: too long, not JSON, not an object, or not a request its
    reader knows. The text says what is wrong, in a few words."""


def send_msg(sock: socket.socket, obj: Any, fds: list[int] | None = None) -> None:
    """Send one message (and ``fds``, with its header) whole on a blocking socket."""
    data = json.dumps(obj, separators=(",", ":")).encode()
    if fds:
        socket.send_fds(sock, [_HEADER.pack(len(data))], fds)
        sock.sendall(data)
    else:
        sock.sendall(_HEADER.pack(len(data)) + data)


def send_nowait(sock: socket.socket, obj: Any) -> bool:
    """Send one message whole without waiting; False if the peer's unread messages leave no room
    for it (the stream is then broken: the caller ends the link)."""
    body = json.dumps(obj, separators=(",", ":")).encode()
    data = memoryview(_HEADER.pack(len(body)) + body)
    while data:
        try:
            sent = sock.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        data = data[sent:]
    return True


def _recv_exactly(sock: socket.socket, size: int, into: bytearray) -> bool:
    while len(into) < size:
        chunk = sock.recv(size - len(into))
        if not chunk:
            return False
        into.extend(chunk)
    return True


def _checked_size(size: int) -> int:
    if size > MAX_MESSAGE_BYTES:
        raise MalformedMessage(f"a length of {size} bytes, over the limit of {MAX_MESSAGE_BYTES}")
    return size


def decode(body: bytes | bytearray) -> dict[str, Any]:
    """One message's body as the object it must be; MalformedMessage if it is not."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise MalformedMessage(f"not valid JSON ({str(exc)[:200]})") from None
    if not isinstance(obj, dict):
        raise MalformedMessage(f"a JSON {type(obj).__name__} where an object belongs")
    return obj


def recv_msg(sock: socket.socket, with_fds: bool = False) -> tuple[dict[str, Any], list[int]] | None:
    """The next message and the descriptors sent with it; None at the end of the stream.
    MalformedMessage if what came breaks the format."""
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
    if not _recv_exactly(sock, _checked_size(size), body):
        return None
    return decode(body), fds


class Frames:
    """Messages read from a non-blocking socket as they arrive."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        """The messages completed by ``data``, in order; a partial one waits for the rest. Iterating
        raises MalformedMessage at the first bad one (the ones before it are yielded first)."""
        self.buffer.extend(data)
        return self._complete()

    def _complete(self) -> Iterator[dict[str, Any]]:
        while len(self.buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self.buffer)
            end = _HEADER.size + _checked_size(size)
            if len(self.buffer) < end:
                return
            body = bytes(self.buffer[_HEADER.size : end])
            del self.buffer[:end]
            yield decode(body)


def _is_number(value: Any) -> bool:
    """A float (NaN and the infinities too: a diverged curve is kept) or an int a float can hold."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True


def job_request(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` if it is a request a job may send its worker, checked field by field; else
    MalformedMessage saying what is wrong.

    A ``save`` carries ``results`` (an object); a ``log`` an integer ``step`` and ``metrics`` (names to
    numbers, NaN and the infinities included); a ``report`` its ``status`` (one of
    :data:`JOB_STATUSES`), ``results`` (an object) and ``error`` (text or null).
    """
    op = message.get("op")
    if op == "save":
        _need_object(message, "results")
    elif op == "log":
        step = message.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or not -_STEP_LIMIT <= step < _STEP_LIMIT:
            raise MalformedMessage("a log whose step is not a 64-bit integer")
        metrics = _need_object(message, "metrics")
        for name, value in metrics.items():
            if not _is_number(value):
                raise MalformedMessage(f"a log whose metric {name[:80]!r} is not a number")
    elif op == "report":
        if message.get("status") not in JOB_STATUSES:
            raise MalformedMessage(f"a report with the unknown status {str(message.get('status'))[:80]!r}")
        if message.get("results") is not None or message["status"] == "DONE":  # None: keep the checkpoint
            _need_object(message, "results")
        if not isinstance(message.get("error"), (str, type(None))):
            raise MalformedMessage("a report whose error is not text")
    else:
        raise MalformedMessage(f"the unknown request {str(op)[:80]!r}")
    return message


def _need_object(message: dict[str, Any], field: str) -> dict[str, Any]:
    value = message.get(field)
    if not isinstance(value, dict):
        got = "no" if field not in message else f"a {type(value).__name__} as"
        raise MalformedMessage(f"a {message['op']} with {got} {field}, where an object belongs")
    return value

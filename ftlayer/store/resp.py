"""A command in RESP, as the buffers redis-py's ``Connection.send_packed_command`` sends: a large
argument goes as its own buffer, never copied.

Why: redis-py packs a command with hiredis's ``pack_command`` when hiredis is installed, which
builds the whole command in one new buffer. For an argument of a megabyte or more that costs
about 1.4-1.9 us per KiB on the reference VM (0.15-0.36 below 64 KiB), where sending the
argument as it is costs nothing here: ingest's PERSIST carries up to ``CALL_MAX_BYTES`` (4 MiB)
of chunks in one argument, so with 1 KiB records the packing alone took about 2 us of the
driver's 8-10 us per record (py-spy, 2026-11-28). redis-py's pure-Python packer splits large
arguments too (``buffer_cutoff``); this does the same for the calls ftlayer sends itself that
carry such an argument (:func:`carries_big_arg`); a small command keeps hiredis's packer, the
cheaper one there.

Contract of :func:`pack_command`: the buffers, joined, are exactly the RESP array redis-py would
send for the same arguments (each encoded by the connection's encoder: ``str`` as UTF-8,
numbers as their text, ``bytes`` as they are). Every argument of :data:`BIG_ARG_BYTES` or more
is one buffer of its own, the very object the encoder returned; the small ones and the framing
between them are joined into as few buffers as that allows. Pure: it writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["BIG_ARG_BYTES", "carries_big_arg", "pack_command"]

# at and above this an argument is sent as its own buffer: joining it costs a copy of it, and
# below it the copy is cheaper than another send (redis-py's own packer cuts at 6,000 bytes)
BIG_ARG_BYTES = 16 * 1024


def carries_big_arg(args: Sequence[Any]) -> bool:
    """True if one of ``args`` is bytes-like of :data:`BIG_ARG_BYTES` or more: worth
    :func:`pack_command`. Below that hiredis's packer is the cheaper (about 7 us less for a
    15-argument command here), so callers keep it for small commands."""
    return any(isinstance(a, (bytes, bytearray, memoryview)) and len(a) >= BIG_ARG_BYTES for a in args)


def pack_command(args: Sequence[Any], encode: Callable[[Any], Any]) -> list[Any]:
    """The RESP array of ``args`` as a list of buffers (module contract); ``encode`` is the
    connection's (``Connection.encoder.encode``)."""
    out: list[Any] = []
    parts: list[bytes] = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = encode(arg)
        size = len(data)
        if size >= BIG_ARG_BYTES:
            parts.append(b"$%d\r\n" % size)
            out.append(b"".join(parts))
            out.append(data)
            parts = [b"\r\n"]
        else:
            parts += (b"$%d\r\n" % size, data, b"\r\n")
    out.append(b"".join(parts))
    return out

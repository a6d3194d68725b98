"""A line-file ingest source that resumes where it stopped: ``open/poll/close`` plus the ``ack`` hook.

:class:`LinesSource` reads text files (or standard input) line by line, one record per
line: a JSON value (``fmt="json"``) or the line's text (``fmt="text"``). Empty lines are
skipped. With ``worker=(i, n)`` it takes only the lines whose 0-based number ``k`` (counted
per file, empty lines included) has ``k % n == i``: ``n`` processes started with ``i = 0 ..
n-1`` share the files without overlap and without gaps, so no line is ingested twice or
never at the boundaries between workers.

Resume contract (files, not standard input): after each ``ack`` (ingest calls it once the
values are persisted, in the order they were polled) the byte offset just past the last
acked line is written atomically (temporary file + rename) to the file's offset file in
``offsets_dir`` (one per file path and worker). A new source with the same ``offsets_dir``
starts each file after its saved offset. So a killed process loses nothing: lines it had
persisted are not read again, except those persisted after the last offset write (at most
one ingest batch, read again: duplicates, never a gap). A line that cannot be parsed is
handed to ingest as an :class:`UnparsedLine`, which ingest rejects into the dead letters
(reason ``not valid JSON: <file>:<line>: <error>``, raw text kept) and acks like any value,
so the offset moves past it.

Offsets are for a file that only grows or stays the same. A file that shrank below its
saved offset (rotated or rewritten) is read from the start, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any, Literal

from ftlayer.logs import logger_for

log = logger_for(__name__)

STDIN = "-"
Format = Literal["json", "text"]


class UnparsedLine:
    """A line that is not valid JSON; ingest rejects it into the dead letters with ``ingest_rejection`` as reason."""

    __slots__ = ("error", "line", "path", "text")

    def __init__(self, path: str, line: int, text: str, error: str) -> None:
        self.path, self.line, self.text, self.error = path, line, text, error

    def __repr__(self) -> str:  # the dead letter keeps the repr as its payload
        return f"UnparsedLine({self.path}:{self.line + 1}: {self.error}: {self.text[:500]!r})"

    @property
    def ingest_rejection(self) -> str:  # ingest dead-letters it with this reason
        return f"not valid JSON: {self.path}:{self.line + 1}: {self.error}"

    def __getitem__(self, _key: Any) -> Any:  # a key selector on a bad line fails with the reason
        msg = f"{self.path}:{self.line + 1} is not valid JSON: {self.error}"
        raise ValueError(msg)


def offset_file(offsets_dir: Path, path: str, worker: tuple[int, int]) -> Path:
    """Where the offset of ``path`` read by ``worker`` is kept (name + hash of the absolute path)."""
    absolute = str(Path(path).resolve())
    digest = hashlib.sha256(absolute.encode()).hexdigest()[:16]
    i, n = worker
    return offsets_dir / f"{Path(path).name}.{digest}.w{i}of{n}.offset"


class LinesSource:
    """Lines of ``paths`` as records, resumable through ``offsets_dir`` (see the module contract)."""

    def __init__(self, paths: Sequence[str], *, fmt: Format = "json", worker: tuple[int, int] = (0, 1),
                 offsets_dir: Path | None = None, chunk: int = 1000) -> None:
        i, n = worker
        if n < 1 or not 0 <= i < n:
            msg = f"worker {i}/{n}: expected 0 <= i < n"
            raise ValueError(msg)
        self.paths = list(paths)
        self.fmt = fmt
        self.worker = worker
        self.offsets_dir = offsets_dir
        self.chunk = chunk
        self.read = 0  # records handed to ingest
        self.skipped_offsets: dict[str, int] = {}  # bytes skipped per file on resume
        self._file_index = 0
        self._fh: IO[bytes] | None = None
        self._line_no = 0
        self._inflight: deque[tuple[str, int]] = deque()  # (path, end offset) per value polled, in order

    # --- the source protocol ------------------------------------------------------------
    def open(self) -> None:
        self._file_index = 0
        self._fh = None

    def poll(self) -> Iterable[Any] | None:
        out: list[Any] = []
        while len(out) < self.chunk:
            fh = self._fh or self._next_file()
            if fh is None:
                return out or None  # None: every file ended
            raw = fh.readline()
            if not raw:
                self._close_file()
                continue
            number, self._line_no = self._line_no, self._line_no + 1
            if number % self.worker[1] != self.worker[0] or not raw.strip():
                continue  # another worker's line (or empty); re-skipped on resume, no offset write
            path = self.paths[self._file_index]
            out.append(self._parse(path, number, raw))
            self._inflight.append((path, fh.tell() if fh is not sys.stdin.buffer else -1))
        self.read += len(out)
        return out

    def ack(self, values: list[Any]) -> None:
        """Values persisted (in poll order): save the offset past the last one of each file."""
        last: dict[str, int] = {}
        for _ in values:
            path, end = self._inflight.popleft()
            last[path] = end
        for path, end in last.items():
            self._save(path, end)

    def close(self) -> None:
        self._close_file()

    # --- files and offsets ----------------------------------------------------------------
    def _next_file(self) -> IO[bytes] | None:
        while self._file_index < len(self.paths):
            path = self.paths[self._file_index]
            if path == STDIN:
                self._fh, self._line_no = sys.stdin.buffer, 0
                return self._fh
            fh = open(path, "rb")  # noqa: SIM115 -- kept open across polls, closed in _close_file
            start = self._saved(path)
            size = os.fstat(fh.fileno()).st_size
            if start > size:
                log.warning("%s is shorter (%d bytes) than its saved offset %d: reading it from the start",
                            path, size, start)
                start = 0
            self._line_no = 0
            if start:
                self._line_no = self._count_lines(fh, start)
                self.skipped_offsets[path] = start
            self._fh = fh
            return fh
        return None

    @staticmethod
    def _count_lines(fh: IO[bytes], upto: int) -> int:
        """Line numbers before byte ``upto`` (so the worker split stays the same on resume)."""
        count = 0
        while fh.tell() < upto:
            if not fh.readline():
                break
            count += 1
        return count

    def _close_file(self) -> None:
        if self._fh is not None and self._fh is not sys.stdin.buffer:
            self._fh.close()
        if self._fh is not None:
            self._file_index += 1
        self._fh = None

    def _parse(self, path: str, number: int, raw: bytes) -> Any:
        text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if self.fmt == "text":
            return text
        try:
            return json.loads(text)
        except ValueError as exc:
            return UnparsedLine(path, number, text, str(exc))

    def _saved(self, path: str) -> int:
        if self.offsets_dir is None or path == STDIN:
            return 0
        f = offset_file(self.offsets_dir, path, self.worker)
        try:
            return int(f.read_text().strip() or "0")
        except FileNotFoundError:
            return 0
        except ValueError:
            log.warning("offset file %s is not a number: reading %s from the start", f, path)
            return 0

    def _save(self, path: str, end: int) -> None:
        if self.offsets_dir is None or path == STDIN or end < 0:
            return
        self.offsets_dir.mkdir(parents=True, exist_ok=True)
        f = offset_file(self.offsets_dir, path, self.worker)
        tmp = f.with_suffix(".tmp")
        tmp.write_text(str(end))
        os.replace(tmp, f)

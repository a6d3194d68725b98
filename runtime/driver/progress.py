"""Progress display of long commands (demo, bench, and later chaos and soak).

:class:`TaskProgress` shows a rich progress bar when its stream is a terminal,
and plain ``[prefix] ...`` lines otherwise, so CI logs and tests that parse a
command's output see ordinary text:

- **bar** (a TTY): a rich bar (``transient=False``, so the last state stays on
  screen) with the done/total count and the elapsed time, and below it the
  figures (``persisted 1200  acked 1100  pending 100``) and the ``info`` text
  on their own line, so narrow terminals wrap them instead of squeezing the
  bar. :meth:`log` prints a line above the bar.
- **plain** (not a TTY, or ``interactive=False``): :meth:`update` prints
  ``[prefix]  12.3s  1100/3000  persisted   1200  acked   1100 ...`` at most
  every ``plain_interval_s`` seconds (every update with 0), and :meth:`close`
  prints the final state if the last line did not show it. Figures are
  right-aligned in 6 characters so consecutive lines line up.
  :meth:`log` prints ``[prefix] <message>``.

Nothing else is printed; benchmarks pass ``stream=sys.stderr`` so their
stdout stays machine-readable.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import TextIO

from rich.console import Console, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

Figures = Mapping[str, float]


class _BarWithFigures(Progress):
    """A rich Progress that draws each task's ``line`` field on its own line under the bar."""

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        for task in self.tasks:
            line = str(task.fields.get("line", ""))
            if line:
                yield Text("  " + line)


class TaskProgress:
    """One task's progress: a rich bar on a terminal, rate-limited plain lines elsewhere."""

    def __init__(
        self,
        prefix: str,
        total: float | None = None,
        *,
        stream: TextIO | None = None,
        interactive: bool | None = None,
        plain_interval_s: float = 2.0,
    ) -> None:
        self.prefix = prefix
        self.total = total
        self.stream = stream if stream is not None else sys.stdout
        self.interactive = _isatty(self.stream) if interactive is None else interactive
        self.plain_interval_s = plain_interval_s
        self.completed: float = 0.0
        self.info = ""
        self.figures: dict[str, float] = {}
        self._started = time.monotonic()
        self._last_line: float | None = None
        self._closed = False
        self._unprinted = True  # the state changed since the last plain line
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if self.interactive:
            self._progress = _BarWithFigures(
                TextColumn(f"[bold]{prefix}[/bold]"),
                BarColumn(bar_width=30),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=self.stream, force_terminal=True),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(prefix, total=total, line="")

    @property
    def elapsed_s(self) -> float:
        """Seconds since the display was created."""
        return time.monotonic() - self._started

    def update(
        self,
        completed: float | None = None,
        *,
        advance: float = 0.0,
        figures: Figures | None = None,
        info: str | None = None,
        force: bool = False,
    ) -> None:
        """Set (``completed``) or advance the count, the figures and the info text.

        ``force`` prints a plain line now. Does nothing after :meth:`close`.
        """
        if self._closed:
            return
        if completed is not None:
            self.completed = completed
        self.completed += advance
        if figures is not None:
            self.figures = dict(figures)
        if info is not None:
            self.info = info
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=self._shown(), line=self._text(aligned=False))
            return
        self._unprinted = True
        now = time.monotonic()
        if force or self._last_line is None or now - self._last_line >= self.plain_interval_s:
            self._print_plain()
            self._last_line = now

    def log(self, message: str) -> None:
        """A message line: above the bar, or ``[prefix] message``."""
        if self._progress is not None:
            self._progress.console.print(message, markup=False, highlight=False)
        else:
            print(f"[{self.prefix}] {message}", file=self.stream, flush=True)

    def close(self) -> None:
        """Stop the bar (it stays on screen) or print the final plain line. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        elif self._unprinted:
            self._print_plain()

    def _shown(self) -> float:
        return min(self.completed, self.total) if self.total is not None else self.completed

    def _text(self, *, aligned: bool) -> str:
        width = 6 if aligned else 0
        parts = [f"{name} {_num(value):>{width}}" for name, value in self.figures.items()]
        if self.info:
            parts.append(self.info)
        return "  ".join(parts)

    def _print_plain(self) -> None:
        count = f"{_num(self._shown())}/{_num(self.total)}  " if self.total is not None else ""
        line = f"[{self.prefix}] {self.elapsed_s:5.1f}s  {count}{self._text(aligned=True)}"
        print(line.rstrip(), file=self.stream, flush=True)
        self._unprinted = False

    def __enter__(self) -> TaskProgress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or fake streams
        return False

"""How the ``pubsub-worker`` command writes: rich on a terminal, plain stable text when piped.

:class:`Output` writes stdout and stderr through two `rich` consoles. Whether
stdout is a terminal is decided once, by ``isatty()``:

* **A terminal**: tables are rich tables (a status in its colour, numbers to
  the right), error lines start with a red ``pubsub-worker:``, a long replay
  shows a progress bar on stderr (:meth:`Output.progress`). ``NO_COLOR``
  turns the colours off.
* **Piped or redirected**: plain text in a stable form that scripts and tests
  read: a table is a header line, then one line per row, columns aligned with
  two spaces (:func:`plain_table`); no colour, no wrapping, no bar, whatever
  ``FORCE_COLOR`` says.

``--output json`` (:meth:`Output.document`) is indented, ASCII-escaped JSON
on stdout, terminal or not. Every string is written as rich ``Text``, never
parsed as markup, and stored strings reach here through
:func:`pubsub_worker._support.logs.printable`: a key cannot forge a line or
send a terminal escape.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

__all__ = [
    "LEVEL_STYLES",
    "STATUS_STYLES",
    "Bar",
    "Column",
    "Output",
    "plain_table",
]

STATUS_STYLES = {
    "running": "yellow",
    "released": "cyan",
    "completed": "green",
    "failed": "bold red",
}
"""A job status's colour on a terminal."""

LEVEL_STYLES = {"ok": "green", "problem": "bold red", "warning": "yellow", "hint": "cyan"}
"""A ``config`` finding's colour on a terminal."""

BAR_FROM = 10
"""A job count from which a long operation shows a progress bar on a terminal."""


@dataclass(frozen=True)
class Column:
    """A table column: its header, its alignment, and how a terminal colours a cell."""

    header: str
    right: bool = False
    """Aligned to the right (numbers)."""
    style: Callable[[str], str | None] | None = None
    """The cell's rich style on a terminal, from its text (None: unstyled)."""


def plain_table(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[str]:
    """The piped form of a table: the header, then the rows, aligned, trailing blanks cut."""
    lines = [tuple(column.header for column in columns), *(tuple(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    out = []
    for line in lines:
        cells = [
            cell.rjust(width) if column.right else cell.ljust(width)
            for cell, width, column in zip(line, widths, columns, strict=True)
        ]
        out.append("  ".join(cells).rstrip())
    return out


class Bar:
    """A progress bar on stderr, with notes (lines of results) printed above it."""

    def __init__(self, progress: Progress, task: Any) -> None:
        self._progress = progress
        self._task = task

    def update(self, done: int, note: str | None = None) -> None:
        """``done`` items so far; ``note``, if any, printed above the bar."""
        if note is not None:
            self._progress.console.print(Text(note))
        self._progress.update(self._task, completed=done)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich's own exits 1; the command's main() ends it with its documented 141.
        self.quiet = True
        raise BrokenPipeError


class Output:
    """stdout and stderr of one command run (built per run: tests swap ``sys.stdout``)."""

    def __init__(self) -> None:
        self.terminal = _isatty(sys.stdout)
        """stdout is a terminal: rich tables and colours; else plain text."""
        options: dict[str, Any] = {
            "markup": False,
            "highlight": False,
            "emoji": False,
            "soft_wrap": True,  # a long line stays one line; the terminal wraps it
        }
        # No file given: each write goes to sys.stdout / sys.stderr as they are then.
        self.out = _Console(force_terminal=self.terminal, **options)
        self.err = _Console(stderr=True, force_terminal=_isatty(sys.stderr), **options)

    def line(self, text: str = "", style: str | None = None) -> None:
        """One line of text on stdout (``style`` on a terminal only)."""
        self.out.print(Text(text, style=style or "") if self.terminal else Text(text))

    def document(self, document: Any) -> None:
        """``document`` as JSON on stdout (``--output json``)."""
        self.out.print(Text(json.dumps(document, indent=2, ensure_ascii=True)))

    def error(self, message: str) -> None:
        """One line on stderr: ``pubsub-worker: <message>``."""
        text = Text("pubsub-worker:", style="bold red" if self.err.is_terminal else "")
        text.append(" " + " ".join(message.splitlines()))
        self.err.print(text)

    def table(self, columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> None:
        """A table: a rich table on a terminal, :func:`plain_table` lines when piped."""
        if not self.terminal:
            for line in plain_table(columns, rows):
                self.out.print(Text(line))
            return
        table = Table(header_style="bold", box=None, pad_edge=False)
        for column in columns:
            table.add_column(column.header, justify="right" if column.right else "left")
        for row in rows:
            table.add_row(
                *(
                    Text(cell, style=(column.style(cell) if column.style else None) or "")
                    for cell, column in zip(row, columns, strict=True)
                )
            )
        self.out.print(table, soft_wrap=False)  # a table fits the terminal's width

    @contextlib.contextmanager
    def progress(self, total: int, description: str) -> Iterator[Bar | None]:
        """A :class:`Bar` while at least :data:`BAR_FROM` items run on a terminal; else None."""
        if total < BAR_FROM or not (self.terminal and self.err.is_terminal):
            yield None
            return
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.err,
            transient=True,
        ) as progress:
            yield Bar(progress, progress.add_task(description, total=total))


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no such method, or closed
        return False

"""The terminal side of "text is data": what the command line prints never acts on the terminal and never raises.

Text from outside the suite (a kernel's message, a backend's name or skip reason, a case file, a path,
an environment variable) reaches the terminal in two ways, and each is closed here:

- through rich: :func:`shown` makes such a string a ``rich.text.Text`` (never parsed as markup) with its
  control characters written as visible escapes (kernels.backends.text.printable); :func:`console`
  makes a Console that parses no markup at all and cannot raise on a character its stream's encoding
  lacks;
- through ``print`` and ``sys.stdout.write`` (the code of a kernel run in this process, a command that
  prints plain lines): :func:`guarded_streams` replaces ``sys.stdout`` and ``sys.stderr`` for the
  duration of a command by a :class:`SafeStream`, which escapes every control character but newline and
  tab (a terminal keeps rich's colours, ``ESC [ ... m``) and writes a character the encoding lacks as a
  backslash escape.
"""
from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from pfa_verify.kernels.backends.text import printable

__all__ = ["SafeStream", "guarded_streams", "console", "lines_to", "shown", "printable_data"]

#: Select Graphic Rendition (colour, bold): the one escape sequence a terminal stream lets through.
_SGR = re.compile(r"(\x1b\[[0-9;]*m)")
#: A lone surrogate: no encoding can write it.
_SURROGATE = re.compile("[\ud800-\udfff]")


class SafeStream:
    """``stream`` (a text stream), writing what it is given with its control characters escaped
    (``escape_controls``; on a terminal, colour sequences pass) and every character its encoding lacks
    as a backslash escape: a write never acts on the terminal and never raises UnicodeEncodeError.
    Everything else (``fileno``, ``isatty``, ``encoding``, ``buffer``) is the stream's."""

    def __init__(self, stream: TextIO, *, escape_controls: bool = True) -> None:
        self.stream = stream
        self.escape_controls = escape_controls

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def colours_pass(self) -> bool:
        """Whether the stream is a terminal (colour sequences pass)."""
        try:
            return bool(self.stream.isatty())
        except (OSError, ValueError, AttributeError):
            return False

    def write(self, text: str) -> int:
        safe = str(text)
        if self.escape_controls:
            if self.colours_pass():
                safe = "".join(p if k % 2 else printable(p) for k, p in enumerate(_SGR.split(safe)))
            else:
                safe = printable(safe)
        else:
            safe = _SURROGATE.sub(lambda m: printable(m.group()), safe)
        try:
            self.stream.write(safe)
        except UnicodeEncodeError:
            encoding = getattr(self.stream, "encoding", None) or "utf-8"
            self.stream.write(safe.encode(encoding, "backslashreplace").decode(encoding))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)


#: The streams :func:`guarded_streams` replaced, innermost last: :func:`console` writes to them.
_RAW: list[tuple[TextIO, TextIO]] = []


@contextlib.contextmanager
def guarded_streams() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` as :class:`SafeStream` for the duration (the command line's
    ``main``); restored after, whatever happens."""
    out, err = sys.stdout, sys.stderr
    _RAW.append((out, err))
    sys.stdout, sys.stderr = SafeStream(out), SafeStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
        _RAW.pop()


def console(*, width: int | None = None, stderr: bool = False, markup: bool = False) -> Console:
    """A rich Console for the command line: no markup parsed (``markup``: for a table whose module styled
    its cells with markup), no highlighting, no emoji codes; on a terminal its colours and progress bars,
    else plain text ``width`` (default 200) columns wide. It writes to the real stream (its escape codes
    are its own), through a :class:`SafeStream` that only keeps an unencodable character from raising:
    what it prints from outside goes through :func:`shown`."""
    raw = (_RAW[-1][1 if stderr else 0] if _RAW else (sys.stderr if stderr else sys.stdout))
    stream = SafeStream(raw, escape_controls=False)
    tty = stream.colours_pass()
    return Console(file=stream, markup=markup, highlight=False, emoji=False,  # type: ignore[arg-type]
                   width=width if width is not None or tty else 200, force_terminal=None if tty else False)


class _LinesToConsole:
    """A text stream whose lines ``console`` prints as text (:func:`shown`), above its live display."""

    def __init__(self, console: Console, stream: TextIO) -> None:
        self.console, self.stream, self.pending = console, stream, ""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def write(self, text: str) -> int:
        lines = (self.pending + str(text)).split("\n")
        self.pending = lines.pop()
        for line in lines:
            self.console.print(shown(line))
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.console.print(shown(self.pending))
            self.pending = ""


@contextlib.contextmanager
def lines_to(console: Console) -> Iterator[None]:
    """While a progress bar is live on ``console``: what is printed to ``sys.stdout`` and ``sys.stderr``
    goes above it, line by line, as text (rich's own redirection would read escape sequences in it)."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _LinesToConsole(console, out), _LinesToConsole(console, err)
    try:
        yield
    finally:
        for proxy in (sys.stdout, sys.stderr):
            if isinstance(proxy, _LinesToConsole):
                proxy.flush()
        sys.stdout, sys.stderr = out, err


def shown(value: object, style: str = "") -> Text:
    """``value`` as rich text to print: never parsed as markup, its control characters escaped."""
    return Text(printable(value), style=style)


def printable_data(value: Any) -> Any:
    """``value`` (JSON data: dicts, lists, strings, numbers) with every string, keys included, made
    :func:`printable`: what a report holds can be printed, and encoded, as it is."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_data(k): printable_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [printable_data(v) for v in value]
    return value

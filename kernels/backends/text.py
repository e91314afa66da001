"""Text from outside the suite, made safe to show: :func:`printable`.

A kernel's exception message, what its worker printed, a backend's name or skip reason, a case file's
message, a path or an environment variable is data. Shown on a terminal, a control character in it
acts: an escape sequence retitles the window or moves the cursor (an injected ``\\r\\x1b[2K-> OK``
overwrites the real verdict), a bidirectional override reorders what is read, a lone surrogate cannot
be encoded at all. :func:`printable` writes each such character as a visible escape (``\\x1b``,
``\\u202e``, ``\\udcff``), so the text reads as it is and nothing in it acts. Markup is the other half:
whatever renders the text (rich, jinja) must be told it is text (``markup=False``, ``rich.text.Text``,
autoescape), never parse it.

The suite applies it where such text enters a record of its own (kernels/backends/supervisor.py and worker_process.py: what
a worker sends) and where the command line prints text it did not write (paths, names, case files).
"""
from __future__ import annotations

import re

__all__ = ["printable"]

# C0 controls but tab and newline, DEL, C1 controls, the bidirectional embeddings, overrides and isolates,
# and every surrogate (a lone one is not text: it cannot be encoded as UTF-8).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_UNSAFE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, *, one_line: bool = False) -> str:
    """``str(text)`` with every character that would act on a terminal written as a visible escape: C0
    and C1 controls (tab and newline kept, unless ``one_line``), DEL, bidirectional controls and lone
    surrogates. Idempotent in effect: the escapes themselves are plain characters.

    ``printable("\\x1b]0;pwned\\x07ok")`` is ``"\\\\x1b]0;pwned\\\\x07ok"``.
    """
    if not isinstance(text, str):
        try:
            text = str(text)
        except Exception as exc:  # noqa: BLE001 - an object's own __str__ is code we do not trust
            text = f"<text that could not be made: {type(exc).__name__}>"
    return (_UNSAFE_LINE if one_line else _UNSAFE).sub(_escape, text)

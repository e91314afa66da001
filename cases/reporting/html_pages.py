"""The HTML pages of the reports, from Jinja2 templates in cases/templates/ (autoescaped).

Three pages share one look: the run report (cases/reporting/html_report.py), the kill matrix (cases/measuring/mutants.py)
and the comparison of two runs (cases/reporting/report_compare.py). Each module computes what its page shows
(rows, the geometry of its pictures) and :func:`render` fills the template; no page is assembled from
strings. Every value is made printable (kernels.backends.text: control characters, bidirectional
controls and lone surrogates as visible escapes) and then escaped by the template engine
(``autoescape``), so a case name, a message or a file path cannot break the page, reorder what it
shows, or fail to encode; a name the template uses that the caller did not give is an error
(``StrictUndefined``), not an empty cell.

The pages are self-contained: inline CSS (``CSS``, the templates' ``base.html.j2``) and SVG, no
scripts, no URLs.
"""
from __future__ import annotations

import functools
import math

import jinja2
from markupsafe import Markup

from pfa_verify.cases.data import FOLDER
from pfa_verify.kernels.backends.text import printable

__all__ = ["TEMPLATES", "render", "ratio_colour", "slug"]

TEMPLATES = FOLDER / "templates"


@functools.cache
def _environment():
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True, finalize=_printable)
    env.filters["slug"] = slug
    env.globals["ratio_colour"] = ratio_colour
    return env


def _printable(value):
    """Every value a template prints, before it is escaped: text made printable (markup the page built
    itself, a Markup, is left as it is)."""
    return value if isinstance(value, Markup | int | float | jinja2.Undefined) else printable(value)


def slug(text) -> str:
    """``text`` as an HTML anchor: lower case, every character but letters and digits a dash."""
    return "".join(ch if ch.isalnum() else "-" for ch in str(text).lower())


def render(template: str, **context) -> str:
    """The page ``template`` (a file of cases/templates/) filled with ``context``."""
    return _environment().get_template(template).render(**context)


def ratio_colour(ratio: float | None) -> str:
    """Fill for an error/allowed ratio: greys up to 1 (within tolerance), orange to red above; black
    for a non-finite value (None)."""
    if ratio is None or not math.isfinite(ratio):
        return "#000000"
    if ratio <= 1.0:
        t = min(1.0, max(0.0, (math.log10(max(ratio, 1e-4)) + 4) / 4))   # 1e-4 .. 1 -> 0 .. 1
        g = int(245 - 90 * t)
        return f"#{g:02x}{g:02x}{min(255, g + 6):02x}"
    t = min(1.0, math.log10(ratio) / 3)                                  # 1 .. 1e3 -> 0 .. 1
    r, gr, b = 255, int(196 - 176 * t), int(80 - 60 * t)
    return f"#{r:02x}{max(gr, 0):02x}{max(b, 0):02x}"

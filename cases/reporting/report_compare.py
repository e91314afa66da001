"""``pfa-verify compare A.json B.json [--html PATH]``: two run reports of the same selection, side by side.

The use: two kernels on the same cases (PyPTO-Gym's file beside ours), or two versions of one kernel.
Both reports must have checked the same selection, i.e. carry the same ``selection.fingerprint``
(cases/data/collect.py: every selected case's name, source, law, config and seed): otherwise their cases
are not the same inputs and a side-by-side table would compare unlike things, so :func:`compare`
refuses with one line (:class:`SelectionMismatch`, exit 2) saying which part of the selection differs.

Per case and report it shows the case's verdict as the run decided it (``error`` when a comparison
ended in an error, ``skipped`` when none ran, ``fail`` when a comparison that counts failed, else
``pass``: a failure that does not count, such as the sim's spec-codec difference, leaves a pass) and
the worst error in units of the SPEC §4 tolerance, ``max |actual - golden| / (atol + rtol |golden|)``
(1 = at the tolerance): the largest over the comparisons that count, with the ones that do not count
shown beside it in brackets. Cases whose verdicts differ are listed first. Exit status: 0 when every
case has the same verdict in both, 1 when some differ, 2 when the reports cannot be compared.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from rich.table import Table
from rich.text import Text

from pfa_verify.cases.data.schemas import and_more
from pfa_verify.cases.reporting import html_pages
from pfa_verify.cases.reporting.html_report import CSS
from pfa_verify.cases.reporting.report import SCHEMA_ID, check_schema, write_text_atomically
from pfa_verify.cases.reporting.terminal import printable_data, shown
from pfa_verify.golden.errors import UsageError

__all__ = ["SelectionMismatch", "ReportedCase", "DiffRow", "ReportDiff", "PREVIOUS_SCHEMA_ID", "upgraded", "load_report", "case_verdict", "compare",
           "format_ratio", "summary_line", "render_table", "print_comparison", "scatter", "render_html", "write_html"]


class SelectionMismatch(UsageError):
    """The two reports did not check the same cases (one line: which part of the selection differs)."""


@dataclasses.dataclass(frozen=True)
class ReportedCase:
    """One case in one report: the case's verdict, what it says (attribution, skip kind, error), and the
    worst error over the tolerance per reference codec, with whether that comparison counts."""
    verdict: str                 # pass | fail | error | skipped
    detail: str
    ratios: tuple                # ((reference, worst ratio or None, counts), ...)

    @property
    def worst(self) -> float | None:
        """The largest worst ratio of the comparisons that count (inf: a counted failure with no finite
        ratio, e.g. a misplaced NaN); None when no counted comparison ran."""
        values = [(math.inf if r is None and self.verdict == "fail" else r) for _, r, counts in self.ratios if counts]
        values = [v for v in values if v is not None]
        return max(values) if values else None


@dataclasses.dataclass(frozen=True)
class DiffRow:
    name: str
    source: str
    a: ReportedCase
    b: ReportedCase

    @property
    def differs(self) -> bool:
        return self.a.verdict != self.b.verdict


@dataclasses.dataclass(frozen=True)
class ReportDiff:
    paths: tuple                 # (A path, B path) as given
    reports: tuple               # (A data, B data)
    rows: tuple                  # DiffRow per case, in run order

    @property
    def differing(self) -> list:
        return [r for r in self.rows if r.differs]

    @property
    def exit_status(self) -> int:
        return 1 if self.differing else 0


#: The version before this one, which compare still reads (:func:`upgraded`): a run of the suite before
#: its kernels ran under a supervisor, so that two kernels (or two suite versions) can be compared across it.
PREVIOUS_SCHEMA_ID = "pfa-verify-run-report/4"


def upgraded(data: dict) -> dict:
    """A report of :data:`PREVIOUS_SCHEMA_ID` in this version's form, saying only what it said: it was not
    interrupted and wrote its evidence (its run fails otherwise, and it knew neither), and its kernel ran
    in the process that judged it (``in-process``: before the supervisor, every executor did)."""
    out = json.loads(json.dumps(data))
    out["schema"] = "pfa-verify-run-report/5"
    summary = out.get("summary")
    if isinstance(summary, dict):
        summary.setdefault("interrupted", None)
        summary.setdefault("not_run", [])
        summary.setdefault("write_failures", [])
    execution = out.get("execution")
    if isinstance(execution, dict) and execution.get("executor") in ("here", "local"):
        execution["executor"] = "in-process"
    return out


def load_report(path) -> dict:
    """The JSON run report at ``path``, checked against cases/report.schema.json; a UsageError naming
    the file when it is missing, not JSON, from another schema version, or invalid. Its strings are
    made printable (kernels.backends.text): a report is a file from outside, shown as text."""
    p = Path(path)
    try:
        data = printable_data(json.loads(p.read_text(encoding="utf-8", errors="surrogateescape")))
    except OSError as exc:
        raise UsageError(f"report {str(path)!r}: cannot read it ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"report {str(path)!r} is not JSON ({exc})") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema == PREVIOUS_SCHEMA_ID:
        data = upgraded(data)
        schema = SCHEMA_ID
    if schema != SCHEMA_ID:
        raise UsageError(f"report {str(path)!r} has schema {schema!r}; compare reads {SCHEMA_ID!r} (written by "
                         "`pfa-verify run --json` of this version; earlier reports carry no selection fingerprint)")
    errors = check_schema(data)
    if errors:
        raise UsageError(f"report {str(path)!r} does not match {SCHEMA_ID}: {errors[0]}" + and_more(errors))
    return data


def case_verdict(results: list) -> ReportedCase:
    """The verdict of one case from its result objects (one per comparison), as the run's rule decides it."""
    verdicts = {r["verdict"] for r in results}
    counted_fail = [r for r in results if r["verdict"] == "fail" and r.get("counts", True)]
    if "error" in verdicts:
        verdict = "error"
        detail = next(r for r in results if r["verdict"] == "error")["message"].splitlines()[0][:160]
    elif verdicts == {"skipped"}:
        verdict, detail = "skipped", results[0].get("skip_kind") or "skipped"
    elif counted_fail:
        verdict = "fail"
        detail = counted_fail[0].get("attribution") or counted_fail[0]["message"].splitlines()[0][:160]
    else:
        verdict, detail = "pass", ""
    ratios = tuple((r["reference"], r.get("worst_ratio"), bool(r.get("counts", True)))
                   for r in results if r["verdict"] in ("pass", "fail"))
    return ReportedCase(verdict, detail, ratios)


def _by_case(data: dict) -> dict:
    cases: dict = {}
    for r in data["results"]:
        cases.setdefault(r["name"], []).append(r)
    return cases


def _short(fp: str) -> str:
    return fp.removeprefix("sha256:")[:12]


def _mismatch(paths, a: dict, b: dict) -> str:
    sa, sb = a["selection"], b["selection"]
    parts = [f"{src} ({sa['by_source'][src]['cases']} vs {sb['by_source'][src]['cases']} cases)"
             for src in sa["by_source"] if sa["by_source"][src]["fingerprint"] != sb["by_source"][src]["fingerprint"]]
    options = [f"{k} {sa['options'][k]!r} vs {sb['options'][k]!r}" for k in sa["options"]
               if sa["options"][k] != sb["options"][k]]
    return (f"{paths[0]} and {paths[1]} did not check the same cases (selection fingerprint "
            f"{_short(sa['fingerprint'])} vs {_short(sb['fingerprint'])}; differing: {', '.join(parts) or 'order'}"
            + (f"; options: {', '.join(options)}" if options else "")
            + "): compare runs of the same --cases, --examples and --seed, on backends with the same supported "
              "shapes, started with the same captured regressions (--no-capture keeps the folder as it was)")


def compare(a: dict, b: dict, *, paths=("A", "B")) -> ReportDiff:
    """Pair the cases of reports ``a`` and ``b`` (dicts from :func:`load_report`); SelectionMismatch
    when their selection fingerprints differ."""
    if a["selection"]["fingerprint"] != b["selection"]["fingerprint"]:
        raise SelectionMismatch(_mismatch(paths, a, b))
    ca, cb = _by_case(a), _by_case(b)
    if list(ca) != list(cb):   # the same fingerprint and other names: a report edited by hand
        raise UsageError(f"{paths[0]} and {paths[1]} carry the same selection fingerprint but list different cases")
    rows = tuple(DiffRow(name, ca[name][0]["source"], case_verdict(ca[name]), case_verdict(cb[name])) for name in ca)
    return ReportDiff(tuple(str(p) for p in paths), (a, b), rows)


def format_ratio(x: float | None) -> str:
    """A worst error over the tolerance for people: 3 significant digits, ``inf``, or ``-`` (not compared)."""
    if x is None:
        return "-"
    return "inf" if math.isinf(x) else f"{x:.3g}"


def _ratio_text(v: ReportedCase) -> str:
    other = [f"{ref} {format_ratio(r)}" for ref, r, counts in v.ratios if not counts]
    return format_ratio(v.worst) + (f" [{', '.join(other)}, not counted]" if other else "")


def _who(data: dict) -> str:
    be = data["backend"]
    kernel = be.get("kernel")
    return be["name"] + (f" (sha256 {kernel['sha256'][:12]})" if kernel else "")


def summary_line(c: ReportDiff) -> str:
    """One line: how many cases, how many verdicts differ and how, the shared fingerprint."""
    n = len(c.rows)
    ways: dict = {}
    for r in c.differing:
        ways.setdefault(f"{r.a.verdict} in A, {r.b.verdict} in B", []).append(r.name)
    how = "; ".join(f"{k}: {len(v)} ({', '.join(v[:4])}{', ...' if len(v) > 4 else ''})" for k, v in ways.items())
    return (f"{n} cases, the same selection (fingerprint {_short(c.reports[0]['selection']['fingerprint'])}): "
            f"{n - len(c.differing)} with the same verdict, {len(c.differing)} differ" + (f": {how}" if how else "")
            + f" -> {'DIFFERENT' if c.differing else 'SAME VERDICTS'}")


def _ordered(c: ReportDiff) -> list:
    return c.differing + [r for r in c.rows if not r.differs]


def render_table(c: ReportDiff):
    """A rich Table: one row per case, verdicts that differ first."""
    table = Table(title=shown(f"pfa-verify compare: A = {_who(c.reports[0])}, B = {_who(c.reports[1])}"),
                  title_justify="left", header_style="bold")
    for col, kw in (("case", {"no_wrap": True}), ("source", {}), ("A verdict", {}), ("A worst/tol", {"justify": "right"}),
                    ("B verdict", {}), ("B worst/tol", {"justify": "right"}), ("", {})):
        table.add_column(col, **kw)
    style = {"pass": "green", "fail": "bold red", "error": "bold magenta", "skipped": "dim"}
    for r in _ordered(c):
        cells = []
        for v in (r.a, r.b):
            text = v.verdict + (f": {v.detail}" if v.detail and v.verdict != "pass" else "")
            cells += [shown(text, style[v.verdict]), shown(_ratio_text(v))]
        table.add_row(shown(r.name), shown(r.source), *cells, Text("differs", "bold") if r.differs else "")
    return table


def print_comparison(c: ReportDiff, console) -> None:
    console.print(render_table(c))
    for label, path, data in zip("AB", c.paths, c.reports, strict=True):
        console.print(shown(f"{label}: {path}: {data['summary']['verdict']}"))
    console.print(shown(summary_line(c)))


# --- HTML ------------------------------------------------------------------------------------------

_EXTRA_CSS = """
table.results tr.differs td{background:#fff4e5}table.results td.ratio{text-align:right;font-variant-numeric:tabular-nums}
td.v.pass{color:#1a7f37}td.v.fail{color:#c62828;font-weight:600}td.v.error{color:#8e24aa;font-weight:600}
td.v.skipped{color:#888}span.sw{display:inline-block;width:10px;height:10px;margin-right:4px;border:1px solid #ccc;vertical-align:middle}
table.sides{border-collapse:collapse;font-size:13px;margin:8px 0}table.sides th,table.sides td{padding:3px 10px;
border-bottom:1px solid #e3e3e8;text-align:left;vertical-align:top;white-space:normal;word-break:break-all}
"""


def _side_rows(c: ReportDiff) -> list:
    """(fact, A's, B's) for the header table: where each report came from and what it checked."""
    def facts(d: dict) -> dict:
        be, kernel, proj = d["backend"], d["backend"].get("kernel"), d["project"]
        return {"report": None, "backend": be["name"], "codec": be["codec"],
                "model": (be.get("model") or {}).get("describe", "none declared (SPEC \u00a74.1 as written)"),
                "kernel": f"{kernel['source']}:{kernel['function']}" if kernel else "-",
                "kernel sha256": kernel["sha256"] if kernel else "-",
                "pfa-verify": f"{proj['version']} ({(proj['commit'] or 'unknown commit')[:12]}"
                              f"{', modified' if proj['dirty'] else ''})",
                "created": d["created"], "run verdict": d["summary"]["verdict"]}
    fa, fb = facts(c.reports[0]), facts(c.reports[1])
    fa["report"], fb["report"] = c.paths
    return [(k, fa[k], fb[k]) for k in fa]


def scatter(c: ReportDiff) -> dict:
    """The scatter's geometry: worst error over tolerance, A (x) against B (y), log scales from 1e-4 to
    1e4; the tolerance (1) marked on both axes; a case whose verdicts differ in red."""
    size, pad, lo, hi = 320, 44, -4.0, 4.0

    def pos(x: float) -> float:
        t = (min(max(math.log10(max(x, 1e-300)), lo), hi) - lo) / (hi - lo)
        return pad + t * size
    one = pos(1.0)
    ticks = [(pos(10.0 ** k), 16 + size - (pos(10.0 ** k) - pad) + 4, f"1e{k}") for k in range(int(lo), int(hi) + 1, 2)]
    points = [{"x": pos(r.a.worst), "y": 16 + size - (pos(r.b.worst) - pad), "fill": "#c62828" if r.differs else "#607d8b",
               "title": f"{r.name}: A {format_ratio(r.a.worst)}, B {format_ratio(r.b.worst)}"}
              for r in c.rows if r.a.worst is not None and r.b.worst is not None]
    return {"size": size, "pad": pad, "one": one, "one_y": 16 + size - (one - pad), "ticks": ticks, "points": points}


def render_html(c: ReportDiff) -> str:
    """The comparison as one self-contained HTML string (cases/templates/compare.html.j2; inline CSS and
    SVG, no scripts)."""
    return html_pages.render("compare.html.j2", css=CSS + _EXTRA_CSS, differ=bool(c.differing),
                             summary=summary_line(c), sides=_side_rows(c), plot=scatter(c), rows=_ordered(c),
                             ratio_text=_ratio_text)


def write_html(c: ReportDiff, path) -> Path:
    """Write the page through a temporary file renamed into place (cases.reporting.report.write_text_atomically)."""
    return write_text_atomically(Path(path), render_html(c))

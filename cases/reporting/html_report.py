"""``pfa-verify run --html PATH``: one self-contained HTML file (inline CSS and SVG, no scripts, no URLs).

Contents: the run's header (backend, how it was chosen, what was checked named by content: the
selection's fingerprint, the kernel file's sha256, the model, the project's commit; versions, summary), one table of every case
and comparison, then for each failing comparison its error picture:

- a heat map of the worst error per output row (batch b, query position i) x query head, as
  ``max over d of |actual - golden| / (atol + rtol * |golden|)`` (1 = the SPEC §4 tolerance;
  black = a non-finite value where the golden is finite);
- the distribution of that ratio over every element (bars per decade, the tolerance marked);
- the attribution of the difference: kernel logic or backend codec, the envelope's part (SPEC §4.2), with the
  message of :mod:`properties.rule.compare` and the replay command.

The page is cases/templates/run_report.html.j2 (cases/reporting/html_pages.py); its table is the terminal's
(:func:`cases.reporting.report.table_rows`); this module computes the pictures' geometry.
"""
from __future__ import annotations

import math
from pathlib import Path

from pfa_verify.cases.data.versions import versions
from pfa_verify.cases.reporting import html_pages
from pfa_verify.cases.reporting.groups import compact_names
from pfa_verify.cases.reporting.html_pages import ratio_colour, slug
from pfa_verify.cases.reporting.report import (
    RunSummary,
    cells,
    coverage_line,
    failure_text,
    provenance_lines,
    skipped_groups,
    summarize,
    table_rows,
    write_text_atomically,
)
from pfa_verify.properties.rule.attribution import RATIO_BINS

__all__ = ["render_html", "write_html", "ratio_colour", "CSS", "heatmap", "histogram"]

_ATTRIBUTION_TEXT = {
    "kernel logic": "Fails under the spec codec and under the backend's own codec (or the backend uses the spec "
                    "codec): indexing, scales, softmax, tail handling or another part of the kernel's logic.",
    "backend codec": "Fails under the spec codec but passes under the codec the backend declares: the platform's "
                     "FP8 conversions (pypto's CPU calculator), not the kernel. Shown, not counted.",
    "error": "The kernel raised: nothing was compared. The probes run it on neighbours of the case to show what "
             "the error needs.",
}

CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d1d1f;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px}h3{font-size:16px;margin:0 0 6px}
.meta{color:#555;margin:2px 0}.ok{color:#1a7f37;font-weight:600}.bad{color:#c62828;font-weight:600}
table.results{border-collapse:collapse;width:100%;font-size:13px}
table.results th{background:#f2f2f5;text-align:left;position:sticky;top:0}
table.results th,table.results td{border-bottom:1px solid #e3e3e8;padding:4px 8px;white-space:nowrap}
table.results td.num{text-align:right;font-variant-numeric:tabular-nums}
td.v a{color:inherit}tr.pass td.v{color:#1a7f37}tr.fail td.v{color:#c62828;font-weight:600}tr.error td.v{color:#8e24aa;font-weight:600}
tr.skipped td{color:#888}tr.uncounted td.v{color:#b26a00;font-weight:600}
span.why{display:block;white-space:normal;color:#888;font-size:11px;font-weight:normal;max-width:240px}
ul.skips{font-size:13px;color:#555}
table.results td.be{white-space:normal;word-break:break-all;max-width:240px}
section.failure{border:1px solid #e3e3e8;border-left:4px solid #c62828;border-radius:6px;padding:12px 16px;margin:16px 0}
section.failure.uncounted{border-left-color:#e0a100}
.badge{display:inline-block;border-radius:10px;padding:1px 10px;font-size:12px;font-weight:600;color:#fff}
.badge.kernel-logic{background:#c62828}.badge.backend-codec{background:#e0a100}.badge.error{background:#6a1b9a}
.pictures{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start;margin:8px 0}
.pictures figure{margin:0}.pictures figcaption{font-size:12px;color:#555;max-width:520px}
pre{background:#f7f7f9;border-radius:4px;padding:8px;font-size:12px;white-space:pre-wrap;margin:6px 0}
svg text{font:11px system-ui,sans-serif;fill:#333}
table.coverage{border-collapse:collapse;font-size:12px;columns:2}table.coverage td,table.coverage th{padding:1px 10px;text-align:left}
table.coverage td.num{text-align:right}table.coverage tr.hole td{color:#c62828;font-weight:600}table.coverage tr.unchecked td{color:#ef6c00}
"""

_LEGEND = (("1e3", 1e3), ("10", 10.0), ("1 (tol)", 1.0), ("1e-2", 1e-2), ("1e-4", 1e-4), ("NaN/inf", None))


def heatmap(error_map: list, s1: int) -> dict:
    """The heat map's geometry: one cell per output row (b, i) (the first 256) and query head, filled by
    the worst error over allowed in it (:func:`ratio_colour`), with head and row labels and a legend."""
    rows = len(error_map)
    heads = len(error_map[0]) if rows else 0
    shown = min(rows, 256)
    cw = max(8, min(40, 560 // max(heads, 1)))
    ch = max(6, min(26, 420 // max(shown, 1)))
    left, top = 78, 30
    width, height = left + heads * cw + 90, max(top + shown * ch, top + 6 * 18) + 28
    rstep = max(1, shown // 24)
    lines = [{"label": (top + r * ch + ch * 0.75, f"b{r // s1} i{r % s1}") if r % rstep == 0 else None,
              "cells": [{"x": left + h * cw, "y": top + r * ch, "fill": ratio_colour(v),
                         "title": f"b={r // s1} i={r % s1} head={h}: "
                                  + ("non-finite" if v is None else f"{v:.3g}x allowed")}
                        for h, v in enumerate(error_map[r])]}
             for r in range(shown)]
    return {"width": width, "height": height, "left": left, "top": top, "cw": cw, "ch": ch, "rows": rows,
            "shown": shown, "lines": lines, "legend_x": left + heads * cw + 16,
            "head_labels": [(left + h * cw + cw / 2, h) for h in range(0, heads, max(1, heads // 12))],
            "legend": [(top + k * 18, ratio_colour(v), label) for k, (label, v) in enumerate(_LEGEND)]}


def _edge(x: float) -> str:
    return "\u221e" if math.isinf(x) else (f"{x:g}" if x >= 0.1 or x == 0 else f"1e{round(math.log10(x))}")


def histogram(counts: list) -> dict:
    """The histogram's geometry: one bar per RATIO_BINS interval, then the non-finite bin, heights on a
    log scale; bars at or over the tolerance (1) in red, the non-finite one black."""
    n = len(counts)
    bw, gap, left, top, ph = 46, 8, 40, 26, 170
    peak = max(math.log10(c + 1) for c in counts) or 1.0
    tol_bin = RATIO_BINS.index(1.0)          # bars from here on are over the tolerance
    bars = []
    for k, c in enumerate(counts):
        h = ph * math.log10(c + 1) / peak
        last = k == n - 1
        bars.append({"x": left + k * (bw + gap), "y": top + ph - h, "h": h, "count": c,
                     "fill": "#9e9e9e" if k < tol_bin else ("#000000" if last else "#e53935"),
                     "label": "NaN/inf" if last else f"{_edge(RATIO_BINS[k])} to {_edge(RATIO_BINS[k + 1])}"})
    return {"width": left + n * (bw + gap) + 10, "height": top + ph + 48, "left": left, "top": top, "bw": bw,
            "axis_y": top + ph, "bars": bars, "tol_x": left + tol_bin * (bw + gap) - gap / 2,
            "ticks": [(left + k * (bw + gap) - gap / 2, _edge(edge)) for k, edge in enumerate(RATIO_BINS[:-1])]}


def _anchor(name: str, reference: str) -> str:
    return f"f-{slug(name)}-{slug(reference)}"


def _row(row) -> dict:
    """A table row as the page shows it: the cells of cases.reporting.report.cells, a skip's reason cut
    at 60 characters (the whole reason is in the Skipped list and the cell's title)."""
    c = cells(row)
    note = c["note"]
    shown = note[:58].rstrip() + "\u2026" if row.verdict == "skipped" and len(note) > 60 else note
    first = row.first
    return {"klass": row.verdict + (" uncounted" if row.style == "uncounted" else ""),
            "name": row.case.name if first else "", "source": row.case.source if first else "",
            "backend": row.case.backend if first else "", "reference": row.reference, "max_abs": c["max_abs"],
            "max_rel": c["max_rel"], "mismatched": c["mismatched"], "worst": c["worst"],
            "seconds": c["seconds"] if first else "", "node": c["node"] if first else "",
            "verdict": row.shown_verdict,
            "link": _link(row) if row.verdict == "fail" or _error_card(row) else None,
            "note": note, "shown_note": shown}


def _link(row) -> str:
    """Where a failing row's card is: its own, or its group's (the card of the case shown for the group)."""
    group = row.case.group
    return _anchor(row.case.name, row.reference) if group is None or group.shown == row.case.name \
        else f"group-{group.number}"


def _carded(row) -> bool:
    """A failing row gets a card unless its case is in a group shown by another case (one card a group)."""
    group = row.case.group
    return (row.verdict == "fail" or _error_card(row)) and (group is None or group.shown == row.case.name)


def _error_card(row) -> bool:
    """A counted error gets a card of its own (what was raised, and what the error needs)."""
    return row.verdict == "error" and row.counts


def _failure(row) -> dict:
    case, ref = row.case, row.codec
    att = row.attribution or ("error" if row.verdict == "error" else "kernel logic")
    pictures = ref is not None and bool(ref.error_map)
    figures = ref.envelope_figures if ref is not None else None
    group = case.group
    others = [] if group is None else [n for n in group.members if n != case.name]
    return {"name": case.name, "source": case.source, "reference": row.reference,
            "group": None if group is None else {"number": group.number, "anchor": f"group-{group.number}",
                                                 "alike": group.alike, "others": len(others),
                                                 "names": compact_names(others) if others else ""},
            "anchor": _anchor(case.name, row.reference), "counts": row.counts, "attribution": att,
            "attribution_text": _ATTRIBUTION_TEXT.get(att, ""),
            "replay": case.capture.replay if row.counts and case.capture is not None else None,
            "detail": row.attribution_detail, "envelope_note": figures.note if figures else None,
            "heatmap": heatmap(ref.error_map, (case.config or {}).get("s1") or 1) if pictures else None,
            "histogram": histogram(ref.ratio_histogram) if pictures else None, "message": failure_text(row),
            "diagnosis": _diagnosis(case.diagnosis.to_dict() if row.counts and case.diagnosis is not None
                                    and (ref is not None or row.verdict == "error") else None)}


def _diagnosis(record: dict | None) -> dict | None:
    """The failure card's "What:" line and its probes: the identified candidate of properties.diagnosis.diagnosis, else
    the closest (``best`` None: none comes close), or None when not diagnosed."""
    if record and record.get("error"):
        return {"error": record["error"], "probes": record.get("probes", []), "probe_note": record.get("probe_note", ""),
                "located": record.get("located")}
    if not record or not record.get("candidates"):
        return None
    candidates = record["candidates"]
    best = next((c for c in candidates if c["model"] == record.get("closest")), None)
    return {"error": None, "explained": record["explained"], "best": best, "evaluated": record["evaluated"],
            "available": record["available"], "probes": record.get("probes", []),
            "probe_note": record.get("probe_note", ""), "refuted": [c["model"] for c in candidates if c.get("refuted")],
            "located": None if record.get("explained") else record.get("located")}


def render_html(run, summary: RunSummary | None = None) -> str:
    """The report as one HTML string."""
    s = summary or summarize(run)
    rows = table_rows(run)
    failures = [_failure(r) for r in rows if _carded(r)]
    seen: set[int] = set()
    for f in failures:          # the group's anchor on its first card
        if f["group"] is not None:
            f["group"]["first"] = f["group"]["number"] not in seen
            seen.add(f["group"]["number"])
    return html_pages.render(
        "run_report.html.j2", css=CSS, failed=bool(s.exit_status), interrupted=run.interrupted, not_run=run.not_run,
        verdict=s.line, backend=run.backend, codec=run.codec, backend_note=run.backend_note, seed=run.seed,
        provenance=provenance_lines(run), versions=versions(), rows=[_row(r) for r in rows],
        nodes=(run.execution or {}).get("executor") == "ray", skipped=skipped_groups(run),
        allowed=set(run.allowed_skips), failures=failures, coverage=run.coverage, coverage_line=coverage_line(run),
        shared=[found["text"] for found in run.shared])


def write_html(run, path, summary: RunSummary | None = None) -> Path:
    """Write the page through a temporary file renamed into place (cases.reporting.report.write_text_atomically)."""
    return write_text_atomically(Path(path), render_html(run, summary))

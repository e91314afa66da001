"""``pfa-verify run --html PATH``: one self-contained HTML file (inline CSS and SVG, no scripts, no URLs).

Contents: the run's header (backend, how it was chosen, what was checked named by content: the
selection's fingerprint, the kernel file's sha256, the model, the project's commit; versions, summary), one table of every case
and comparison, then for each failing comparison its error picture:

- a heat map of the worst error per output row (batch b, query position i) x query head, as
  ``max over d of |actual - golden| / (atol + rtol * |golden|)`` (1 = the SPEC §4 tolerance;
  black = a non-finite value where the golden is finite);
- the distribution of that ratio over every element (bars per decade, the tolerance marked);
- the attribution of the difference: kernel logic or backend codec, the envelope's part (SPEC §4.2), with the
  message of :mod:`properties.compare` and the replay command.
"""
from __future__ import annotations

import html
import math
from pathlib import Path

from cases.report import provenance_lines, summarize
from cases.run import RATIO_BINS
from cases.versions import versions

__all__ = ["render_html", "write_html", "ratio_colour", "CSS"]

_ATTRIBUTION_TEXT = {
    "kernel logic": "Fails under the spec codec and under the backend's own codec (or the backend uses the spec "
                    "codec): indexing, scales, softmax, tail handling or another part of the kernel's logic.",
    "backend codec": "Fails under the spec codec but passes under the codec the backend declares: the platform's "
                     "FP8 conversions (pypto's CPU calculator), not the kernel. Shown, not counted.",
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
.badge.kernel-logic{background:#c62828}.badge.backend-codec{background:#e0a100}.badge.e4m3-boundary-flip{background:#1565c0}
.pictures{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start;margin:8px 0}
.pictures figure{margin:0}.pictures figcaption{font-size:12px;color:#555;max-width:520px}
pre{background:#f7f7f9;border-radius:4px;padding:8px;font-size:12px;white-space:pre-wrap;margin:6px 0}
svg text{font:11px system-ui,sans-serif;fill:#333}
"""


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _fmt(x, spec=".1e") -> str:
    return "-" if x is None else format(x, spec)


def ratio_colour(ratio: float | None) -> str:
    """Fill for an error/allowed ratio: greys up to 1 (within tolerance), orange to red above."""
    if ratio is None or not math.isfinite(ratio):
        return "#000000"
    if ratio <= 1.0:
        t = min(1.0, max(0.0, (math.log10(max(ratio, 1e-4)) + 4) / 4))   # 1e-4 .. 1 -> 0 .. 1
        g = int(245 - 90 * t)
        return f"#{g:02x}{g:02x}{min(255, g + 6):02x}"
    t = min(1.0, math.log10(ratio) / 3)                                  # 1 .. 1e3 -> 0 .. 1
    r, gr, b = 255, int(196 - 176 * t), int(80 - 60 * t)
    return f"#{r:02x}{max(gr, 0):02x}{max(b, 0):02x}"


def _heatmap(error_map: list, s1: int) -> str:
    rows = len(error_map)
    heads = len(error_map[0]) if rows else 0
    shown = min(rows, 256)
    cw = max(8, min(40, 560 // max(heads, 1)))
    ch = max(6, min(26, 420 // max(shown, 1)))
    left, top = 78, 30
    width, height = left + heads * cw + 90, max(top + shown * ch, top + 6 * 18) + 28
    parts = [f'<svg class="heatmap" width="{width}" height="{height}" role="img" '
             f'aria-label="worst error over allowed per output row and query head">']
    parts.append(f'<text x="{left}" y="12">query head &#8594;</text>')
    step = max(1, heads // 12)
    for h in range(0, heads, step):
        parts.append(f'<text x="{left + h * cw + cw / 2:.1f}" y="{top - 4}" text-anchor="middle">{h}</text>')
    rstep = max(1, shown // 24)
    for r in range(shown):
        if r % rstep == 0:
            parts.append(f'<text x="{left - 4}" y="{top + r * ch + ch * 0.75:.1f}" text-anchor="end">'
                         f'b{r // s1} i{r % s1}</text>')
        for h, v in enumerate(error_map[r]):
            title = "non-finite" if v is None else f"{v:.3g}x allowed"
            parts.append(f'<rect x="{left + h * cw}" y="{top + r * ch}" width="{cw - 1}" height="{ch - 1}" '
                         f'fill="{ratio_colour(v)}"><title>b={r // s1} i={r % s1} head={h}: {title}</title></rect>')
    # legend
    lx = left + heads * cw + 16
    for k, (label, v) in enumerate((("1e3", 1e3), ("10", 10.0), ("1 (tol)", 1.0), ("1e-2", 1e-2),
                                     ("1e-4", 1e-4), ("NaN/inf", None))):
        y = top + k * 18
        parts.append(f'<rect x="{lx}" y="{y}" width="14" height="14" fill="{ratio_colour(v)}" stroke="#ccc"/>'
                     f'<text x="{lx + 18}" y="{y + 11}">{label}</text>')
    if shown < rows:
        parts.append(f'<text x="{left}" y="{height - 8}">first {shown} of {rows} rows</text>')
    parts.append("</svg>")
    return "".join(parts)


def _edge(x: float) -> str:
    return "\u221e" if math.isinf(x) else (f"{x:g}" if x >= 0.1 or x == 0 else f"1e{round(math.log10(x))}")


def _histogram(counts: list) -> str:
    n = len(counts)                          # one bar per RATIO_BINS interval, then non-finite
    bw, gap, left, top, ph = 46, 8, 40, 26, 170
    width, height = left + n * (bw + gap) + 10, top + ph + 48
    peak = max(math.log10(c + 1) for c in counts) or 1.0
    parts = [f'<svg class="histogram" width="{width}" height="{height}" role="img" '
             f'aria-label="distribution of error over allowed">']
    tol_bin = RATIO_BINS.index(1.0)          # bars from here on are over the tolerance
    for k, c in enumerate(counts):
        h = ph * math.log10(c + 1) / peak
        x = left + k * (bw + gap)
        last = k == n - 1
        colour = "#9e9e9e" if k < tol_bin else ("#000000" if last else "#e53935")
        label = "NaN/inf" if last else f"{_edge(RATIO_BINS[k])} to {_edge(RATIO_BINS[k + 1])}"
        parts.append(f'<rect x="{x}" y="{top + ph - h:.1f}" width="{bw}" height="{h:.1f}" fill="{colour}">'
                     f'<title>{label}: {c} elements</title></rect>')
        parts.append(f'<text x="{x + bw / 2}" y="{top + ph - h - 3:.1f}" text-anchor="middle">{c}</text>')
        if last:
            parts.append(f'<text x="{x + bw / 2}" y="{top + ph + 14}" text-anchor="middle">NaN/inf</text>')
    for k, edge in enumerate(RATIO_BINS[:-1]):   # boundary ticks between the bars
        x = left + k * (bw + gap) - gap / 2
        parts.append(f'<line x1="{x}" y1="{top + ph}" x2="{x}" y2="{top + ph + 4}" stroke="#888"/>'
                     f'<text x="{x}" y="{top + ph + 15}" text-anchor="middle">{_edge(edge)}</text>')
    tx = left + tol_bin * (bw + gap) - gap / 2
    parts.append(f'<line x1="{tx}" y1="{top - 8}" x2="{tx}" y2="{top + ph}" stroke="#c62828" stroke-dasharray="4 3"/>'
                 f'<text x="{tx + 4}" y="{top - 12}">tolerance (SPEC \u00a74)</text>')
    parts.append(f'<line x1="{left - 4}" y1="{top + ph}" x2="{width - 6}" y2="{top + ph}" stroke="#888"/>')
    parts.append(f'<text x="{left}" y="{height - 8}">|actual - golden| / (atol + rtol |golden|); '
                 f'elements per bin, log scale</text></svg>')
    return "".join(parts)


def _node(r) -> str:
    return (r.node or "-") + (f" (attempt {r.attempts})" if r.attempts > 1 else "")


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower())


def render_html(run) -> str:
    """The report as one HTML string."""
    s = summarize(run)
    v = versions()
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>pfa-verify run: {_e(run.backend)}</title><style>{CSS}</style></head><body>"]
    verdict = '<span class="bad">FAILED</span>' if s["exit_status"] else '<span class="ok">OK</span>'
    out.append(f"<h1>pfa-verify run: {verdict}</h1>")
    out.append(f'<p class="meta"><b>{_e(s["verdict"])}</b></p>')
    out.append(f'<p class="meta">Backend <b>{_e(run.backend)}</b> (codec {_e(run.codec)}): '
               f'{_e(run.backend_note)}. Seed {run.seed}.</p>')
    out.extend(f'<p class="meta">{_e(line)}</p>' for line in provenance_lines(run))
    out.append('<p class="meta">' + ", ".join(f"{_e(k)} {_e(val)}" for k, val in v.items()) + "</p>")
    out.append('<p class="meta">Tolerance (SPEC \u00a74): |kernel - golden| &le; 1e-4 + |golden| / 128, '
               "elementwise, on float32 views.</p>")
    out.append("<h2>Cases</h2>")
    nodes = (run.execution or {}).get("executor") == "ray"     # a cluster run names each case's node
    out.append('<table class="results"><thead><tr><th>case</th><th>source</th><th>backend</th><th>reference</th>'
               "<th>max abs</th><th>max rel</th><th>mismatched/total</th><th>worst (row, head, d)</th><th>s</th>"
               + ("<th>node</th>" if nodes else "") + "<th>verdict</th></tr></thead><tbody>")
    failures = []
    for r in run.results:
        for k, o in enumerate(r.outcomes):
            cls = o.verdict + (" uncounted" if o.verdict == "fail" and not o.counts else "")
            anchor = f"f-{_slug(r.name)}-{_slug(o.reference)}"
            text = o.verdict + ("" if o.counts or o.verdict in ("pass", "skipped") else " (not counted)")
            text += f" ({o.skip_kind})" if o.skip_kind else ""
            if o.verdict == "fail":
                text = f'<a href="#{anchor}">{_e(text)}</a>'
                failures.append((r, o, anchor))
            else:
                text = _e(text)
            w = o.worst_index
            worst = "-" if not w else f"({w['row']}, {w['head']}, {w['d']})"
            note = o.attribution if o.verdict == "fail" else (o.message.splitlines()[0].removeprefix("skipped: ")
                                                              if o.message and o.verdict != "pass" else "")
            if o.verdict == "pass" and o.envelope and o.envelope["inside_only"]:
                note = f"{o.envelope['inside_only']} inside the envelope only"
            full = note or ""
            if o.verdict == "skipped" and len(full) > 60:   # the whole reason is in the Skipped list
                note = full[:58].rstrip() + "\u2026"
            why = f'<span class="why" title="{_e(full)}">{_e(note)}</span>' if note else ""
            out.append(f'<tr class="{cls}"><td>{_e(r.name) if k == 0 else ""}</td><td>{_e(r.source) if k == 0 else ""}'
                       f'</td><td class="be">{_e(r.backend) if k == 0 else ""}</td><td>{_e(o.reference)}</td>'
                       f'<td class="num">{_fmt(o.max_abs_err)}</td><td class="num">{_fmt(o.max_rel_err)}</td>'
                       f'<td class="num">{"-" if o.total is None else f"{o.mismatched}/{o.total}"}</td>'
                       f'<td>{worst}</td><td class="num">{f"{r.seconds:.2f}" if k == 0 else ""}</td>'
                       + (f'<td>{_e(_node(r)) if k == 0 else ""}</td>' if nodes else "")
                       + f'<td class="v">{text}{why}</td></tr>')
    out.append("</tbody></table>")
    skipped: dict = {}
    for r in run.results:
        for o in r.outcomes:
            if o.verdict == "skipped":
                skipped.setdefault((o.skip_kind, o.message.removeprefix("skipped: ")), []).append(r.name)
    if skipped:
        allowed = set(run.allowed_skips)
        out.append(f"<h2>Not checked: skipped ({sum(map(len, skipped.values()))})</h2><ul class=\"skips\">")
        for (kind, why), names in skipped.items():
            status = "allowed" if kind in allowed or "all" in allowed else "not allowed: fails the run"
            out.append(f"<li><b>{len(names)}</b> {_e(kind)} ({status}): {_e(', '.join(names))}: {_e(why)}</li>")
        out.append("</ul>")
    if failures:
        out.append("<h2>Failures</h2>")
    for r, o, anchor in failures:
        s1 = (r.config or {}).get("s1") or 1
        cls = "failure" + ("" if o.counts else " uncounted")
        att = o.attribution or "kernel logic"
        out.append(f'<section class="{cls}" id="{anchor}"><h3>{_e(r.name)} <small>({_e(r.source)}, '
                   f'reference {_e(o.reference)})</small></h3>')
        out.append(f'<p><span class="badge {_slug(att)}">{_e(att)}</span> {_e(_ATTRIBUTION_TEXT.get(att, ""))}</p>')
        if o.replay:
            out.append(f'<p class="replay">Replay: <code>{_e(o.replay)}</code></p>')
        if o.attribution_detail:
            out.append(f"<p>Where: {_e(o.attribution_detail)}</p>")
        if o.envelope:
            out.append(f"<p>{_e(o.envelope['note'])}</p>")
        if o.error_map:
            out.append('<div class="pictures"><figure>' + _heatmap(o.error_map, s1) +
                       "<figcaption>Worst error over allowed per output row (b, i) and query head (max over d). "
                       "Grey: within tolerance; orange to red: over; black: non-finite.</figcaption></figure>")
            out.append("<figure>" + _histogram(o.ratio_histogram) +
                       "<figcaption>How far every output element is from the golden, relative to the "
                       "tolerance.</figcaption></figure></div>")
        out.append(f"<pre>{_e(o.message)}</pre>")
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out)


def write_html(run, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(run), encoding="utf-8")
    return path

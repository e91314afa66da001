"""The reports of ``pfa-verify run``: the verdict rule, the JSON report and its schema, the terminal table.

The third stage of the cases/ pipeline (collect -> run -> report -> html_report -> cli).

The verdict rule (no false green): a run passes only if every case it was asked to check was checked
on the backend it was asked for, and every comparison that counts passed. It fails when

- a comparison that counts failed, or a case ended in an error (the backend raised, a worker could
  not start its backend, a captured case would not load);
- a case was skipped, unless its kind of skip was allowed by name (``--allow-skips KIND,...``, see
  kernels.backends.SKIP_KINDS);
- ``auto`` fell back to the golden (no kernel checked), unless ``--allow-fallback``;
- nothing was selected, or nothing was checked (whatever was allowed).

The JSON report (schema: cases/report.schema.json, documented in README.md under "Report schema")
has one object per case and comparison in ``results``, a ``summary`` whose ``verdict`` line says what
was and was not checked on which backend, the ``versions`` of what produced it, and what it checked
named by content (cases/data/provenance.py: the backend's codec, model and kernel file with its sha256, the
project's commit, the catalog's and regressions' fingerprints; cases/data/collect.py: the ``selection``
fingerprint, which ``pfa-verify compare`` matches).
"""
from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import math
from pathlib import Path

from cases.data.versions import versions

__all__ = ["SCHEMA_ID", "summarize", "exit_status", "to_json", "write_json", "check_schema",
           "Row", "table_rows", "skipped_groups", "render_table", "print_report", "provenance_lines",
           "execution_line", "short"]

SCHEMA_ID = "pfa-verify-run-report/4"


def _rows(run):
    for r in run.results:
        for o in r.outcomes:
            yield r, o


def _kinds(counter: collections.Counter) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in counter.most_common())


def summarize(run) -> dict:
    """Counts over cases and comparisons, the exit status the verdict rule gives, and its line."""
    counts = {"pass": 0, "fail": 0, "error": 0, "skipped": 0}
    not_counted = 0
    for _, o in _rows(run):
        counts[o.verdict] += 1
        not_counted += o.verdict in ("fail", "error") and not o.counts
    skipped_by_kind: collections.Counter = collections.Counter(
        r.outcomes[0].skip_kind or "unavailable" for r in run.results
        if r.outcomes and all(o.verdict == "skipped" for o in r.outcomes))
    errors = sum(1 for r in run.results if any(o.verdict == "error" for o in r.outcomes))
    failing = sum(1 for r in run.results if any(o.verdict in ("fail", "error") and o.counts for o in r.outcomes))
    checked = sum(1 for r in run.results if r.checked)
    failed = sum(1 for r in run.results if r.checked and any(o.verdict == "fail" and o.counts for o in r.outcomes))
    allowed = set(run.allowed_skips)
    if "all" in allowed:
        allowed |= set(skipped_by_kind)
    refused = collections.Counter({k: n for k, n in skipped_by_kind.items() if k not in allowed})
    reasons = []
    if not run.results:
        reasons.append("no case was selected, so nothing was checked")
    elif checked == 0:
        reasons.append("no case was checked")
    if failing:
        reasons.append(f"{failing} case{'s' if failing != 1 else ''} failed or ended in an error")
    if refused:
        kinds = ",".join(sorted(refused))
        reasons.append(f"{sum(refused.values())} case{'s were' if sum(refused.values()) != 1 else ' was'} not "
                       f"checked (skips of kind {kinds} are not allowed; --allow-skips {kinds} accepts them)")
    holes = _required_holes(run)
    if holes:
        reasons.append(f"--coverage: {len(holes)} required bin{'s' if len(holes) != 1 else ''} not hit by any checked "
                       f"case ({', '.join(holes)})")
    if run.fallback and not run.allow_fallback:
        reasons.append("auto fell back to the golden, so no kernel was checked (--allow-fallback accepts that; "
                       "--backend golden runs the golden on purpose)")
    n_skipped = sum(skipped_by_kind.values())
    inside = sum((o.envelope or {}).get("inside_only", 0) for _, o in _rows(run) if o.counts and o.verdict == "pass")
    line = (f"{len(run.results)} cases: {checked} checked on {run.backend} ({checked - failed} passed, {failed} failed), "
            f"{n_skipped} skipped" + (f" ({_kinds(skipped_by_kind)})" if n_skipped else "")
            + f", {errors} errors; {counts['pass'] + counts['fail']} comparisons"
            + (f", {not_counted} not counted" if not_counted else "")
            + (f"; {inside} elements passed inside the envelope only (an E4M3 code of P can flip, SPEC \u00a74.2)"
               if inside else "") + f"; {run.seconds:.1f} s -> "
            + ("FAILED: " + "; ".join(reasons) if reasons else "OK"))
    return {"cases": len(run.results), "checked_cases": checked, "passed_cases": checked - failed,
            "comparisons": counts["pass"] + counts["fail"], "passed": counts["pass"], "failed": counts["fail"],
            "errors": counts["error"], "skipped": counts["skipped"], "skipped_by_kind": dict(skipped_by_kind),
            "allowed_skips": sorted(run.allowed_skips), "fallback": bool(run.fallback),
            "not_counted": not_counted, "failing_cases": failing, "inside_envelope_only": inside,
            "seconds": round(run.seconds, 3),
            "exit_status": 1 if reasons else 0, "verdict": line}


def exit_status(run) -> int:
    return summarize(run)["exit_status"]


def _num(x):
    """A finite float, else None (JSON has no inf: a relative error over a zero golden is infinite)."""
    return None if x is None or not math.isfinite(x) else float(x)


def to_json(run) -> dict:
    """The JSON report as a dict (validates against cases/report.schema.json)."""
    results = []
    for r, o in _rows(run):
        results.append({
            "name": r.name, "source": r.source, "config": r.config, "seed": r.seed, "backend": r.backend,
            "reference": o.reference, "verdict": o.verdict, "counts": o.counts, "skip_kind": o.skip_kind,
            "max_abs_err": _num(o.max_abs_err), "max_rel_err": _num(o.max_rel_err),
            "mismatched": o.mismatched, "total": o.total, "worst_index": o.worst_index,
            "worst_ratio": _num(o.worst_ratio),
            "seconds": round(r.seconds, 4), "message": o.message, "attribution": o.attribution,
            "attribution_detail": o.attribution_detail, "replay": o.replay, "envelope": o.envelope,
            "diagnosis": o.diagnosis,
            "node": r.node, "attempts": r.attempts})
    prov = run.provenance or {}
    return {"schema": SCHEMA_ID,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": run.command,
            "backend": {"name": run.backend, "codec": run.codec, "chosen": run.backend_note,
                        **prov.get("backend", {"model": None, "kernel": None, "spec_codec_not_applicable": None})},
            "seed": run.seed, "versions": versions(), "project": prov.get("project"), "inputs": prov.get("inputs"),
            "selection": run.selection, "execution": execution(run), "coverage": run.coverage,
            "summary": summarize(run), "results": results}


def execution(run) -> dict:
    """What executed the cases (cases.running.pool.Pool.describe()) and how many each node ran."""
    described = dict(run.execution or {"executor": "here", "workers": 1, "cluster": None, "task_resources": {"CPU": 1},
                                       "resources": None, "nodes": []})
    described["cases_per_node"] = dict(collections.Counter(r.node for r in run.results if r.node))
    return described


def write_json(run, path) -> Path:
    """Write the report, checked against cases/report.schema.json first (a report that breaks it is a
    bug of ours: RuntimeError, nothing written)."""
    from cases.data.schemas import check_written
    data = to_json(run)
    check_written(data, "report")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # inf / nan are not JSON: the maxima of a comparison are finite or null by construction
    path.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    return path


def check_schema(instance) -> list[str]:
    """Errors of ``instance`` against cases/report.schema.json, as ``"$.path: message"`` lines; [] when
    valid (cases/data/schemas.py: the jsonschema package, draft 2020-12)."""
    from cases.data import schemas
    return schemas.errors(instance, "report")


# --- the table: one row model, rendered by the terminal (below) and the HTML page (html_report) ------

@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the run's table: one comparison of one case. Tables show the case's own cells (name,
    source, backend, seconds) on its first comparison only (``first``)."""
    outcome: object              # cases.running.run.Outcome
    first: bool                  # the case's first comparison
    name: str
    source: str
    backend: str
    seconds: str
    reference: str
    max_abs: str
    max_rel: str
    mismatched: str              # "mismatched/total", or "-" when nothing was compared
    worst: str                   # "(row, head, d)" of the greatest absolute difference, or "-"
    verdict: str                 # e.g. "pass", "fail (not counted)", "skipped (limit)"
    style: str                   # pass | fail | error | skipped | uncounted (a failure that does not count)
    note: str                    # a failure's attribution; a skip's or an error's reason; a pass's envelope share
    node: str                    # the cluster node that ran the case ("-" when unknown), "(attempt 2)" if retried


def _fmt(x, spec=".1e") -> str:
    return "-" if x is None else format(x, spec)


def _note(o) -> str:
    if o.verdict == "fail":
        return o.attribution or ""
    if o.verdict == "pass":
        inside = (o.envelope or {}).get("inside_only")
        return f"{inside} inside the envelope only" if inside else ""
    return o.message.splitlines()[0].removeprefix("skipped: ") if o.message else ""


def table_rows(run) -> list[Row]:
    """The rows of the run's table, in run order (one per case and comparison)."""
    rows = []
    for r in run.results:
        for k, o in enumerate(r.outcomes):
            uncounted = o.verdict in ("fail", "error") and not o.counts
            w = o.worst_index
            rows.append(Row(
                o, k == 0, r.name, r.source, r.backend, f"{r.seconds:.2f}", o.reference, _fmt(o.max_abs_err),
                _fmt(o.max_rel_err),
                "-" if o.total is None else f"{o.mismatched}/{o.total}",
                "-" if not w else f"({w['row']}, {w['head']}, {w['d']})",
                o.verdict + (" (not counted)" if uncounted else "") + (f" ({o.skip_kind})" if o.skip_kind else ""),
                "uncounted" if uncounted and o.verdict == "fail" else o.verdict, _note(o),
                (r.node or "-") + (f" (attempt {r.attempts})" if r.attempts > 1 else "")))
    return rows


def skipped_groups(run) -> dict:
    """Skipped cases by (kind of skip, reason): ``{(kind, why): [case names]}``, in run order."""
    groups: dict = {}
    for r, o in _rows(run):
        if o.verdict == "skipped":
            groups.setdefault((o.skip_kind, o.message.removeprefix("skipped: ")), []).append(r.name)
    return groups


# --- the terminal ------------------------------------------------------------------------------

_STYLE = {"pass": "green", "fail": "bold red", "error": "bold magenta", "skipped": "dim", "uncounted": "yellow"}


def render_table(run):
    """A rich Table of :func:`table_rows`."""
    from rich.table import Table
    table = Table(title=f"pfa-verify run: backend {run.backend}", title_justify="left", header_style="bold")
    nodes = (run.execution or {}).get("executor") == "ray"     # a cluster run names each case's node
    for col, kw in (("case", {"no_wrap": True}), ("source", {}), ("backend", {"overflow": "fold"}), ("reference", {}),
                    ("max abs", {"justify": "right"}), ("max rel", {"justify": "right"}),
                    ("mismatched/total", {"justify": "right"}), ("worst (row, head, d)", {}),
                    ("s", {"justify": "right"})) + ((("node", {"overflow": "fold"}),) if nodes else ()) + (
                    ("verdict", {"no_wrap": True}),):
        table.add_column(col, **kw)
    for row in table_rows(run):
        verdict = row.verdict + (f": {row.note}" if row.outcome.verdict == "fail" and row.note else "")
        case = (row.name, row.source, row.backend) if row.first else ("", "", "")
        node = (row.node if row.first else "",) if nodes else ()
        table.add_row(*case, row.reference, row.max_abs, row.max_rel, row.mismatched, row.worst,
                      row.seconds if row.first else "", *node, f"[{_STYLE[row.style]}]{verdict}[/]")
    return table


def _required_holes(run) -> tuple[str, ...]:
    """The bins ``--coverage`` required that no checked case hit (properties.coverage)."""
    required = getattr(run, "coverage_required", ()) or ()
    if not required or not run.coverage:
        return ()
    bins = run.coverage["bins"]
    names = [n for n in bins if " x " not in n] if "all" in required else list(required)
    return tuple(n for n in names if not bins.get(n, {}).get("hits"))


def coverage_line(run) -> str | None:
    """One line: bins and crosses hit by the checked cases, and the holes (properties.coverage)."""
    cv = run.coverage
    if not cv:
        return None
    singles = [n for n in cv["bins"] if " x " not in n]
    crosses = [n for n in cv["bins"] if " x " in n]
    text = (f"Coverage: {len(singles) - len(cv['holes'])}/{len(singles)} bins and "
            f"{len(crosses) - len(cv['cross_holes'])}/{len(crosses)} crosses hit by {cv['cases']} checked case(s)")
    if cv["holes"]:
        text += "; holes: " + ", ".join(cv["holes"])
    if cv["cross_holes"]:
        text += "; cross holes: " + ", ".join(cv["cross_holes"])
    return text


def print_report(run, console) -> None:
    console.print(render_table(run))
    for (_, why), names in skipped_groups(run).items():
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        console.print(f"[dim]Skipped {len(names)}: {shown}: {why}[/]", highlight=False,
                      markup=True)
    for r, o in _rows(run):
        if o.verdict in ("fail", "error") and o.counts:
            console.print(f"\n[bold red]{o.verdict.upper()}[/] {r.name} ({o.reference})", highlight=False)
            console.print(o.message, highlight=False, markup=False)
    console.print(f"\n{run.backend_note}", highlight=False, markup=False)
    for line in provenance_lines(run):
        console.print(line, highlight=False, markup=False)
    if coverage_line(run):
        console.print(coverage_line(run), highlight=False, markup=False)
    console.print(summarize(run)["verdict"], highlight=False, markup=False)


def execution_line(run) -> str:
    """Where the cases ran, in one line (terminal and HTML)."""
    ex = execution(run)
    per_node = ", ".join(f"{n} {c}" for n, c in sorted(ex["cases_per_node"].items()))
    if ex["executor"] == "ray":
        res = ", ".join(f"{k} {v:g}" for k, v in sorted((ex["resources"] or {}).items()) if k in ("CPU", "NPU", "GPU"))
        retried = sum(1 for r in run.results if r.attempts > 1)
        return (f"Executed on Ray cluster {ex['cluster']}: {len(ex['nodes'])} node(s), {res}; each case asked for "
                + ", ".join(f"{k} {v:g}" for k, v in ex["task_resources"].items()) + f"; cases per node: {per_node}"
                + (f"; {retried} case(s) ran twice (a worker died)" if retried else ""))
    where = "this process" if ex["executor"] == "here" else f"{ex['workers']} local worker processes"
    return f"Executed in {where}" + (f" on {per_node}" if per_node else "")


def short(fingerprint: str | None, n: int = 12) -> str:
    """The first ``n`` hex digits of a ``sha256:...`` fingerprint or a bare sha256 (what people compare)."""
    return "-" if not fingerprint else fingerprint.removeprefix("sha256:")[:n]


def provenance_lines(run) -> list[str]:
    """What the run checked, named by content, one fact a line (terminal and HTML)."""
    prov, sel = run.provenance or {}, run.selection or {}
    lines = [execution_line(run)] if run.execution else []
    if sel:
        parts = ", ".join(f"{v['cases']} {k}" for k, v in sel["by_source"].items())
        lines.append(f"Selection: {sel['cases']} cases ({parts}), fingerprint {short(sel['fingerprint'])}")
    kernel = (prov.get("backend") or {}).get("kernel")
    if kernel:
        lines.append(f"Kernel: {kernel['source']}" + (f":{kernel['function']}" if kernel["function"] else "")
                     + f", sha256 {kernel['sha256']}")
    model = (prov.get("backend") or {}).get("model")
    if model:
        judged = "declared by the backend" if model.get("declared", True) else "none declared: SPEC \u00a74.1 as written"
        lines.append(f"Model: {model['describe']} ({judged})")
    not_applicable = (prov.get("backend") or {}).get("spec_codec_not_applicable")
    if not_applicable:
        lines.append(f"Spec codec: not applicable on this backend ({not_applicable})")
    project, inputs = prov.get("project"), prov.get("inputs")
    if project:
        commit = project["commit"][:12] if project["commit"] else "unknown commit"
        lines.append(f"pfa-verify {project['version']} ({commit}{', modified' if project['dirty'] else ''})"
                     + (f"; catalog sha256 {short(inputs['catalog']['sha256'])}, regressions "
                        f"{inputs['regressions']['cases']} ({short(inputs['regressions']['fingerprint'])})"
                        if inputs else ""))
    return lines

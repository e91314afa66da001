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

from rich.table import Table
from rich.text import Text

from pfa_verify.cases.data import schemas
from pfa_verify.cases.data.capture_files import write_durably
from pfa_verify.cases.data.schemas import check_written
from pfa_verify.cases.data.versions import versions
from pfa_verify.cases.reporting.groups import compact_names, failure_groups, group_line
from pfa_verify.cases.reporting.signals import EXIT_INTERRUPTED
from pfa_verify.cases.reporting.terminal import printable_data, shown
from pfa_verify.cases.running.verdict import CaseVerdict
from pfa_verify.properties.rule.acceptance import CodecVerdict
from pfa_verify.properties.rule.coverage import coverage_text

__all__ = ["SCHEMA_ID", "RunSummary", "summarize", "to_json", "write_json", "check_schema", "ResultRow",
           "result_rows", "failure_text", "table_rows", "skipped_groups", "render_table", "print_report",
           "provenance_lines", "execution_line", "short", "EXIT_INTERRUPTED"]

SCHEMA_ID = "pfa-verify-run-report/5"



# --- rows: each case's outcomes, as every report shows them --------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class ResultRow:
    """One outcome of one case: a comparison under one codec (``codec``: its
    properties.rule.acceptance.CodecVerdict), or the case's one outcome when it made none (a skip, an error, a
    changed input, another law's replay). ``first``: the case's first row."""
    case: CaseVerdict
    first: bool
    reference: str
    verdict: str                 # pass | fail | error | skipped
    counts: bool
    skip_kind: str | None = None
    codec: CodecVerdict | None = None
    attribution: str | None = None          # kernel logic | backend codec, for failures
    attribution_detail: str | None = None
    text: str = ""               # the rule's failure text, the error, the skip's reason, the law's line

    @property
    def shown_verdict(self) -> str:
        uncounted = self.verdict in ("fail", "error") and not self.counts
        return self.verdict + (" (not counted)" if uncounted else "") + (f" ({self.skip_kind})" if self.skip_kind else "")

    @property
    def style(self) -> str:
        return "uncounted" if self.verdict == "fail" and not self.counts else self.verdict


def result_rows(case) -> list[ResultRow]:
    """The rows of one case's verdict (cases.running.verdict.CaseVerdict), in order."""
    rows: list[ResultRow] = []
    if case.ledger_broken is not None:
        first = case.judgement.references[0].reference if case.judgement is not None else "spec"
        rows.append(ResultRow(case=case, first=True, reference=first, verdict="fail", counts=True,
                              attribution="kernel logic",
                              text=f"ledger entry no longer fails: remove it ({case.ledger_broken})"))
    elif case.judgement is not None:
        for k, ref in enumerate(case.judgement.references):
            rows.append(ResultRow(case=case, first=k == 0, reference=ref.reference,
                                  verdict="pass" if ref.passed else "fail",
                                  counts=ref.counts and case.ledger is None, codec=ref,
                                  attribution=None if ref.passed else ref.category,
                                  attribution_detail=ref.attribution_text, text=ref.message))
    elif case.inputs_modified is not None:
        rows.append(ResultRow(case=case, first=True, reference="spec", verdict="fail", counts=case.ledger is None,
                              attribution="kernel logic", attribution_detail="the backend modified its inputs",
                              text=case.inputs_modified))
    elif case.law is not None:
        rows.append(ResultRow(case=case, first=True, reference=f"law {case.law.law}",
                              verdict="pass" if case.law.passed else "fail", counts=True,
                              attribution=None if case.law.passed else "kernel logic", text=case.law.message))
    elif case.skip is not None:
        rows.append(ResultRow(case=case, first=True, reference=NO_REFERENCE, verdict="skipped", counts=False,
                              skip_kind=case.skip.kind, text=f"skipped: {case.skip.reason}"))
    else:
        rows.append(ResultRow(case=case, first=True, reference=NO_REFERENCE, verdict="error", counts=True,
                              text=case.error.message))
    return rows


NO_REFERENCE = "-"


def _all_rows(run):
    for case in run.results:
        yield from result_rows(case)


def failure_text(row: ResultRow) -> str:
    """The whole text of a row, rendered from the record (the terminal's failures, the JSON report's
    ``message`` and the HTML card all show this): the rule's text (empty for a pass), then what the run
    learnt (the ledger, a retry, and for a counted failure the group and how it was captured, the
    diagnosis, the replay line)."""
    case = row.case
    lines = [row.text] if row.text else []
    if row.verdict == "fail" and not row.counts and case.ledger is not None:
        lines.append(f"Known failure (ledger): {case.ledger}")
    if case.retry_cause:
        lines.append(f"(ran again: its first run was lost when its worker process ended: {case.retry_cause})")
    if row.verdict in ("fail", "error") and row.counts and (said := group_line(case)):
        lines.append(said)
    if row.verdict == "fail" and row.counts:
        capture = case.capture
        if case.diagnosis is not None and row.codec is not None:
            lines.append(case.diagnosis.render(note=case.diagnosis_note))
        if capture is not None:
            lines.append(capture.line)
    if row.verdict == "error" and row.counts and case.diagnosis is not None:
        lines.append(case.diagnosis.render(note=case.diagnosis_note))
    return "\n".join(lines)


def _kinds(counter: collections.Counter) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in counter.most_common())


# --- the verdict rule and the summary ------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSummary:
    """Counts over cases and comparisons, why the run failed (``reasons``; none: it passed), the exit
    status that follows, and the summary line. Made once per run by :func:`summarize`."""
    counts: dict
    reasons: tuple[str, ...]
    exit_status: int
    line: str

    def to_dict(self) -> dict:
        return {**self.counts, "exit_status": self.exit_status, "verdict": self.line}


def summarize(run) -> RunSummary:
    """The verdict rule (the module docstring) applied to ``run``, once."""
    counts = {"pass": 0, "fail": 0, "error": 0, "skipped": 0}
    not_counted = 0
    for row in _all_rows(run):
        counts[row.verdict] += 1
        not_counted += row.verdict in ("fail", "error") and not row.counts
    skipped_by_kind: collections.Counter = collections.Counter(c.skip.kind for c in run.results if c.skip is not None)
    errors = sum(1 for c in run.results if c.error is not None)
    failing = sum(1 for c in run.results if c.error is not None or c.failed)
    checked = sum(1 for c in run.results if c.checked)
    failed = sum(1 for c in run.results if c.checked and c.failed)
    allowed = set(run.allowed_skips)
    if "all" in allowed:
        allowed |= set(skipped_by_kind)
    refused = collections.Counter({k: n for k, n in skipped_by_kind.items() if k not in allowed})
    reasons = []
    if run.interrupted:
        reasons.append(f"interrupted by {run.interrupted} after {len(run.results)} of "
                       f"{len(run.results) + len(run.not_run)} cases ({len(run.not_run)} not run)")
    if not run.results and not run.interrupted:
        reasons.append("no case was selected, so nothing was checked")
    elif checked == 0 and not run.interrupted:
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
    for failure in run.write_failures:
        reasons.append(f"evidence lost or not written: {failure}")
    n_skipped = sum(skipped_by_kind.values())
    inside = sum((row.codec.envelope_figures.inside_only if row.codec.envelope_figures else 0)
                 for row in _all_rows(run) if row.codec is not None and row.counts and row.verdict == "pass")
    line = (f"{len(run.results)} cases: {checked} checked on {run.backend} ({checked - failed} passed, {failed} failed), "
            f"{n_skipped} skipped" + (f" ({_kinds(skipped_by_kind)})" if n_skipped else "")
            + f", {errors} errors; {counts['pass'] + counts['fail']} comparisons"
            + (f", {not_counted} not counted" if not_counted else "")
            + (f"; {inside} elements passed inside the envelope only (an E4M3 code of P can flip, SPEC \u00a74.2)"
               if inside else "") + f"; {run.seconds:.1f} s -> "
            + ("FAILED: " + "; ".join(reasons) if reasons else "OK"))
    exit_status = EXIT_INTERRUPTED.get(run.interrupted or "", 1) if run.interrupted else (1 if reasons else 0)
    return RunSummary(counts={
        "cases": len(run.results), "checked_cases": checked, "passed_cases": checked - failed,
        "comparisons": counts["pass"] + counts["fail"], "passed": counts["pass"], "failed": counts["fail"],
        "errors": counts["error"], "skipped": counts["skipped"], "skipped_by_kind": dict(skipped_by_kind),
        "allowed_skips": sorted(run.allowed_skips), "fallback": bool(run.fallback), "not_counted": not_counted,
        "failing_cases": failing, "inside_envelope_only": inside, "seconds": round(run.seconds, 3),
        "interrupted": run.interrupted, "not_run": list(run.not_run), "write_failures": list(run.write_failures)},
        reasons=tuple(reasons), exit_status=exit_status, line=line)


def _num(x):
    """A finite float, else None (JSON has no inf: a relative error over a zero golden is infinite)."""
    return None if x is None or not math.isfinite(x) else float(x)


def _result(row: ResultRow) -> dict:
    """One object of the JSON report's ``results``."""
    case, ref = row.case, row.codec
    res = ref.comparison if ref is not None else None
    failing = row.verdict in ("fail", "error")
    return {
        "name": case.name, "source": case.source, "config": case.config, "seed": case.seed, "backend": case.backend,
        "reference": row.reference, "verdict": row.verdict, "counts": row.counts, "skip_kind": row.skip_kind,
        "max_abs_err": _num(ref.max_abs_err) if ref else None, "max_rel_err": _num(ref.max_rel_err) if ref else None,
        "mismatched": ref.mismatched if ref else None, "total": res.total if res else None,
        "worst_index": ref.worst_index if ref else None, "worst_ratio": _num(ref.worst_ratio) if ref else None,
        "seconds": round(case.seconds, 4), "message": failure_text(row),
        "attribution": row.attribution, "attribution_detail": row.attribution_detail,
        "replay": case.capture.replay if failing and row.counts and case.capture is not None else None,
        "envelope": ref.envelope_figures.to_dict() if ref is not None and ref.envelope_figures else None,
        "diagnosis": case.diagnosis.to_dict() if failing and row.counts and case.diagnosis is not None
        and (ref is not None or row.verdict == "error") else None,
        "node": case.node, "attempts": case.attempts, "group": case.group.number if case.group is not None else None}


def to_json(run, summary: RunSummary | None = None) -> dict:
    """The JSON report as a dict (validates against cases/report.schema.json). Every string in it is
    printable (kernels.backends.text): a kernel's message, a backend's name or a path holds no control
    character or lone surrogate, so the report can be encoded, and shown, as it is."""
    summary = summary or summarize(run)
    prov = run.provenance or {}
    return printable_data({"schema": SCHEMA_ID,
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": run.command,
            "backend": {"name": run.backend, "codec": run.codec, "chosen": run.backend_note,
                        **prov.get("backend", {"model": None, "kernel": None, "spec_codec_not_applicable": None})},
            "seed": run.seed, "versions": versions(), "project": prov.get("project"), "inputs": prov.get("inputs"),
            "selection": run.selection, "execution": execution(run), "coverage": run.coverage, "shared": list(run.shared),
            "summary": summary.to_dict(), "groups": failure_groups(run),
            "results": [_result(row) for row in _all_rows(run)]})


def execution(run) -> dict:
    """What executed the cases and how many each node ran."""
    described = dict(run.execution or {"executor": "supervised", "workers": 1, "cluster": None,
                                       "task_resources": {"CPU": 1}, "resources": None, "nodes": []})
    described["cases_per_node"] = dict(collections.Counter(c.node for c in run.results if c.node))
    return described


def write_json(run, path, summary: RunSummary | None = None) -> Path:
    """Write the report, checked against cases/report.schema.json first (a report that breaks it is a
    bug of ours: RuntimeError, nothing written), through a temporary file renamed into place."""
    data = to_json(run, summary)
    check_written(data, "report")
    # inf / nan are not JSON: the maxima of a comparison are finite or null by construction
    return write_text_atomically(Path(path), json.dumps(data, indent=2, allow_nan=False) + "\n")


def write_text_atomically(path: Path, text: str) -> Path:
    """``text`` into ``path`` through a unique temporary name in its folder, flushed and renamed
    (cases.data.capture_files.write_durably, the one durable writer): a reader sees the old file or the
    new one, never half of one, and the file has the user's umask. OSError on failure, nothing left behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_durably(path.parent, path.name, text.encode("utf-8", "backslashreplace"))
    return path


def check_schema(instance) -> list[str]:
    """Errors of ``instance`` against cases/report.schema.json, as ``"$.path: message"`` lines; [] when
    valid (cases/data/schemas.py: the jsonschema package, draft 2020-12)."""
    return schemas.errors(instance, "report")


# --- the table: one row model, rendered by the terminal (below) and the HTML page (html_report) ------

def _fmt(x, spec=".1e") -> str:
    return "-" if x is None else format(x, spec)


def row_note(row: ResultRow) -> str:
    """A row's short note: a failure's attribution, a skip's or an error's reason, a pass's envelope share."""
    if row.verdict == "fail":
        return row.attribution or ""
    if row.verdict == "pass":
        inside = row.codec.envelope_figures.inside_only if row.codec is not None and row.codec.envelope_figures else 0
        return f"{inside} inside the envelope only" if inside else ""
    return row.text.splitlines()[0].removeprefix("skipped: ") if row.text else ""


def table_rows(run) -> list[ResultRow]:
    """The rows of the run's table, in run order (one per case and comparison)."""
    return list(_all_rows(run))


def cells(row: ResultRow) -> dict:
    """The table cells of a row, as text (the terminal and the HTML page)."""
    ref, case = row.codec, row.case
    w = ref.worst_index if ref is not None else None
    return {"seconds": f"{case.seconds:.2f}", "max_abs": _fmt(ref.max_abs_err if ref else None),
            "max_rel": _fmt(ref.max_rel_err if ref else None),
            "mismatched": "-" if ref is None else f"{ref.mismatched}/{ref.comparison.total}",
            "worst": "-" if not w else f"({w['row']}, {w['head']}, {w['d']})", "note": row_note(row),
            "node": (case.node or "-") + (f" (attempt {case.attempts})" if case.attempts > 1 else "")}


def skipped_groups(run) -> dict:
    """Skipped cases by (kind of skip, reason): ``{(kind, why): [case names]}``, in run order."""
    groups: dict = {}
    for case in run.results:
        if case.skip is not None:
            groups.setdefault((case.skip.kind, case.skip.reason), []).append(case.name)
    return groups


# --- the terminal ------------------------------------------------------------------------------

_STYLE = {"pass": "green", "fail": "bold red", "error": "bold magenta", "skipped": "dim", "uncounted": "yellow"}


def render_table(run, *, verbose: bool = False, width: int = 100):
    """A rich Table of :func:`table_rows`: every row and column when ``verbose``; else, within ``width``
    columns, the rows that did not pass, one at a time, and one row per group of passing ones (their source
    and comparison), with their count, their largest error and their time. Every cell is text
    (:func:`cases.reporting.terminal.shown`): a case's name or a kernel's message is never markup."""
    if verbose:
        return _every_row(run)
    table = Table(title=shown(f"pfa-verify run: backend {run.backend}"), title_justify="left", header_style="bold",
                  width=width)
    table.add_column("case", no_wrap=True)
    table.add_column("reference", no_wrap=True)
    for col in ("max abs", "mismatched", "s"):
        table.add_column(col, justify="right", no_wrap=True)
    # the one column that wraps; 100 columns keep "fail: kernel logic" on one line
    table.add_column("verdict", ratio=1, overflow="fold", min_width=len("fail: kernel logic") if width >= 100 else None)
    passing: dict[tuple[str, str], list[ResultRow]] = {}

    def pass_key(row: ResultRow) -> tuple[str, str]:
        # passing captured regressions are one row whatever their laws: each law would be a row of its own
        return (row.case.source, "laws" if row.case.source == "regression" and row.reference.startswith("law ")
                else row.reference)
    for row in table_rows(run):
        if row.verdict == "pass":
            passing.setdefault(pass_key(row), []).append(row)
    shown_groups: set[tuple[str, str]] = set()
    several = len({c.group.number for c in run.results if c.group is not None}) > 1
    for row in table_rows(run):
        key = pass_key(row)
        if row.verdict == "pass":
            if key in shown_groups:
                continue
            shown_groups.add(key)
            group = passing[key]
            worst = max((r.codec.max_abs_err for r in group if r.codec is not None and r.codec.max_abs_err is not None),
                        default=None)
            seconds = sum(r.case.seconds for r in group if r.first)
            name = f"{len(group)} {key[0]} case{'s' if len(group) != 1 else ''}"
            table.add_row(shown(name), shown(key[1]), _fmt(worst), "-", f"{seconds:.1f}",
                          shown("pass", _STYLE["pass"]))
            continue
        c = cells(row)
        verdict = row.shown_verdict + (f": {c['note']}" if row.verdict == "fail" and c["note"] else "")
        if several and row.case.group is not None and row.counts:
            verdict = f"#{row.case.group.number} {verdict}"      # the failure's group, as its block names it
        table.add_row(shown(row.case.name), shown(row.reference), c["max_abs"], c["mismatched"],
                      c["seconds"] if row.first else "", shown(verdict, _STYLE[row.style]))
    return table


def _every_row(run):
    """The whole table: every row, every column (``pfa-verify run -v``)."""
    table = Table(title=shown(f"pfa-verify run: backend {run.backend}"), title_justify="left", header_style="bold")
    nodes = (run.execution or {}).get("executor") == "ray"     # a cluster run names each case's node
    for col, kw in (("case", {"no_wrap": True}), ("source", {}), ("backend", {"overflow": "fold"}), ("reference", {}),
                    ("max abs", {"justify": "right"}), ("max rel", {"justify": "right"}),
                    ("mismatched/total", {"justify": "right"}), ("worst (row, head, d)", {}),
                    ("s", {"justify": "right"})) + ((("node", {"overflow": "fold"}),) if nodes else ()) + (
                    ("verdict", {"no_wrap": True}),):
        table.add_column(col, **kw)
    for row in table_rows(run):
        c = cells(row)
        verdict = row.shown_verdict + (f": {c['note']}" if row.verdict == "fail" and c["note"] else "")
        case = (row.case.name, row.case.source, row.case.backend) if row.first else ("", "", "")
        node = (c["node"] if row.first else "",) if nodes else ()
        table.add_row(*(shown(v) for v in (*case, row.reference)), c["max_abs"], c["max_rel"], c["mismatched"],
                      c["worst"], c["seconds"] if row.first else "", *(shown(v) for v in node),
                      shown(verdict, _STYLE[row.style]))
    return table


def _required_holes(run) -> tuple[str, ...]:
    """The bins ``--coverage`` required that no checked case hit (properties.rule.coverage)."""
    required = getattr(run, "coverage_required", ()) or ()
    if not required or not run.coverage:
        return ()
    bins = run.coverage["bins"]
    names = [n for n in bins if " x " not in n] if "all" in required else list(required)
    return tuple(n for n in names if not bins.get(n, {}).get("hits"))


def coverage_line(run) -> str | None:
    """One line: bins and crosses hit by the checked cases, and the holes (properties.rule.coverage)."""
    return coverage_text(run.coverage) if run.coverage else None


def print_report(run, console, summary: RunSummary | None = None, *, verbose: bool = False) -> None:
    """The table, the skips, each counted failure in full, then what was checked and the summary line,
    on ``console``; every line is text (:func:`cases.reporting.terminal.shown`), whatever the console parses."""
    summary = summary or summarize(run)
    console.print(render_table(run, verbose=verbose, width=min(100, console.width)))
    several = len({c.group.number for c in run.results if c.group is not None}) > 1
    for (_, why), names in skipped_groups(run).items():
        listed = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        console.print(shown(f"Skipped {len(names)}: {listed}: {why}", "dim"))
    for row in table_rows(run):
        group = row.case.group
        # one block per group of cases that fail alike: its smallest case's, naming the others
        if row.verdict in ("fail", "error") and row.counts and (group is None or group.shown == row.case.name):
            others = [] if group is None else [n for n in group.members if n != row.case.name]
            alike = f" and {len(others)} more that fail alike: {compact_names(others)}" if others else ""
            number = f" #{group.number}" if group is not None and several else ""
            console.print(Text.assemble("\n", shown(row.verdict.upper(), "bold red"),
                                        shown(f"{number} {row.case.name} ({row.reference}){alike}")))
            console.print(shown(failure_text(row)))
    for found in run.shared:
        console.print(shown(f"\n{found['text']}"))
    if run.not_run:
        listed = ", ".join(run.not_run[:6]) + (f" and {len(run.not_run) - 6} more" if len(run.not_run) > 6 else "")
        console.print(shown(f"\nNot run (interrupted by {run.interrupted}): {listed}"))
    console.print(shown(f"\n{run.backend_note}"))
    for line in provenance_lines(run):
        console.print(shown(line))
    if coverage_line(run):
        console.print(shown(coverage_line(run)))
    console.print(shown(summary.line))


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
    if ex["executor"] == "in-process":
        where = "this process (--in-process: the kernel unsupervised)"
    else:
        started = ex.get("processes")
        where = (f"{ex['workers']} supervised worker process{'es' if ex['workers'] != 1 else ''}"
                 + (f" ({started} started, replacements included)" if started and started > ex["workers"] else ""))
    refused = ex.get("refused") or []
    return (f"Kernel calls in {where}" + (f" on {per_node}" if per_node else "")
            + (f"; {len(refused)} worker(s) could not load the backend and ran nothing ({'; '.join(refused)})"
               if refused else ""))


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

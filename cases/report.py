"""The reports of ``pfa-verify run``: the terminal table, the JSON report and its schema, the exit status.

The JSON report (schema: cases/report.schema.json, documented in README.md under "Report schema")
has one object per case and comparison in ``results``, a ``summary`` and the ``versions`` of
pfa-verify, torch, pypto and the platform. The exit status is 0 only when every comparison that
counts passed (see :mod:`cases.run` for which count); skips never fail a run.
"""
from __future__ import annotations

import datetime
import json
import math
import platform
import sys
from pathlib import Path

__all__ = ["SCHEMA_PATH", "SCHEMA_ID", "versions", "summarize", "exit_status", "to_json", "write_json",
           "check_schema", "render_table", "run_and_report"]

SCHEMA_PATH = Path(__file__).resolve().parent / "report.schema.json"
SCHEMA_ID = "pfa-verify-run-report/1"


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def versions() -> dict:
    """Versions of what produced the report (pypto read from its metadata, never imported here)."""
    import torch
    own = _dist_version("pfa-verify")
    if own is None:  # running from a source tree that is not installed
        try:
            import tomllib
            own = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]["version"]
        except Exception:  # noqa: BLE001 - best effort
            own = None
    return {"pfa-verify": own, "torch": torch.__version__, "pypto": _dist_version("pypto"),
            "torch_npu": _dist_version("torch_npu"), "hypothesis": _dist_version("hypothesis"),
            "python": platform.python_version(), "platform": platform.platform()}


def _rows(run):
    for r in run.results:
        for o in r.outcomes:
            yield r, o


def summarize(run) -> dict:
    """Counts over cases and comparisons, and the exit status they imply."""
    counts = {"pass": 0, "fail": 0, "error": 0, "skipped": 0}
    not_counted = 0
    for _, o in _rows(run):
        counts[o.verdict] += 1
        not_counted += o.verdict in ("fail", "error") and not o.counts
    failing = sum(1 for r in run.results if any(o.verdict in ("fail", "error") and o.counts for o in r.outcomes))
    return {"cases": len(run.results), "comparisons": sum(counts.values()), "passed": counts["pass"],
            "failed": counts["fail"], "errors": counts["error"], "skipped": counts["skipped"],
            "not_counted": not_counted, "failing_cases": failing, "seconds": round(run.seconds, 3),
            "exit_status": 1 if failing else 0}


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
            "reference": o.reference, "verdict": o.verdict, "counts": o.counts,
            "max_abs_err": _num(o.max_abs_err), "max_rel_err": _num(o.max_rel_err),
            "mismatched": o.mismatched, "total": o.total, "worst_index": o.worst_index,
            "seconds": round(r.seconds, 4), "message": o.message, "attribution": o.attribution,
            "attribution_detail": o.attribution_detail, "replay": o.replay})
    return {"schema": SCHEMA_ID,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": run.command, "backend": {"name": run.backend, "codec": run.codec, "chosen": run.backend_note},
            "seed": run.seed, "versions": versions(), "summary": summarize(run), "results": results}


def write_json(run, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # inf / nan are not JSON: the maxima of a comparison are finite or null by construction
    path.write_text(json.dumps(to_json(run), indent=2, allow_nan=False) + "\n")
    return path


# --- a small JSON Schema checker (the subset report.schema.json uses) -----------------------------

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is_type(value, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[name])


def check_schema(instance, schema: dict | None = None, *, _root=None, _path="$") -> list[str]:
    """Errors of ``instance`` against ``schema`` (default: cases/report.schema.json); [] when valid.

    Supports type (string or list), enum, const, required, properties, additionalProperties (bool
    or schema), items, minimum, $ref to #/$defs/..., anyOf: what the report schema uses.
    """
    if schema is None:
        schema = json.loads(SCHEMA_PATH.read_text())
    root = _root or schema
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/$defs/"):
            return [f"{_path}: unsupported $ref {ref!r}"]
        return check_schema(instance, root["$defs"][ref.split("/")[-1]], _root=root, _path=_path)
    errors: list[str] = []
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(instance, n) for n in names):
            return [f"{_path}: {instance!r:.60} is not of type {names}"]
    if "enum" in schema and instance not in schema["enum"]:
        errors.append(f"{_path}: {instance!r} is not one of {schema['enum']}")
    if "const" in schema and instance != schema["const"]:
        errors.append(f"{_path}: {instance!r} is not {schema['const']!r}")
    if "minimum" in schema and _is_type(instance, "number") and instance < schema["minimum"]:
        errors.append(f"{_path}: {instance!r} is below the minimum {schema['minimum']}")
    if "anyOf" in schema:
        if all(check_schema(instance, s, _root=root, _path=_path) for s in schema["anyOf"]):
            errors.append(f"{_path}: matches none of anyOf")
    if isinstance(instance, dict):
        for key in schema.get("required", ()):
            if key not in instance:
                errors.append(f"{_path}: missing required {key!r}")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, value in instance.items():
            if key in props:
                errors += check_schema(value, props[key], _root=root, _path=f"{_path}.{key}")
            elif extra is False:
                errors.append(f"{_path}: unexpected property {key!r}")
            elif isinstance(extra, dict):
                errors += check_schema(value, extra, _root=root, _path=f"{_path}.{key}")
    if isinstance(instance, list) and "items" in schema:
        for k, value in enumerate(instance):
            errors += check_schema(value, schema["items"], _root=root, _path=f"{_path}[{k}]")
    return errors


# --- the terminal ------------------------------------------------------------------------------

_STYLE = {"pass": "green", "fail": "bold red", "error": "bold magenta", "skipped": "dim"}


def _fmt(x, spec=".1e") -> str:
    return "-" if x is None else format(x, spec)


def _worst(o) -> str:
    w = o.worst_index
    return "-" if not w else f"({w['row']}, {w['head']}, {w['d']})"


def render_table(run):
    """A rich Table: one row per case and comparison."""
    from rich.table import Table
    table = Table(title=f"pfa-verify run: backend {run.backend}", title_justify="left", header_style="bold")
    for col, kw in (("case", {"no_wrap": True}), ("source", {}), ("backend", {"overflow": "fold"}), ("reference", {}),
                    ("max abs", {"justify": "right"}), ("max rel", {"justify": "right"}),
                    ("mismatched/total", {"justify": "right"}), ("worst (row, head, d)", {}),
                    ("s", {"justify": "right"}), ("verdict", {"no_wrap": True})):
        table.add_column(col, **kw)
    for r in run.results:
        for k, o in enumerate(r.outcomes):
            verdict = o.verdict if o.counts or o.verdict in ("pass", "skipped") else f"{o.verdict} (not counted)"
            if o.attribution and o.verdict == "fail":
                verdict += f": {o.attribution}"
            mm = "-" if o.total is None else f"{o.mismatched}/{o.total}"
            style = "yellow" if o.verdict == "fail" and not o.counts else _STYLE[o.verdict]
            table.add_row(r.name if k == 0 else "", r.source if k == 0 else "", r.backend if k == 0 else "",
                          o.reference, _fmt(o.max_abs_err), _fmt(o.max_rel_err), mm, _worst(o),
                          f"{r.seconds:.2f}" if k == 0 else "", f"[{style}]{verdict}[/]")
    return table


def _summary_line(run, s: dict) -> str:
    parts = [f"{s['cases']} cases, {s['comparisons']} comparisons: {s['passed']} passed, {s['failed']} failed"]
    if s["not_counted"]:
        parts.append(f" ({s['not_counted']} not counted)")
    parts.append(f", {s['errors']} errors, {s['skipped']} skipped in {s['seconds']:.1f} s")
    verdict = "FAILED" if s["exit_status"] else "OK"
    return "".join(parts) + f" -> {verdict}"


def print_report(run, console) -> None:
    console.print(render_table(run))
    skipped: dict = {}
    for r, o in _rows(run):
        if o.verdict == "skipped":
            skipped.setdefault(o.message, []).append(r.name)
    for why, names in skipped.items():
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        console.print(f"[dim]Skipped {len(names)}: {shown}: {why.removeprefix('skipped: ')}[/]", highlight=False)
    for r, o in _rows(run):
        if o.verdict in ("fail", "error") and o.counts:
            console.print(f"\n[bold red]{o.verdict.upper()}[/] {r.name} ({o.reference})", highlight=False)
            console.print(o.message, highlight=False, markup=False)
    console.print(f"\n{run.backend_note}", highlight=False, markup=False)
    console.print(_summary_line(run, summarize(run)), highlight=False, markup=False)


class _Progress:
    """A rich progress bar on a terminal, plain lines otherwise."""

    def __init__(self, console):
        self.console, self.done, self.total, self.bar, self.task = console, 0, None, None, None

    def __call__(self, event, item, result) -> None:
        if self.total is None:
            return
        if event == "start":
            if self.bar is not None:
                self.bar.update(self.task, description=item.name)
            return
        self.done += 1
        verdicts = ",".join(sorted({o.verdict for o in result.outcomes}))
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=item.name)
        else:
            print(f"[{self.done:>{len(str(self.total))}}/{self.total}] {item.name} ({item.source}): {verdicts} "
                  f"{result.seconds:.1f} s", flush=True)


def run_and_report(args) -> int:
    """``pfa-verify run``: run, print the table and summary, write the reports, return the exit status."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from cases import run as runner
    console = Console() if sys.stdout.isatty() else Console(width=200, force_terminal=False)
    progress = _Progress(console)

    def announce(items, note):
        progress.total = len(items)
        console.print(note, highlight=False, markup=False)
        console.print(f"{len(items)} cases: " + ", ".join(
            f"{sum(i.source == s for i in items)} {s}" for s in runner.SOURCES), highlight=False)

    if console.is_terminal:
        with Progress(TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=console,
                      transient=True) as bar:
            progress.bar, progress.task = bar, bar.add_task("choosing backend", total=None)

            def hook(event, item, result):
                if progress.total is not None and bar.tasks[0].total is None:
                    bar.update(progress.task, total=progress.total)
                progress(event, item, result)
            run = runner.execute(args, progress=hook, on_items=announce)
    else:
        run = runner.execute(args, progress=progress, on_items=announce)
    print_report(run, console)
    if args.json:
        console.print(f"JSON report: {write_json(run, args.json)}", highlight=False)
    if args.html:
        from cases import html_report
        console.print(f"HTML report: {html_report.write_html(run, args.html)}", highlight=False)
    return exit_status(run)

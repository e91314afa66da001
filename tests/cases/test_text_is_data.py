"""Text is data (issue 53, item 6): a kernel's message, a backend's name, notes and skip reasons, what a kernel
prints, a path and a case file's message reach the terminal, the JSON report and the HTML report with their
control characters escaped (kernels.backends.text.printable), never parsed as markup, never raising on a
character the stream cannot encode (cases/reporting/terminal.py, cases/reporting/html_pages.py)."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from pfa_verify import golden
from pfa_verify.cases import cli
from pfa_verify.cases.data import regressions
from pfa_verify.cases.reporting import html_pages, report_compare
from pfa_verify.cases.reporting.terminal import SafeStream, printable_data, shown
from pfa_verify.kernels.backends.text import printable
from pfa_verify.properties.rule.case import Case
from tests.cases.hostile_text import EVIL, PRINTED

ROOT = Path(__file__).resolve().parents[2]
#: Three catalog cases of the hostile backend: one raises (a batch of one), one ends its worker (three
#: batches), one is skipped (two KV heads).
CASES = "edge_tail_tile_3_tokens,edge_all_batches_empty,edge_lengths_0_1_bs_bs1"
#: What a terminal acts on: ESC, BEL, a carriage return; a bidirectional override.
ACTING = ("\x1b", "\x07", "\r", "\u202e")


def _hostile_file(tmp_path: Path) -> Path:
    """The hostile backend, in a folder whose path is rich markup."""
    folder = tmp_path / "[/x]" / "[bold]k"
    folder.mkdir(parents=True)
    return Path(shutil.copy(ROOT / "tests" / "cases" / "hostile_text.py", folder / "hostile_text.py"))


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _flat(text: str) -> str:
    """``text`` with its runs of white space one space (the console wraps long lines at word boundaries)."""
    return " ".join(text.split())


def _assert_shown_as_text(out: str, text: str = EVIL) -> None:
    """No character that acts on a terminal, no traceback; ``text`` there, escaped."""
    assert not any(ch in out for ch in ACTING), [line for line in out.splitlines() if any(c in line for c in ACTING)]
    assert "Traceback" not in out and "MarkupError" not in out and "UnicodeEncodeError" not in out
    assert _flat(printable(text)) in _flat(out), out


@pytest.mark.parametrize("mode", [(), ("--in-process",)], ids=["supervised", "in-process"])
def test_a_hostile_backend_is_shown_as_text_on_the_terminal_and_in_both_reports(tmp_path, mode):
    path = _hostile_file(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONIOENCODING="utf-8")   # strict: a surrogate would raise
    proc = subprocess.run([sys.executable, "-m", "pfa_verify.cases.cli", "run", "--backend", f"{path}:make", "--cases", CASES,
                           "--examples", "0", "--regressions", str(tmp_path / "regs"), "--json", str(tmp_path / "r.json"),
                           "--html", str(tmp_path / "r.html"), *mode], cwd=ROOT, env=env, capture_output=True,
                          timeout=600, check=False)
    out = proc.stdout.decode("utf-8") + proc.stderr.decode("utf-8")      # strict: valid UTF-8, no raw surrogate
    assert proc.returncode == 1, out
    _assert_shown_as_text(out, "hostile " + EVIL)
    _assert_shown_as_text(out, "raised " + EVIL)
    _assert_shown_as_text(out, "skip " + EVIL)
    _assert_shown_as_text(out, "note " + EVIL)
    assert "[/x]/[bold]k/hostile_text.py:make" in out                    # the path, literally
    data = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    verdict = data["summary"]["verdict"]
    assert verdict.startswith("3 cases: 0 checked on hostile ") and "1 skipped (1 unsupported), 2 errors" in verdict
    assert " -> FAILED: " in verdict and _flat(verdict) in _flat(out.split("Coverage: ")[-1])    # the last line
    assert _flat(out).count("-> OK") == _flat(out).count("\\x1b[2K-> OK") > 0     # the injected one, escaped
    if mode:      # the kernel's print reached this terminal: as text
        assert _flat("printed " + printable(PRINTED)) in _flat(out)

    assert not [s for s in _strings(data) if printable(s) != s]
    assert data["backend"]["name"] == printable("hostile " + EVIL)
    assert any(printable("raised " + EVIL) in r["message"] for r in data["results"])
    assert any(r["verdict"] == "skipped" and printable("skip " + EVIL) in r["message"] for r in data["results"])

    html = (tmp_path / "r.html").read_bytes().decode("utf-8")
    assert not any(ch in html for ch in ACTING)
    assert "&lt;b&gt;h&lt;/b&gt;" in html and "<b>h</b>" not in html
    assert printable("raised " + EVIL).replace("<", "&lt;").replace(">", "&gt;") in html


def test_cases_list_show_and_replay_show_a_case_file_s_text_as_text(tmp_path, capsys):
    folder = tmp_path / "[/x]" / "regs"
    case = Case(golden.PagedAttentionConfig(batch=1, s1=1, s2=20, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=16))
    reg = regressions.Regression.from_failure("acceptance", "hostile " + EVIL, case, {}, "message " + EVIL)
    regressions.save(reg, directory=folder)
    backend = f"{_hostile_file(tmp_path)}:make"
    commands = {"list": ["list"], "show": ["show", reg.id], "replay": ["replay", reg.id, "--backend", backend]}
    expected = {"list": ("message " + EVIL).splitlines()[0], "show": "message " + EVIL, "replay": "raised " + EVIL}
    for what, argv in commands.items():
        captured, strict = sys.stdout, io.TextIOWrapper(io.BytesIO(), encoding="utf-8")   # as a UTF-8 terminal's
        sys.stdout = strict
        try:
            status = cli.main(["cases", "--regressions", str(folder), *argv])
        finally:
            sys.stdout = captured
        strict.seek(0)
        out = strict.read() + capsys.readouterr().err
        assert status == (1 if what == "replay" else 0), (what, out)
        _assert_shown_as_text(out, expected[what])


def test_compare_shows_a_report_s_text_as_text(tmp_path, capsys):
    report = tmp_path / "a.json"
    assert cli.main(["run", "--backend", "golden", "--cases", "edge_causal_s1_3_short", "--examples", "0",
                     "--regressions", str(tmp_path / "regs"), "--json", str(report)]) == 0
    capsys.readouterr()
    data = json.loads(report.read_text())
    data["backend"]["name"] = "[/x]" + EVIL              # a report is a file: anyone may have written it
    data["results"][0]["verdict"] = "error"
    data["results"][0]["message"] = "[bold]" + EVIL
    (tmp_path / "b.json").write_text(json.dumps(data), encoding="utf-8")
    status = cli.main(["compare", str(report), str(tmp_path / "b.json"), "--html", str(tmp_path / "c.html")])
    out = capsys.readouterr().out
    assert status == 1
    _assert_shown_as_text(out)
    assert printable("[bold]" + EVIL) in out and printable("[/x]" + EVIL) in out
    html = (tmp_path / "c.html").read_text(encoding="utf-8")
    assert not any(ch in html for ch in ACTING) and "&lt;b&gt;h&lt;/b&gt;" in html
    assert report_compare.load_report(tmp_path / "b.json")["backend"]["name"] == printable("[/x]" + EVIL)


def test_a_safe_stream_escapes_what_acts_and_never_raises():
    raw = io.TextIOWrapper(io.BytesIO(), encoding="ascii")            # a terminal that knows ASCII alone
    stream = SafeStream(raw)
    assert stream.write(EVIL + " \u00a7\n") == len(EVIL) + 3
    raw.seek(0)
    assert raw.read() == printable(EVIL) + " \\xa7\n"
    quiet = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    SafeStream(quiet, escape_controls=False).write("\x1b[1mbold\x1b[0m \udcff")   # rich's own codes pass
    quiet.seek(0)
    assert quiet.read() == "\x1b[1mbold\x1b[0m \\udcff"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_colours_pass_and_nothing_else_does():
    tty = _Terminal()
    SafeStream(tty).write("\x1b[1;31mred\x1b[0m" + PRINTED)
    assert tty.getvalue() == "\x1b[1;31mred\x1b[0m" + printable(PRINTED)


def test_shown_text_is_never_markup_even_on_a_console_that_parses_it():
    console = Console(file=io.StringIO(), width=200, markup=True, color_system=None)
    console.print(shown("[/x] [bold]b[/bold] " + EVIL))
    assert console.file.getvalue() == printable("[/x] [bold]b[/bold] " + EVIL) + "\n"


def test_html_pages_make_every_value_printable_then_escape_it():
    page = html_pages.render("base.html.j2", css="<b>h</b>" + EVIL)
    assert not any(ch in page for ch in ACTING) and "\udcff" not in page
    assert printable("&lt;b&gt;h&lt;/b&gt;" + EVIL.replace("<", "&lt;").replace(">", "&gt;")) in page
    page.encode("utf-8")                                     # a lone surrogate would make this raise


def test_report_data_is_made_printable_keys_and_all():
    data = printable_data({"k\x1b": ["v\udcff", ("t\u202e", 1)], "n": None})
    assert data == {"k\\x1b": ["v\\udcff", ["t\\u202e", 1]], "n": None}


LAW_TEST = """
from pfa_verify.cases.data.catalog import load_catalog


def test_acceptance_on_one_case(check_law):
    check_law("acceptance", load_catalog()["edge_tail_tile_3_tokens"])
"""


def test_the_pytest_plugin_shows_a_kernel_s_text_as_text(suite_pytester, tmp_path):
    suite_pytester.makepyfile(test_law=LAW_TEST)
    result = suite_pytester.runpytest_subprocess("--backend", f"{_hostile_file(tmp_path)}:make", "--in-process",
                                                 "-p", "no:cacheprovider", "-p", "no:randomly")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == 1, out
    assert not any(ch in out for ch in ACTING), [line for line in out.splitlines() if any(c in line for c in ACTING)]
    assert _flat(printable("raised " + EVIL)) in _flat(out)                  # the failure's text
    assert _flat(printable("printed " + PRINTED)) in _flat(out)              # what the kernel printed, captured
    assert "[/x]/[bold]k/hostile_text.py:make" in out                       # the report header's backend

"""cases/cli/: ``pfa-verify`` and ``python -m cases.cli`` are one program; ``cases list | show |
replay | prune``; a backend that cannot start is one line and exit 2, not a traceback."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import types

import pytest
from rich.console import Console

from pfa_verify import golden
from pfa_verify.cases import cli
from pfa_verify.cases.cli import run_commands
from pfa_verify.cases.data import regressions
from pfa_verify.cases.reporting import html_report
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.rule.coverage import classify
from tests.checkout import REPO_ROOT

CASE = Case(golden.PagedAttentionConfig(batch=1, s1=1, s2=20, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=16))


def _capture(folder, backend="golden"):
    reg = regressions.Regression.from_failure("acceptance", backend, CASE, {}, "Kernel output vs golden not close")
    regressions.save(reg, directory=folder)
    return reg.id


def test_cases_subcommands(tmp_path, capsys):
    rid = _capture(tmp_path)
    assert cli.main(["cases", "--regressions", str(tmp_path), "list"]) == 0
    assert rid in capsys.readouterr().out
    assert cli.main(["cases", "--regressions", str(tmp_path), "show", rid]) == 0
    assert '"law": "acceptance"' in capsys.readouterr().out
    assert cli.main(["cases", "--regressions", str(tmp_path), "replay", rid]) == 0   # golden vs golden passes
    out = capsys.readouterr().out
    assert "PASS" in out
    # the coverage of a replay is the replayed case's (issue 30): S1 = 1, one KV head, a row of 20 tokens
    covers = out.split("(properties/rule/coverage.py): ", 1)[1].splitlines()[0].split(", ")
    assert set(covers) == set(classify(CASE.config)) and {"s1_1", "nkv_1", "two_tile_row"} <= set(covers)
    assert cli.main(["cases", "--regressions", str(tmp_path), "prune", "--dry-run"]) == 0
    assert regressions.list_ids(directory=tmp_path) == [rid]
    assert cli.main(["cases", "--regressions", str(tmp_path), "prune"]) == 0
    assert regressions.list_ids(directory=tmp_path) == [] and not list(tmp_path.glob("*.npz"))


def test_replay_of_a_failing_capture_exits_1(tmp_path, capsys):
    rid = _capture(tmp_path, backend="tests/properties/doubles.py:WritesToInputs")
    assert cli.main(["cases", "--regressions", str(tmp_path), "replay", rid]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and out.rstrip().endswith(f"Replay: pfa-verify cases --regressions {tmp_path} replay {rid}")


def test_unknown_id_is_an_error(tmp_path, capsys):
    assert cli.main(["cases", "--regressions", str(tmp_path), "show", "nope"]) == 2
    assert "no file" in capsys.readouterr().err


def _module(*argv):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "pfa_verify.cases.cli", *argv], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_python_m_cases_cli_is_the_same_program():
    result = _module("--help")
    assert result.returncode == 0
    for name in cli.SUBCOMMANDS:
        assert name in result.stdout, result.stdout
    assert set(cli.SUBCOMMANDS) == {"run", "compare", "bench", "tightness", "cases", "mutants", "conforming", "laws", "search"}


def test_a_backend_that_cannot_start_is_one_line_and_exit_2(tmp_path):
    factory = tmp_path / "never.py"
    factory.write_text("from kernels import BackendUnavailable\n"
                       "def backend(**options):\n    raise BackendUnavailable('no such device here')\n")
    result = _module("run", "--backend", f"{factory}:backend", "--cases", "edge_causal_s1_3_short",
                     "--examples", "0", "--regressions", str(tmp_path / "regs"))
    assert result.returncode == 2
    assert result.stderr.strip() == "pfa-verify: error: the backend cannot run here: no such device here"
    assert "Traceback" not in result.stdout + result.stderr


def test_a_bug_in_our_own_report_code_keeps_its_traceback(tmp_path, monkeypatch):
    """Issue 18: a TypeError inside the report or HTML code is a bug of ours, not "could not run":
    it propagates (a traceback and exit 1 from Python), never one line and exit 2."""

    def broken(run, summary=None):
        return len(run.seed)                  # TypeError: an int has no len()
    monkeypatch.setattr(html_report, "render_html", broken)
    with pytest.raises(TypeError, match="has no len"):
        cli.main(["run", "--backend", "golden", "--cases", "edge_causal_s1_3_short", "--examples", "0",
                  "--no-capture", "--html", str(tmp_path / "r.html")])


@pytest.mark.parametrize("argv, message", [
    (["run", "--backend", "gpu", "--cases", "catalog", "--examples", "0"], "name='gpu' is not a backend"),
    (["run", "--backend", "mutant:nope", "--cases", "catalog", "--examples", "0"], "mutant 'nope' is not in the catalog"),
    (["run", "--backend", "conforming:nope", "--cases", "catalog", "--examples", "0"], "conforming variant 'nope'"),
    (["run", "--backend", "no/such/file.py:f", "--cases", "catalog", "--examples", "0"], "no file 'no/such/file.py'"),
    (["run", "--backend", "golden", "--device", "0", "--cases", "catalog", "--examples", "0"],
     "applies to the npu backend only"),
    (["run", "--backend", "golden", "--cases", "no_such_case", "--examples", "0"], "unknown name(s) ['no_such_case']"),
    (["cases", "show", "nope"], "regression 'nope': no file"),
    (["search", "--laws", "nope"], "--laws: unknown law(s) ['nope']"),
    (["search", "--tasks", "0"], "--tasks 0 must be at least 1"),
    (["search", "--examples", "0"], "--examples 0 must be at least 1"),
    (["search", "--laws", ""], "--laws: none given"),
    (["run", "--backend", "tests/cases/run_doubles.py:loose_exp", "--cases", "catalog", "--examples", "0"],
     "declares a model wider than SPEC §4.1 ('loose exp'): exp_ulps=63 (F3 allows 3)"),
], ids=["backend name", "mutant name", "conforming name", "backend file", "device", "case name", "case id",
        "search law", "search tasks", "search examples", "search no law", "wider model"])
def test_usage_errors_are_one_line_and_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pfa-verify: error: ") and message in err and len(err.strip().splitlines()) == 1


def test_prune_keeps_cases_captured_on_another_backend(tmp_path, capsys):
    rid = _capture(tmp_path, backend="sim")
    assert cli.main(["cases", "--regressions", str(tmp_path), "prune", "--backend", "golden"]) == 0
    assert f"kept {rid}: captured on sim, not golden" in capsys.readouterr().out
    assert regressions.list_ids(directory=tmp_path) == [rid]


def test_oversized_case_file_is_rejected_before_anything_is_allocated(tmp_path, capsys):
    rid = _capture(tmp_path)
    path = tmp_path / f"{rid}.json"
    data = json.loads(path.read_text())
    data.update(tensors=None, tensors_sha256=None, arrays=None)
    data["case"]["config"].update(batch=4096, s2=1048576, nq=64, nkv=8, head_dim=128, block_size=128,
                                  s2_tile=128, kv_act_seqs=None, max_blocks=None, num_blocks=None)
    path.write_text(json.dumps(data))
    assert cli.main(["cases", "--regressions", str(tmp_path), "replay", rid]) == 2
    err = capsys.readouterr().err
    assert f"{rid}.json: case '{rid}' (B=4096 S1=1 S2=1048576 NQ=64 NKV=8 D=128) needs about" in err
    assert "over the limit of" in err and "--max-bytes" in err


@pytest.mark.parametrize("text", ["{", "[]", '{"format": 1}'], ids=["bad json", "not an object", "missing fields"])
def test_malformed_case_files_are_a_usage_error(tmp_path, capsys, text):
    (tmp_path / "abc.json").write_text(text)
    assert cli.main(["cases", "--regressions", str(tmp_path), "replay", "abc"]) == 2
    assert "abc.json" in capsys.readouterr().err


def test_a_kernel_that_writes_nothing_is_an_error_everywhere(tmp_path, capsys):
    backend = "tests/cases/run_doubles.py:WritesNothing"
    rid = _capture(tmp_path, backend=backend)
    assert cli.main(["cases", "--regressions", str(tmp_path), "replay", rid]) == 1
    out = capsys.readouterr().out
    assert f"ERROR: the {backend} backend raised on this case: KernelRunError: the kernel left 32 of 32" in out
    assert cli.main(["cases", "--regressions", str(tmp_path), "prune"]) == 0
    assert f"kept {rid}: the {backend} backend raised (KernelRunError" in capsys.readouterr().out
    report = tmp_path / "r.json"
    assert cli.main(["run", "--backend", backend, "--cases", "edge_causal_s1_3_short", "--examples", "0",
                     "--regressions", str(tmp_path / "regs"), "--json", str(report)]) == 1
    result = json.loads(report.read_text())["results"][0]
    assert result["verdict"] == "error" and "KernelRunError" in result["message"]


def test_run_help_lists_every_kind_of_backend(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for kind in ("auto", "golden", "sim", "npu", "pypto-gym:FILE.py[:FUNCTION]", "pypto-gym-npu:", "mutant:NAME",
                 "package.module:factory", "path/file.py:factory"):
        assert kind in text, kind


def test_pytest_backend_help_lists_pypto_gym(suite_pytester):
    result = suite_pytester.runpytest_subprocess("-p", "no:cacheprovider", "--help", timeout=120)
    text = " ".join(result.stdout.str().split())
    assert result.ret == 0 and "--backend=BACKEND" in text
    assert "pypto-gym:FILE.py[:FUNCTION]" in text and "mutant:NAME" in text


@pytest.mark.parametrize("env, directory, expected", [
    (None, None, "pfa-verify cases replay abc"),
    ("{tmp}", None, "pfa-verify cases --regressions {tmp} replay abc"),
    ("", None, "pfa-verify cases replay abc"),
    ("{tmp}", "elsewhere", "pfa-verify cases --regressions elsewhere replay abc"),
], ids=["default folder", "PFA_VERIFY_REGRESSIONS", "variable empty", "--regressions wins"])
def test_replay_line_names_the_folder_it_needs(monkeypatch, tmp_path, env, directory, expected):
    if env is None:
        monkeypatch.delenv("PFA_VERIFY_REGRESSIONS", raising=False)
    else:
        monkeypatch.setenv("PFA_VERIFY_REGRESSIONS", env.format(tmp=tmp_path))
    assert regressions.replay_command("abc", directory) == expected.format(tmp=tmp_path)


def test_progress_off_a_terminal_names_the_cases_that_do_not_pass_and_counts_the_rest(monkeypatch):
    """A log (no terminal) gets a line for each case that does not pass and a count at each quarter (of a run
    of 8 cases or more; else at its end), not a line per passing case: the table after the run lists every case."""
    out = io.StringIO()
    progress = run_commands._Progress(Console(file=out, width=100))
    progress.total = 8
    verdicts = ["pass", "pass", "fail", "pass", "pass", "error", "pass", "pass"]
    monkeypatch.setattr(run_commands, "result_rows", lambda result: [types.SimpleNamespace(verdict=result.verdict)])
    for k, verdict in enumerate(verdicts):
        item = types.SimpleNamespace(name=f"case_{k}", source="catalog")
        progress("start", item, None)
        progress("done", item, types.SimpleNamespace(verdict=verdict, seconds=0.5))
    assert out.getvalue().splitlines() == ["[2/8] done, 2 passed", "[3/8] case_2 (catalog): fail 0.5 s",
                                           "[4/8] done, 3 passed", "[6/8] case_5 (catalog): error 0.5 s",
                                           "[6/8] done, 4 passed", "[8/8] done, 6 passed"]
    out.truncate(0)
    out.seek(0)
    small = run_commands._Progress(Console(file=out, width=100))
    small.total = 3
    for k, verdict in enumerate(["pass", "fail", "pass"]):
        item = types.SimpleNamespace(name=f"case_{k}", source="generated")
        small("done", item, types.SimpleNamespace(verdict=verdict, seconds=0.5))
    assert out.getvalue().splitlines() == ["[2/3] case_1 (generated): fail 0.5 s", "[3/3] done, 2 passed"]

"""``pfa-verify laws``: every law of the backend, one verdict each, within a budget of examples and seconds."""
from __future__ import annotations

import json

import pytest

import golden
from cases import cli
from cases.running.shrink import hunt
from kernels import BackendUnavailable
from properties import law_examples
from properties.law_examples import BACKEND_LAWS

EXAMPLE = "docs/examples/my_backend.py"


class PagedOnly:
    """A kernel with no AT-12 stage: its qk_matmul_scale says so (kernels.BackendUnavailable)."""
    name = "paged-only"
    codec = None

    def paged_attention_fp8(self, **kwargs):
        return golden.paged_attention_fp8(**kwargs)

    def qk_matmul_scale(self, q, k, **kwargs):
        raise BackendUnavailable("this kernel has no AT-12 stage")


def make_paged_only() -> PagedOnly:
    return PagedOnly()


def _laws(tmp_path, capsys, *args: str) -> tuple[int, str, dict]:
    report = tmp_path / "laws.json"
    status = cli.main(["laws", *args, "--json", str(report)])
    return status, capsys.readouterr().out, json.loads(report.read_text())


def test_a_correct_backend_holds_every_law_paged_and_at12(tmp_path, capsys):
    status, out, data = _laws(tmp_path, capsys, "--backend", f"{EXAMPLE}:make_backend", "--examples", "4",
                              "--no-capture")
    rows = {r["law"]: r for r in data["law_verdicts"]}
    assert status == 0 and set(rows) == set(BACKEND_LAWS)
    assert all(r["verdict"] == "held" and r["examples"] == 4 for r in rows.values()), rows
    assert out.rstrip().endswith(f"11 laws, 11 held; 44 examples in {out.rsplit(' examples in ', 1)[1].split()[0]} s -> OK"
                                 f"\nJSON report: {tmp_path / 'laws.json'}")
    assert max(len(line) for line in out.splitlines()) <= 100


def test_a_failing_law_is_shown_shrunk_diagnosed_and_captured(tmp_path, capsys):
    regs = tmp_path / "regs"
    status, out, data = _laws(tmp_path, capsys, "--backend", f"{EXAMPLE}:make_buggy_backend", "--laws",
                              "acceptance,at12_default_scale", "--examples", "50", "--shrink-seconds", "5",
                              "--regressions", str(regs))
    rows = {r["law"]: r for r in data["law_verdicts"]}
    assert status == 1 and rows["at12_default_scale"]["verdict"] == "held"
    failed = rows["acceptance"]
    assert failed["verdict"] == "failed" and "shrunk to B=" in failed["detail"], failed
    assert "Diagnosis: v_scale_of_kv_head_n-1 [MM2 and the V scale" in failed["detail"]
    replay = failed["replay"].rsplit(" ", 1)[-1]
    assert {p.stem for p in regs.glob("*.json")} == {replay} and f"replay {replay}" in failed["detail"]
    assert "acceptance failed (shrunk by Hypothesis on the driver):" in out and "-> FAILED" in out


def test_a_law_the_backend_cannot_run_is_not_run_and_the_command_fails(tmp_path, capsys):
    status, out, data = _laws(tmp_path, capsys, "--backend", "tests/cases/test_laws_command.py:make_paged_only",
                              "--laws", "acceptance,at12_acceptance", "--examples", "3", "--no-capture")
    rows = {r["law"]: r for r in data["law_verdicts"]}
    assert status == 1 and rows["acceptance"]["verdict"] == "held"
    assert rows["at12_acceptance"] == rows["at12_acceptance"] | {"verdict": "not run", "examples": 0}
    assert "this kernel has no AT-12 stage" in rows["at12_acceptance"]["detail"]
    assert "1 held, 1 not run" in out and "--laws paged checks the paged-attention laws alone -> FAILED" in out


def test_a_kernel_that_raises_is_an_error_not_a_verdict_of_the_law(tmp_path, capsys):
    status, out, data = _laws(tmp_path, capsys, "--backend", "tests/properties/outside_defects.py:table_overrun",
                              "--laws", "acceptance", "--examples", "50", "--shrink-seconds", "0", "--no-capture")
    (row,) = data["law_verdicts"]
    assert status == 1 and row["verdict"] == "error", row
    assert "acceptance ended in an error (the kernel raised)" in out and "1 error" in out


def test_the_time_budget_cuts_a_search_says_so_and_checks_the_first_example():
    """seconds=0: the first example is checked, the next is never drawn, and the hunt says it was cut."""
    drawn = []
    found = hunt(law_examples.examples("acceptance"), drawn.append, seed=0, examples=1000, seconds=0.0)
    assert found.cut and found.examples == 1 and len(drawn) == 1 and found.error is None
    whole = hunt(law_examples.examples("at12_default_scale"), lambda _: None, seed=0, examples=5, seconds=60.0)
    assert not whole.cut and whole.examples == 5


@pytest.mark.parametrize("laws", ["no_such_law", ","])
def test_unknown_or_no_laws_are_one_line_naming_the_option(laws, capsys):
    assert cli.main(["laws", "--laws", laws, "--no-capture"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--laws" in err, err

"""``pfa-verify mutants`` (cases/measuring/mutants.py): the kill matrix's report, exit status and errors."""
from __future__ import annotations

import json

import jsonschema
import pytest

from pfa_verify.cases import cli
from pfa_verify.cases.data.collect import collect_items, generated_cases
from pfa_verify.cases.measuring import mutants as matrix
from pfa_verify.kernels import KernelRunError, get_backend
from pfa_verify.kernels.mutants import MUTANTS, get_mutant
from pfa_verify.properties.rule.acceptance import judge

# The fields issue 12 names, and what a reader of the JSON relies on.
SCHEMA = {
    "type": "object",
    "required": ["schema", "level", "examples", "baseline", "mutants", "kill_ratio", "goal", "exit_status"],
    "properties": {
        "baseline": {"type": "object", "required": ["examples", "failures"]},
        "kill_ratio": {"type": "number", "minimum": 0, "maximum": 1},
        "mutants": {"type": "array", "items": {
            "type": "object",
            "required": ["name", "level", "killed", "killing_laws", "examples_to_kill", "seconds", "counterexample"]}},
    },
}


def _mutants(tmp_path, *extra):
    report = tmp_path / "m.json"
    status = cli.main(["mutants", "--level", "golden", "--examples", "6", "--laws", "acceptance,causal_prefix",
                       "--no-catalog", "--shrink-seconds", "5", "--json", str(report), "--html", str(tmp_path / "m.html"),
                       *extra])
    return status, json.loads(report.read_text())


def test_the_report_has_the_issue_s_fields_and_a_survivor_fails_the_goal(tmp_path, capsys):
    status, data = _mutants(tmp_path, "--mutants", "causal_offset_ignored,softmax_scale_before_dequant")
    jsonschema.validate(data, SCHEMA)
    by_name = {m["name"]: m for m in data["mutants"]}
    killed, survivor = by_name["causal_offset_ignored"], by_name["softmax_scale_before_dequant"]
    assert killed["killed"] and "causal_prefix" in killed["killing_laws"] and killed["examples_to_kill"] >= 1
    config = killed["counterexample"]["config"]
    assert config["s1"] >= 2 and any(n > 0 for n in config["kv_act_seqs"])      # the shrunk case still shows it
    assert not survivor["killed"] and survivor["counterexample"] is None
    assert data["baseline"]["failures"] == [] and data["baseline"]["examples"] == 12
    assert data["kill_ratio"] == 0.5 and status == data["exit_status"] == 1    # under the golden goal of 100%
    out = capsys.readouterr().out
    assert "1/2 mutants killed (kill ratio 50%, goal 100%)" in out and out.rstrip().endswith(f"HTML report: {tmp_path / 'm.html'}")
    assert "causal_offset_ignored" in (tmp_path / "m.html").read_text()


def test_the_goal_decides_the_exit_status(tmp_path):
    status, data = _mutants(tmp_path, "--mutants", "causal_offset_ignored,softmax_scale_before_dequant", "--goal", "0.5")
    assert status == data["exit_status"] == 0


@pytest.mark.parametrize("allowed", ["softmax_scale_before_dequant", "ledger"])
def test_a_survivor_allowed_by_name_is_still_a_survivor_but_does_not_fail(tmp_path, capsys, allowed):
    """By name, or as one of the ledger's survivors of the level (properties/rule/ledger.py; tox -e mutants)."""
    status, data = _mutants(tmp_path, "--mutants", "causal_offset_ignored,softmax_scale_before_dequant",
                            "--allow-survivors", allowed)
    assert status == data["exit_status"] == 0 and data["kill_ratio"] == 0.5
    assert data["allowed_survivors"] == ["softmax_scale_before_dequant"]
    assert "survivors allowed by name: softmax_scale_before_dequant" in capsys.readouterr().out


def test_equivalent_mutants_are_listed_not_counted(tmp_path):
    status, data = _mutants(tmp_path, "--mutants", "causal_offset_ignored,p_quantized_per_tensor")
    eq = {m["name"]: m for m in data["mutants"]}["p_quantized_per_tensor"]
    assert eq["equivalent"].startswith("Every row of P") and eq["killed"] is False
    assert data["counted"] == 1 and data["kill_ratio"] == 1.0 and status == 0


def test_a_broken_row_is_an_error_not_a_survivor_or_a_kill(monkeypatch):
    real = matrix._one

    def breaks_on_one(name, **options):
        if name == "gqa_head_modulo":
            raise RuntimeError("the harness broke")
        return real(name, **options)
    monkeypatch.setattr(matrix, "_one", breaks_on_one)
    run = matrix.kill_matrix("golden", examples=2, names=["gqa_head_modulo"], laws=["acceptance"], catalog=False,
                             shrink_s=0)
    row = run.mutants[0]
    assert row.error == "RuntimeError: the harness broke" and not row.killed
    assert run.exit_status == 1 and "1 mutant(s) broke the matrix (gqa_head_modulo)" in matrix.summary_line(run)


def test_the_catalog_column_stops_at_the_first_failing_case():
    cell = matrix.catalog_kill(get_backend("mutant:causal_offset_ignored"))
    assert cell.killed and cell.law == "catalog" and cell.counterexample["config"]["s1"] >= 2


@pytest.mark.parametrize("argv, message", [
    (["--mutants", "no_such_mutant"], "unknown mutant(s) ['no_such_mutant']"),
    (["--laws", "no_such_law"], "--laws: unknown law(s) ['no_such_law']"),
])
def test_bad_names_are_one_line_and_exit_2(argv, message, capsys):
    assert cli.main(["mutants", "--no-catalog", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("argv, message", [(["--level", "npu"], "invalid choice"),
                                           (["--goal", "2"], "must be a fraction in [0, 1]")])
def test_bad_values_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["mutants", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_the_list_names_every_mutant(capsys):
    assert cli.main(["mutants", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in MUTANTS)


def test_latency_counts_the_generated_cases_before_the_first_kill_in_both_orders(tmp_path, capsys):
    """`mutants --latency` (cases/measuring/kill_latency.py): the position of each mutant's first failing
    generated case, in the run's (directed) order and the plain one; a survivor is examples + 1."""
    report = tmp_path / "latency.json"
    status = cli.main(["mutants", "--latency", "--level", "golden", "--examples", "4",
                       "--mutants", "no_max_subtraction,softmax_scale_before_dequant", "--json", str(report)])
    out = capsys.readouterr().out
    data = json.loads(report.read_text())
    assert status == 0 and "Generated cases to the first kill" in out
    rows = {r["name"]: r for r in data["rows"]}
    assert rows["softmax_scale_before_dequant"]["first"] == {"directed": None, "plain": None}   # the ledger survivor
    assert data["summary"]["directed"]["worst"] == 5 and data["summary"]["directed"]["killed"] == 1
    # The positions are the first failing cases of exactly those two orders.
    mutant = get_mutant("no_max_subtraction")
    orders = {"directed": [i.case for i in collect_items("catalog", examples=4, seed=0) if i.source == "generated"],
              "plain": generated_cases(4, 0)}
    def fails(case) -> bool:
        try:
            return not judge(mutant, case).passed
        except KernelRunError:
            return True
    for order, cases in orders.items():
        failed = [fails(case) for case in cases]
        expected = failed.index(True) + 1 if True in failed else None
        assert rows["no_max_subtraction"]["first"][order] == expected, order


def test_latency_refuses_the_matrix_s_options_in_one_line(capsys):
    assert cli.main(["mutants", "--latency", "--html", "x.html", "--no-catalog"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pfa-verify: error: --latency does not take --html, --no-catalog ") and err.count("\n") == 1

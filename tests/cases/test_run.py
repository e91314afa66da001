"""cases/running/run.py: ``pfa-verify run`` (issue 5): order, both codecs, capture, exit status, workers, skips."""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

import pfa_verify.kernels.backends as kb
from pfa_verify import golden
from pfa_verify.cases import cli
from pfa_verify.cases.data import collect, regressions
from pfa_verify.cases.data import regressions as regs
from pfa_verify.cases.data.catalog import load_catalog
from pfa_verify.cases.data.collect import Item, generated_cases
from pfa_verify.cases.running import run as runner
from pfa_verify.kernels import BackendUnavailable
from pfa_verify.kernels.backends.golden_backend import GoldenBackend
from pfa_verify.kernels.backends.sim import SimBackend
from pfa_verify.kernels.backends.sim_cost import MEMORY_CAP_BYTES, Estimate
from pfa_verify.kernels.backends.supervisor import Supervisor
from pfa_verify.properties.rule import ledger
from pfa_verify.properties.rule.case import Case

SMALL = "edge_causal_s1_3_short,edge_tail_tile_3_tokens"
PERTURB = "tests/cases/run_doubles.py:PerturbOne"
CODEC = "tests/cases/run_doubles.py:CalculatorCodec"


def _run(tmp_path, *extra, backend="golden", cases=SMALL, examples=0):
    report = tmp_path / "report.json"
    status = cli.main(["run", "--backend", backend, "--cases", cases, "--examples", str(examples),
                       "--regressions", str(tmp_path / "regs"), "--json", str(report), *extra])
    return status, json.loads(report.read_text())


def test_golden_run_passes_with_exit_0(tmp_path, capsys):
    status, data = _run(tmp_path, examples=2)
    assert status == 0
    assert [r["source"] for r in data["results"]] == ["catalog", "catalog", "generated", "generated"]
    assert {r["verdict"] for r in data["results"]} == {"pass"}
    assert data["summary"]["exit_status"] == 0 and data["summary"]["failed"] == 0
    assert "-> OK" in capsys.readouterr().out


def test_failing_backend_exits_1_captures_and_prints_the_replay(tmp_path, capsys):
    status, data = _run(tmp_path, backend=PERTURB)
    out = capsys.readouterr().out
    assert status == 1 and data["summary"]["failing_cases"] == 2
    ids = regressions.list_ids(directory=tmp_path / "regs")
    assert len(ids) == 2
    for rid in ids:
        assert f"Replay: pfa-verify cases --regressions {tmp_path / 'regs'} replay {rid}" in out
    r = data["results"][0]
    assert r["verdict"] == "fail" and r["mismatched"] == 1 and r["attribution"] == "kernel logic"
    assert r["worst_index"] == {"row": 0, "b": 0, "i": 0, "head": 1, "d": 3}
    assert r["message"].endswith(r["replay"])
    # the capture replays in the cases CLI and fails the same way
    assert cli.main(["cases", "--regressions", str(tmp_path / "regs"), "replay", ids[0]]) == 1


def test_backend_codec_gives_two_comparisons_and_only_the_codec_one_counts(tmp_path):
    status, data = _run(tmp_path, backend=CODEC, cases="edge_causal_s1_3_short")
    spec, own = data["results"]
    assert (spec["reference"], own["reference"]) == ("spec", "pypto-0.2.0-calculator")
    assert spec["verdict"] == "fail" and spec["counts"] is False and spec["attribution"] == "backend codec"
    assert own["verdict"] == "pass" and own["counts"] is True
    assert status == 0 and data["summary"]["not_counted"] == 1
    assert not regressions.list_ids(directory=tmp_path / "regs")


def test_regressions_run_first(tmp_path):
    case = Case(golden.PagedAttentionConfig(batch=1, s1=1, s2=20, nq=2, nkv=1, head_dim=16, block_size=16,
                                            s2_tile=16))
    reg = regressions.Regression.from_failure("acceptance", "golden", case, {}, "captured earlier")
    regressions.save(reg, directory=tmp_path / "regs")
    status, data = _run(tmp_path, cases=f"edge_causal_s1_3_short,{reg.id}", examples=1)
    assert [(r["name"], r["source"]) for r in data["results"]] == [
        (reg.id, "regression"), ("edge_causal_s1_3_short", "catalog"), ("generated_00", "generated")]
    assert status == 0


def test_workers_merge_into_one_report_in_order(tmp_path):
    serial_status, serial = _run(tmp_path, backend=PERTURB, examples=2)
    par_status, par = _run(tmp_path, "--workers", "2", backend=PERTURB, examples=2)
    assert serial_status == par_status == 1
    keep = ("name", "source", "reference", "verdict", "mismatched", "total", "worst_index", "replay")
    assert [{k: r[k] for k in keep} for r in par["results"]] == [{k: r[k] for k in keep} for r in serial["results"]]


def test_unknown_case_name_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["run", "--backend", "golden", "--cases", "no_such_case", "--examples", "0",
                     "--regressions", str(tmp_path)]) == 2
    assert "no_such_case" in capsys.readouterr().err


def test_the_generated_cases_alone_are_a_selection(tmp_path, capsys):
    report = tmp_path / "r.json"
    assert cli.main(["run", "--backend", "golden", "--cases", "generated", "--examples", "3", "--no-capture",
                     "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    assert [r["source"] for r in data["results"]] == ["generated"] * 3
    assert "3 cases: 0 regression, 0 catalog, 3 generated" in capsys.readouterr().out


def test_the_shipped_captures_are_replayed_beside_another_regressions_folder(tmp_path):
    shipped = regressions.shipped_ids()
    assert shipped and [i.regression for i in collect.chosen_items("regressions", regressions_dir=tmp_path)] == shipped
    assert [i.source for i in collect.chosen_items("all", regressions_dir=tmp_path)][:len(shipped)] == ["regression"] * len(shipped)
    assert collect.chosen_items("catalog", regressions_dir=tmp_path)[0].source == "catalog"


def test_generated_cases_repeat_for_a_seed():
    a = generated_cases(4, 11)
    assert len(a) == 4 and a == generated_cases(4, 11)
    kernel = {"head_dim": (128,), "block_size": (128,)}
    assert all(c.config.head_dim == 128 for c in generated_cases(2, 11, supported=kernel))
    assert all(max(c.config.lengths) > 0 for c in generated_cases(20, 0))   # never all-empty


def test_sim_backend_owns_its_limits():
    sim = SimBackend.__new__(SimBackend)     # the limits need no pypto
    sim.max_seconds, sim.memory_cap = None, MEMORY_CAP_BYTES
    cat = load_catalog()
    skip = sim.skip_reason(cat["edge_small_blocks_ragged"].config)
    assert skip.kind == "unsupported" and "head_dim=64, block_size=16" in skip.reason
    assert sim.skip_reason(cat["pfa_fp8_b16_s1_1_s2_8195_nkv_2"].config) is None        # no limit by default
    sim.max_seconds = 1
    skip = sim.skip_reason(cat["pfa_fp8_b16_s1_1_s2_8195_nkv_2"].config)
    assert skip.kind == "limit" and skip.reason.startswith("estimated about ") and "over --case-timeout 1" in skip.reason
    assert GoldenBackend().skip_reason(cat["pfa_fp8_b16_s1_1_s2_8k_nkv_1"].config) is None


def _clock_jumping_after(monkeypatch, calls: int):
    """pfa_verify.cases.running.run's time.time: the real clock for ``calls`` calls, then an hour later (a spent budget)."""
    real, seen = time.time, []

    def fake_time():
        seen.append(1)
        return real() + (3600 if len(seen) > calls else 0)
    monkeypatch.setattr(time, "time", fake_time)


def test_spent_budget_skips_the_rest_and_fails_unless_allowed(tmp_path, monkeypatch):
    _clock_jumping_after(monkeypatch, 2)   # the deadline is set, the first case starts, then time is up
    status, data = _run(tmp_path, "--budget", "60", backend="golden")
    assert [r["verdict"] for r in data["results"]] == ["pass", "skipped"]
    skipped = data["results"][1]
    assert "time budget" in skipped["message"] and skipped["counts"] is False and skipped["skip_kind"] == "budget"
    assert status == 1 and data["summary"]["skipped_by_kind"] == {"budget": 1}
    _clock_jumping_after(monkeypatch, 2)
    status, data = _run(tmp_path, "--budget", "60", "--allow-skips", "budget", backend="golden")
    assert status == 0 and data["summary"]["checked_cases"] == 1


def test_a_run_whose_allowed_skips_left_nothing_checked_still_fails(tmp_path):
    status, data = _run(tmp_path, "--allow-skips", "all", backend="tests/cases/run_doubles.py:SmallOnly",
                        cases="pfa_fp8_b2_s1_1_s2_1k")
    assert status == 1 and data["summary"]["verdict"].endswith("-> FAILED: no case was checked")


def _ledger_case(tmp_path, monkeypatch, backend: str, **finding):
    """A captured acceptance case of the two small catalog shapes, in a ledger entry of its own."""
    reg = regressions.Regression.from_failure("acceptance", backend, load_catalog()["edge_causal_s1_3_short"], {},
                                              "captured")
    regressions.save(reg, directory=tmp_path / "regs")
    monkeypatch.setattr(ledger, "LEDGER", (ledger.Finding("case", "known, SPEC §4.2", ids=(reg.id,), **finding),))
    return reg.id


def test_ledger_tolerated_failure_runs_and_is_not_counted(tmp_path, monkeypatch):
    rid = _ledger_case(tmp_path, monkeypatch, PERTURB)
    status, data = _run(tmp_path, backend=PERTURB, cases=rid, examples=0)
    r = data["results"][0]
    assert status == 0 and r["verdict"] == "fail" and r["counts"] is False
    assert "Known failure (ledger): known, SPEC §4.2" in r["message"]


def test_ledger_tolerated_case_that_passes_fails_the_run(tmp_path, monkeypatch):
    rid = _ledger_case(tmp_path, monkeypatch, "golden")
    status, data = _run(tmp_path, backend="golden", cases=rid, examples=0)
    assert status == 1 and data["results"][0]["counts"] is True
    assert data["results"][0]["message"].startswith("ledger entry no longer fails: remove it")


def test_ledger_tolerated_codec_only_difference_is_a_pass_under_the_one_rule(tmp_path, monkeypatch):
    """Only the uncounted spec comparison fails: under the one rule the case passes, so the entry is stale."""
    rid = _ledger_case(tmp_path, monkeypatch, CODEC)
    status, data = _run(tmp_path, backend=CODEC, cases=rid, examples=0)
    assert status == 1 and "ledger entry no longer fails" in data["results"][0]["message"]


def test_ledger_tolerated_case_that_was_skipped_stays_a_skip(tmp_path, monkeypatch):
    rid = _ledger_case(tmp_path, monkeypatch, "golden")
    _clock_jumping_after(monkeypatch, 1)
    status, data = _run(tmp_path, "--budget", "60", backend="golden", cases=rid, examples=0)
    r = data["results"][0]
    assert (r["verdict"], r["skip_kind"], status) == ("skipped", "budget", 1)
    assert data["summary"]["checked_cases"] == 0


def test_ledger_quarantined_case_is_not_launched(tmp_path, monkeypatch):
    rid = _ledger_case(tmp_path, monkeypatch, "golden", quarantined=True)
    status, data = _run(tmp_path, backend="golden", cases=f"{rid},edge_tail_tile_3_tokens", examples=0)
    assert (data["results"][0]["verdict"], data["results"][0]["skip_kind"], status) == ("skipped", "quarantined", 1)
    status, data = _run(tmp_path, "--allow-skips", "quarantined", backend="golden",
                        cases=f"{rid},edge_tail_tile_3_tokens", examples=0)
    assert status == 0


def test_ledger_domain_finding_covers_cases_by_their_config(tmp_path, monkeypatch):
    """A domain finding matches by a predicate over the config, whatever the case's source: quarantined,
    the catalog case it matches is not launched; tolerated, its failure is a strict xfail."""
    causal = lambda c: c.s1 == 3    # noqa: E731 - edge_causal_s1_3_short, not edge_tail_tile_3_tokens
    monkeypatch.setattr(ledger, "LEDGER", (ledger.Finding("domain", "S1 = 3, SPEC §2", match=causal, quarantined=True),))
    status, data = _run(tmp_path, backend="golden", cases="edge_causal_s1_3_short,edge_tail_tile_3_tokens")
    assert [(r["verdict"], r["skip_kind"]) for r in data["results"]] == [("skipped", "quarantined"), ("pass", None)]
    assert status == 1
    monkeypatch.setattr(ledger, "LEDGER", (ledger.Finding("domain", "S1 = 3, SPEC §2", match=causal, backends=(PERTURB,)),))
    status, data = _run(tmp_path, backend=PERTURB, cases="edge_causal_s1_3_short")
    r = data["results"][0]
    assert (status, r["verdict"], r["counts"]) == (0, "fail", False) and "Known failure (ledger): S1 = 3, SPEC §2" in r["message"]


def test_a_ledger_id_that_matches_no_file_stops_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ledger, "LEDGER", (ledger.Finding("case", "known, SPEC §4.2", ids=("0123456789",)),))
    status = cli.main(["run", "--backend", "golden", "--cases", "catalog", "--regressions", str(tmp_path / "regs")])
    err = capsys.readouterr().err
    assert status == 2 and "regression id '0123456789' matches no file in" in err and "Traceback" not in err


# --- no false green --------------------------------------------------------------------------------

def test_a_run_with_skipped_cases_fails_unless_that_kind_is_allowed(tmp_path):
    limited, two = "tests/cases/run_doubles.py:SmallOnly", "pfa_fp8_b2_s1_1_s2_1k,edge_causal_s1_3_short"
    status, data = _run(tmp_path, backend=limited, cases=two)
    s = data["summary"]
    assert status == 1 and s["checked_cases"] == 1 and s["skipped_by_kind"] == {"limit": 1}
    assert "1 case was not checked (skips of kind limit are not allowed; --allow-skips limit accepts them)" in s["verdict"]
    status, data = _run(tmp_path, "--allow-skips", "limit", backend=limited, cases=two)
    assert status == 0 and data["summary"]["allowed_skips"] == ["limit"]
    assert data["summary"]["verdict"].startswith("2 cases: 1 checked on ") and data["summary"]["verdict"].endswith("-> OK")
    status, data = _run(tmp_path, backend=limited, cases="pfa_fp8_b2_s1_1_s2_1k")
    assert status == 1 and data["summary"]["checked_cases"] == 0     # everything skipped: never a pass


def test_auto_falling_back_to_the_golden_fails_unless_allowed(tmp_path, monkeypatch):
    # In this process (--in-process), where the test can make every kernel backend unavailable.

    def unavailable(**options):
        raise BackendUnavailable("not on this machine")
    monkeypatch.setitem(kb.BUILTIN_BACKENDS, "sim", unavailable)
    monkeypatch.setattr(kb, "_sim", unavailable)
    monkeypatch.setattr(kb, "_npu", unavailable)
    status, data = _run(tmp_path, "--in-process", backend="auto", cases="edge_causal_s1_3_short")
    assert status == 1 and data["summary"]["fallback"] is True
    assert "auto fell back to the golden, so no kernel was checked" in data["summary"]["verdict"]
    status, data = _run(tmp_path, "--in-process", "--allow-fallback", backend="auto", cases="edge_causal_s1_3_short")
    assert status == 0


def test_a_worker_that_cannot_load_the_backend_leaves_its_cases_to_the_others_and_the_report_says_so(tmp_path):
    status, data = _run(tmp_path, "--workers", "2", backend="tests/cases/run_doubles.py:golden_on_worker_0_only",
                        examples=1)
    assert status == 0 and {r["verdict"] for r in data["results"]} == {"pass"}
    assert data["execution"]["refused"] == ["worker 1: no device for this worker"]


def test_a_backend_no_worker_can_load_cannot_start(tmp_path, capsys):
    status = cli.main(["run", "--backend", "tests/cases/run_doubles.py:no_device_anywhere", "--cases", SMALL,
                       "--examples", "0", "--regressions", str(tmp_path / "regs")])
    err = capsys.readouterr().err
    assert status == 2 and "no device for this worker" in err and len(err.strip().splitlines()) == 1, err


def test_an_empty_selection_checks_nothing_and_fails(tmp_path):
    status, data = _run(tmp_path, backend="golden", cases="generated", examples=0)
    assert status == 1 and "no case was selected" in data["summary"]["verdict"]


def test_no_capture_says_so_instead_of_naming_an_id(tmp_path, capsys):
    status, data = _run(tmp_path, "--no-capture", backend=PERTURB, cases="edge_causal_s1_3_short")
    assert status == 1 and not regressions.list_ids(directory=tmp_path / "regs")
    assert "Not captured (--no-capture)" in data["results"][0]["message"]
    assert " replay " not in capsys.readouterr().out


def test_a_captured_case_that_cannot_load_is_an_error_not_a_crash(tmp_path):
    (tmp_path / "regs").mkdir()
    (tmp_path / "regs" / "0badcase00.json").write_text("{not json")
    status, data = _run(tmp_path, backend="golden", cases="0badcase00,edge_causal_s1_3_short", examples=0)
    first = data["results"][0]
    assert status == 1 and (first["name"], first["verdict"]) == ("0badcase00", "error")
    assert "not valid JSON" in first["message"]


def test_a_budget_does_not_start_a_case_its_estimate_says_would_end_after_it(tmp_path):
    status, data = _run(tmp_path, "--budget", "60", backend="tests/cases/run_doubles.py:EstimatedSlow")
    assert status == 1 and {r["skip_kind"] for r in data["results"]} == {"budget"}
    assert data["results"][0]["message"].startswith("skipped: estimated about 1000 s and 0.9 GiB, over the ")
    assert data["results"][0]["message"].endswith(" s left of the run's time budget (--budget)")


def test_workers_take_regressions_first_then_the_longest_cases():
    cat = load_catalog()
    items = [Item("g", "generated", cat["pfa_fp8_b2_s1_1_s2_1k"]), Item("r", "regression", cat["edge_tail_tile_3_tokens"]),
             Item("c", "catalog", cat["pfa_fp8_b16_s1_1_s2_8195_nkv_2"])]
    backend = SimpleNamespace(estimate=lambda c: Estimate(c.batch * c.s2 / 1000, 0, 1))
    assert runner.schedule(backend, items) == [1, 2, 0]


def test_generated_failures_are_captured_once_per_signature_and_shrunk(tmp_path, capsys):
    """Issue 12: one bug over many generated cases leaves one case file per way it fails, each the
    smallest case Hypothesis' shrinker found, and every failing case's replay line points at it (issue 54:
    a catalog case that fails alike shares the file)."""
    drop = "tests/properties/doubles.py:DropLastS2Tile"
    status, data = _run(tmp_path, backend=drop, cases="edge_tail_tile_3_tokens", examples=12)
    failing = [r for r in data["results"] if r["verdict"] == "fail"]
    generated = [r for r in failing if r["source"] == "generated"]
    assert status == 1 and len(generated) >= 3
    ids = regressions.list_ids(directory=tmp_path / "regs")
    replays = {r["replay"].rsplit(" ", 1)[1] for r in failing}
    assert replays == set(ids) and len(replays) < len(generated)
    sizes = {r["name"]: r["total"] for r in failing}
    for rid in replays:
        reg = regressions.load(rid, directory=tmp_path / "regs")
        members = [r for r in failing if r["replay"].endswith(rid)]
        assert f"{len(members)} case(s) fail alike" in reg.message
        assert "shrunk by Hypothesis to B=1 " in reg.message
        config = reg.case["config"]
        assert config["batch"] * config["s1"] * config["nq"] * config["head_dim"] <= min(sizes[r["name"]] for r in members)
        with pytest.raises(AssertionError, match=f"replay {rid}"):
            regressions.replay(reg, directory=tmp_path / "regs")
    assert "shrunk by Hypothesis to B=1 " in capsys.readouterr().out


def test_comparisons_count_only_the_ones_made_and_a_skip_names_no_reference(tmp_path):
    """A skipped case makes no comparison: the summary's count leaves it out, and its row names no golden
    (reference '-'), whatever codec the backend declares."""
    status, data = _run(tmp_path, "--allow-skips", "limit", backend="tests/cases/run_doubles.py:SmallOnly",
                        cases="pfa_fp8_b2_s1_1_s2_1k,edge_causal_s1_3_short")
    rows = {r["name"]: r for r in data["results"]}
    assert rows["pfa_fp8_b2_s1_1_s2_1k"]["verdict"] == "skipped" and rows["pfa_fp8_b2_s1_1_s2_1k"]["reference"] == "-"
    assert rows["edge_causal_s1_3_short"]["verdict"] == "pass" and rows["edge_causal_s1_3_short"]["reference"] == "spec"
    assert status == 0 and data["summary"]["comparisons"] == 1
    assert "1 skipped (1 limit), 0 errors; 1 comparisons;" in data["summary"]["verdict"]


@pytest.mark.parametrize("limit, ahead", [(None, True), (1, False)], ids=["room for two", "room for one"])
def test_one_call_is_queued_ahead_unless_two_cases_would_pass_the_memory_limit(tmp_path, monkeypatch, limit, ahead):
    """The driver hands the worker its next case while it computes the last (the isolation's cost, issue 36),
    but never holds two cases whose estimates together pass the one-case limit: the calls pending at each
    hand-over say which it did."""
    pending, submit = [], Supervisor.submit

    def recorded(self, *args, **kwargs):
        pending.append(self.pending)
        return submit(self, *args, **kwargs)
    monkeypatch.setattr(Supervisor, "submit", recorded)
    if limit is not None:
        monkeypatch.setattr(runner, "memory_limit", lambda: limit)
    status, data = _run(tmp_path, examples=4)
    assert status == 0 and len(pending) == data["summary"]["comparisons"] >= 4
    assert (max(pending) >= 1) is ahead, pending


def test_a_captured_case_of_another_law_outside_the_backends_shapes_is_skipped_not_replayed(tmp_path):
    """A law replay passes the checks every kernel call passes: a shape the backend says it is not built for
    is a skip (unsupported), as for a paged case, never a replay of the kernel outside its contract."""
    paged = {r: regs.load(r).to_case() for r in regs.shipped_ids() if regs.load(r).law != "acceptance"}
    rids = [r for r, case in paged.items() if getattr(case, "config", None) is not None and case.config.head_dim != 128]
    assert rids, "the shipped captures hold a law case of another head_dim (cases/regressions/)"
    report = tmp_path / "law.json"
    status = cli.main(["run", "--backend", "tests/cases/run_doubles.py:HeadDim128Only", "--cases", rids[0],
                       "--examples", "0", "--no-capture", "--json", str(report)])
    (row,) = json.loads(report.read_text())["results"]
    assert (row["verdict"], row["skip_kind"]) == ("skipped", "unsupported") and status == 1   # a skip not allowed


def test_a_captured_case_of_another_law_names_that_law_as_its_reference(tmp_path):
    """A captured case of a law other than acceptance is checked by that law (two calls of the backend, not a
    golden under some codec): its row says so ('law NAME'), under any backend's codec."""
    (rid,) = [r for r in regs.shipped_ids() if regs.load(r).law != "acceptance"][:1]
    law = regs.load(rid).law
    report = tmp_path / "law.json"
    assert cli.main(["run", "--backend", "tests/cases/run_doubles.py:CalculatorCodec", "--cases", rid,
                     "--examples", "0", "--no-capture", "--json", str(report)]) == 0
    (row,) = json.loads(report.read_text())["results"]
    assert row["reference"] == f"law {law}" and row["verdict"] == "pass"


def test_captures_are_read_before_the_backend_starts_and_their_loss_fails_the_run(tmp_path, monkeypatch):
    """The backend's factory empties the regressions folder: the run still replays what it read before the
    backend started, and says which captures were removed while it ran (exit 1, never 0)."""
    status, _ = _run(tmp_path, backend=PERTURB)
    assert status == 1 and len(regressions.list_ids(directory=tmp_path / "regs")) == 2
    monkeypatch.setenv("PFA_VERIFY_REGRESSIONS", str(tmp_path / "regs"))
    captured = regressions.list_ids(directory=tmp_path / "regs")
    status, data = _run(tmp_path, backend="tests/kernels/hostile_kernels.py:deletes_the_captures",
                        cases=",".join(captured))
    assert regressions.list_ids(directory=tmp_path / "regs") == []          # the factory did what it says
    assert [r["source"] for r in data["results"]] == ["regression", "regression"]
    assert {r["verdict"] for r in data["results"]} == {"pass"}              # replayed: the golden passes them
    lost = data["summary"]["write_failures"]
    assert status == 1 and len(lost) == 4 and all("removed or changed while the run ran" in line for line in lost)

"""cases/data/capture_folders.py: captures belong to the user. A command captures into ./pfa-verify-regressions
of its working directory (or --regressions, $PFA_VERIFY_REGRESSIONS); the captures shipped in the package are
replayed and listed (marked), never written, marked or pruned; `cases` names its folder --regressions too."""
from __future__ import annotations

import pytest

from pfa_verify import golden
from pfa_verify.cases import cli
from pfa_verify.cases.data import regressions
from pfa_verify.cases.running import run as runner
from pfa_verify.golden.errors import UsageError
from pfa_verify.properties.rule.case import Case
from tests.checkout import REPO_ROOT

PERTURB = f"{REPO_ROOT / 'tests' / 'cases' / 'run_doubles.py'}:PerturbOne"   # absolute: the tests chdir
SMALL = "edge_causal_s1_3_short,edge_tail_tile_3_tokens"
CASE = Case(golden.PagedAttentionConfig(batch=1, s1=1, s2=20, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=16),
            seed=5)


def _package_files() -> dict:
    """{name: (size, mtime)} of the shipped captures' folder: what no command may change."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in regressions.SHIPPED.iterdir()}


@pytest.fixture
def fresh_folder(tmp_path, monkeypatch):
    """A user's empty working directory, with no $PFA_VERIFY_REGRESSIONS."""
    monkeypatch.delenv(regressions.REGRESSIONS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _passing_capture(folder) -> str:
    """A capture on the golden that passes now (prune removes it after its replays)."""
    return regressions.save(regressions.Regression.from_failure("acceptance", "golden", CASE, {}, "m"),
                            directory=folder).stem


def test_a_run_captures_into_the_working_directory_and_nothing_into_the_package(fresh_folder, capsys):
    before = _package_files()
    assert not (fresh_folder / regressions.DEFAULT_FOLDER).exists()
    status = cli.main(["run", "--backend", PERTURB, "--cases", SMALL, "--examples", "0", "--in-process"])
    out = capsys.readouterr().out
    ids = regressions.list_ids(directory=fresh_folder / "pfa-verify-regressions")
    assert status == 1 and len(ids) == 2, out
    assert all(f"Replay: pfa-verify cases replay {rid}" in out for rid in ids)
    assert _package_files() == before
    assert not set(ids) & set(regressions.shipped_ids())


def test_cases_list_shows_the_shipped_captures_marked_then_the_users(fresh_folder, capsys):
    rid = _passing_capture(fresh_folder / regressions.DEFAULT_FOLDER)
    assert cli.main(["cases", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    shipped = regressions.shipped_ids()
    assert [line.split()[0] for line in lines] == [*shipped, rid]
    assert all("[shipped]" in line for line in lines[:-1]) and "[shipped]" not in lines[-1]


def test_prune_acts_on_the_users_folder_alone(fresh_folder, capsys):
    before = _package_files()
    rid = _passing_capture(fresh_folder / regressions.DEFAULT_FOLDER)
    assert cli.main(["cases", "prune", "--replays", "1"]) == 0
    out = capsys.readouterr().out
    assert f"removed {rid}" in out and regressions.list_ids() == []
    assert not any(shipped in out for shipped in regressions.shipped_ids())
    assert _package_files() == before


@pytest.mark.parametrize("argv", [
    ["cases", "--regressions", str(regressions.SHIPPED), "prune", "--dry-run"],
    ["cases", "prune", "--regressions", str(regressions.SHIPPED)],
    ["run", "--backend", "golden", "--cases", "catalog", "--examples", "0", "--regressions", str(regressions.SHIPPED)],
    ["laws", "--laws", "acceptance", "--examples", "1", "--regressions", str(regressions.SHIPPED)],
], ids=["prune --dry-run", "prune", "run", "laws"])
def test_the_shipped_folder_is_refused_where_a_command_would_write_or_prune(argv, fresh_folder, capsys):
    before = _package_files()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pfa-verify: error: --regressions {regressions.SHIPPED}: is the folder of the captures "
                          "shipped with pfa-verify"), err
    assert _package_files() == before


def test_the_variable_naming_the_shipped_folder_is_refused_by_name(fresh_folder, monkeypatch, capsys):
    monkeypatch.setenv(regressions.REGRESSIONS_ENV, str(regressions.SHIPPED))
    assert cli.main(["cases", "prune"]) == 2
    assert f"PFA_VERIFY_REGRESSIONS={regressions.SHIPPED}: is the folder of the captures shipped" in capsys.readouterr().err


def test_run_reads_the_shipped_folder_when_it_writes_nothing(fresh_folder, capsys):
    assert cli.main(["cases", "--regressions", str(regressions.SHIPPED), "list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "[shipped]" in line]
    assert listed == regressions.shipped_ids()               # once, not once per folder


def test_the_writers_refuse_the_shipped_folder(fresh_folder):
    before = _package_files()
    reg = regressions.Regression.from_failure("acceptance", "golden", CASE, {}, "m")
    shipped = regressions.shipped_ids()
    for call in (lambda: regressions.save(reg, directory=regressions.SHIPPED),
                 lambda: regressions.remove(shipped[0], directory=regressions.SHIPPED),
                 lambda: regressions.remove_leftovers(regressions.SHIPPED, dry_run=True),
                 lambda: regressions.mark_nondeterministic(shipped[0], "seen twice")):
        with pytest.raises(UsageError, match="captures shipped with pfa-verify"):
            call()
    assert _package_files() == before


def test_a_shipped_capture_loads_by_id_from_any_folder(fresh_folder):
    rid = regressions.shipped_ids()[0]
    assert regressions.load(rid).id == rid == regressions.load(rid, directory=fresh_folder / "elsewhere").id


def test_cases_takes_regressions_and_no_longer_dir(tmp_path, capsys):
    rid = _passing_capture(tmp_path)
    assert cli.main(["cases", "--regressions", str(tmp_path), "show", rid]) == 0
    assert cli.main(["cases", "show", rid, "--regressions", str(tmp_path)]) == 0
    capsys.readouterr()
    for argv in (["cases", "--dir", str(tmp_path), "list"], ["cases", "list", "--dir", str(tmp_path)]):
        with pytest.raises(SystemExit) as stop:
            cli.main(argv)
        assert stop.value.code == 2
    assert "--dir" in capsys.readouterr().err


def test_case_timeout_is_also_the_estimate_a_run_skips_over(monkeypatch, tmp_path):
    """One per-case limit: --case-timeout ends a call that outlives it and skips a case estimated over it
    (the backend's max_seconds), so there is no second option for the second half."""
    seen = {}
    real = runner.open_backend

    def recording(name, **kwargs):
        seen.update(kwargs)
        return real(name, **kwargs)
    monkeypatch.setattr(runner, "open_backend", recording)
    assert cli.main(["run", "--backend", "golden", "--cases", "edge_causal_s1_3_short", "--examples", "0",
                     "--case-timeout", "7", "--no-capture", "--regressions", str(tmp_path)]) == 0
    assert seen["max_seconds"] == 7 and seen["case_timeout"] == 7
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "--max-seconds", "7"])

"""cases/cli.py: the subcommand registry and ``pfa-verify cases list | show | replay | prune``."""
from __future__ import annotations

import golden
from cases import cli, regressions
from properties.case import Case

CASE = Case(golden.PagedAttentionConfig(batch=1, s1=1, s2=20, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=16))


def _capture(folder, backend="golden"):
    reg = regressions.Regression.from_failure("acceptance", backend, CASE, {}, "Kernel output vs golden not close")
    regressions.save(reg, directory=folder)
    return reg.id


def test_cases_subcommands(tmp_path, capsys):
    rid = _capture(tmp_path)
    assert cli.main(["cases", "--dir", str(tmp_path), "list"]) == 0
    assert rid in capsys.readouterr().out
    assert cli.main(["cases", "--dir", str(tmp_path), "show", rid]) == 0
    assert '"law": "acceptance"' in capsys.readouterr().out
    assert cli.main(["cases", "--dir", str(tmp_path), "replay", rid]) == 0   # golden vs golden passes
    assert "PASS" in capsys.readouterr().out
    assert cli.main(["cases", "--dir", str(tmp_path), "prune", "--dry-run"]) == 0
    assert regressions.list_ids(directory=tmp_path) == [rid]
    assert cli.main(["cases", "--dir", str(tmp_path), "prune"]) == 0
    assert regressions.list_ids(directory=tmp_path) == [] and not list(tmp_path.glob("*.npz"))


def test_replay_of_a_failing_capture_exits_1(tmp_path, capsys):
    rid = _capture(tmp_path, backend="tests/properties/doubles.py:WritesToInputs")
    assert cli.main(["cases", "--dir", str(tmp_path), "replay", rid]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and out.rstrip().endswith(f"Replay: pfa-verify cases replay {rid}")


def test_unknown_id_is_an_error(tmp_path, capsys):
    assert cli.main(["cases", "--dir", str(tmp_path), "show", "nope"]) == 2
    assert "no file" in capsys.readouterr().err


def test_registry_takes_new_subcommands():
    @cli.register("hello", help="test only")
    def add(parser):
        parser.set_defaults(func=lambda args: 7)
    try:
        assert cli.main(["hello"]) == 7
    finally:
        del cli.SUBCOMMANDS["hello"]

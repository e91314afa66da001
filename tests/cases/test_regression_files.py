"""cases/regressions.py and cases/ledger.py: the capture file round trip, no pickle, bad files."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import golden
from cases import ledger, regressions
from properties.case import Case
from properties.strategies import At12Case

CASE = Case(golden.PagedAttentionConfig(batch=2, s1=2, s2=40, nq=4, nkv=2, head_dim=16, block_size=16, s2_tile=32,
                                        kv_act_seqs=(40, 3), garbage="nan"), seed=5)


@pytest.mark.parametrize("case", [CASE, At12Case(3, 17, 16, "wide", 9), np.ones((2, 3), dtype=np.float32)],
                         ids=["paged", "at12", "array"])
def test_capture_round_trip(tmp_path, case):
    reg = regressions.Regression.from_failure("acceptance", "golden", case, {"perm_seed": 3}, "boom\nReplay: x")
    regressions.save(reg, directory=tmp_path)
    back = regressions.load(reg.id, directory=tmp_path)
    assert back == reg and regressions.list_ids(directory=tmp_path) == [reg.id]
    rebuilt = back.to_case()
    if isinstance(case, Case):
        assert rebuilt.config == case.config and rebuilt.seed == case.seed
        original, replayed = case.inputs().tensors(), rebuilt.inputs().tensors()
        for name in original:  # explicit tensors come back bit for bit, fp8 and NaN included
            assert original[name].dtype == replayed[name].dtype
            assert torch.equal(original[name].view(torch.uint8) if original[name].dtype == torch.float8_e4m3fn
                               else original[name].nan_to_num(7.0),
                               replayed[name].view(torch.uint8) if replayed[name].dtype == torch.float8_e4m3fn
                               else replayed[name].nan_to_num(7.0))
    elif isinstance(case, At12Case):
        assert rebuilt == case
    else:
        assert np.array_equal(rebuilt, case)


def test_same_failure_same_id(tmp_path):
    a = regressions.Regression.from_failure("acceptance", "golden", CASE, {}, "m1")
    b = regressions.Regression.from_failure("acceptance", "golden", CASE, {}, "m2")
    assert a.id == b.id
    assert a.id != regressions.Regression.from_failure("acceptance", "sim", CASE, {}, "m1").id


def test_npz_is_loaded_without_pickle(tmp_path):
    reg = regressions.Regression.from_failure("acceptance", "golden", CASE, {}, "m")
    regressions.save(reg, directory=tmp_path)
    np.savez(tmp_path / f"{reg.id}.npz", q=np.array([object()], dtype=object))
    with pytest.raises(ValueError, match="allow_pickle"):
        regressions.load(reg.id, directory=tmp_path)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.update(extra=1), r"unknown field\(s\) \['extra'\]"),
    (lambda d: d.update(format=99), "format must be 1"),
], ids=["unknown field", "future format"])
def test_bad_regression_files_are_rejected(tmp_path, edit, match):
    reg = regressions.Regression.from_failure("acceptance", "golden", CASE, {}, "m")
    path = regressions.save(reg, directory=tmp_path)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=match):
        regressions.load(reg.id, directory=tmp_path)


def test_missing_regression_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="no file"):
        regressions.load("nope", directory=tmp_path)


def test_ledger_entries_must_cite_an_issue():
    with pytest.raises(ValueError, match="must cite a tracking issue"):
        ledger.Finding(("abc",), "flaky on the simulator")
    f = ledger.Finding(("abc",), "P flip on sim, issue 7", backends=("sim",))
    assert ledger.lookup("abc", "sim", [f]) is f and ledger.lookup("abc", "npu", [f]) is None

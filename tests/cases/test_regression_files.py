"""cases/data/regressions.py and cases/ledger.py: the capture file round trip, no pickle, bad files."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import zipfile

import numpy as np
import pytest
import torch

from pfa_verify import golden, kernels
from pfa_verify.cases.data import regressions, schemas
from pfa_verify.cases.data.catalog import load_catalog
from pfa_verify.properties.rule import ledger
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.search.strategies import At12Case

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


UNPICKLED = []


class _Tripwire:
    """Unpickling one of these records it: a loader that unpickles fails the test below."""

    def __reduce__(self):
        return (UNPICKLED.append, ("unpickled",))


def test_npz_is_loaded_without_pickle(tmp_path):
    """An .npz member holding pickled objects is refused from its header (dtype object), and never
    unpickled: the tripwire inside it would record it."""
    reg = regressions.Regression.from_failure("acceptance", "golden", CASE, {}, "m")
    path = regressions.save(reg, directory=tmp_path)
    data = json.loads(path.read_text())
    npz = tmp_path / data["tensors"]
    arrays = dict(np.load(npz))
    arrays["q"] = np.array([_Tripwire()], dtype=object)
    np.savez(npz, **arrays)
    data["tensors_sha256"] = hashlib.sha256(npz.read_bytes()).hexdigest()   # the record agrees: only the check is left
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="array 'q' has dtype object, expected uint8"):
        regressions.load(reg.id, directory=tmp_path)
    assert UNPICKLED == []


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.update(extra=1), r"unknown field\(s\) \['extra'\]"),
    (lambda d: d.pop("law"), r"missing field\(s\) \['law'\]"),
    (lambda d: d.update(format=99), r"field 'format': 99 is not one of \[1, 2, 3, 4\]"),
    (lambda d: d.update(law=["a"]), "field 'law': \\['a'\\] is not of type 'string'"),
    (lambda d: d.update(tensors=5), "field 'tensors': 5 is not of type 'string', 'null'"),
    (lambda d: d.update(message=5), "field 'message': 5 is not of type 'string'"),
    (lambda d: d["case"].update(seed=-1), "field 'case.seed': -1 is less than the minimum of 0"),
    (lambda d: d["case"].update(kind="tensor"), "field 'case.kind': 'tensor' is not one of"),
    (lambda d: d.update(law="no_such_law"), "law 'no_such_law' is not a law"),
    (lambda d: d.update(format=1, tensors=None, tensors_sha256=None, arrays=None)
     or d["case"]["config"].update(distribution="tiny"),
     "distribution 'tiny' without its tensors cannot be rebuilt"),
    (lambda d: d["case"]["config"].update(nq=3), "nq=3 must be a multiple of nkv=2"),
], ids=["unknown field", "missing field", "future format", "law not a string", "tensors not a name",
        "message not a string", "negative seed", "unknown kind", "unknown law", "format 1 tiny", "bad config"])
def test_bad_regression_files_are_rejected(tmp_path, edit, match):
    reg = regressions.Regression.from_failure("acceptance", "golden", CASE, {}, "m")
    path = regressions.save(reg, directory=tmp_path)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=match):
        regressions.load(reg.id, directory=tmp_path)


def test_a_case_file_breaking_its_schema_is_never_written(tmp_path):
    """cases/regression.schema.json is checked where files are written too: a record our own code got
    wrong (here a message that is not text) is a bug, raised before anything lands in the folder."""
    reg = dataclasses.replace(regressions.Regression.from_failure("acceptance", "golden", CASE, {}, "m"), message=5)
    with pytest.raises(RuntimeError, match=r"breaks cases/regression.schema.json: \$.message: 5 is not of type"):
        regressions.save(reg, directory=tmp_path)
    assert not list(tmp_path.iterdir())


def test_the_captured_cases_match_their_schema():
    for rid in regressions.shipped_ids():
        data = json.loads((regressions.SHIPPED / f"{rid}.json").read_text())
        assert schemas.errors(data, "regression") == [], rid


def test_missing_regression_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="no file"):
        regressions.load("nope", directory=tmp_path)


def test_ledger_entries_must_cite_where_they_are_argued():
    with pytest.raises(ValueError, match="must cite where it is argued"):
        ledger.Finding("case", "flaky on the simulator", ids=("abc",))
    f = ledger.Finding("case", "P flip on sim, SPEC §4.2", ids=("abc",), backends=("sim",))
    assert ledger.lookup("abc", "sim", [f]) is f and ledger.lookup("abc", "npu", [f]) is None


@pytest.mark.parametrize("case", [{"kind": "at12", "q_tile": -1, "k_tile": 3, "head_dim": 16, "distribution": "wide",
                                   "seed": 0},
                                  {"kind": "at12", "q_tile": "3", "k_tile": 3, "head_dim": 16, "distribution": "wide",
                                   "seed": 0},
                                  {"kind": "array", "shape": [2, 2], "values": [1.0]}],
                         ids=["at12 negative tile", "at12 string tile", "array of the wrong size"])
def test_bad_cases_of_other_kinds_are_value_errors(tmp_path, case):
    reg = regressions.Regression.from_failure("quant_round_trip", "golden", np.ones((1, 1), np.float32), {}, "m")
    path = regressions.save(reg, directory=tmp_path)
    data = json.loads(path.read_text())
    data["case"] = case
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=reg.id):
        regressions.load(reg.id, directory=tmp_path)


def test_npz_whose_header_declares_huge_arrays_is_refused_unread(tmp_path):
    """The .npy header says the shape: a member claiming 2^42 float32 (in an old record, which carries
    no sha256) is refused from its header, before any of its data is read."""
    reg = regressions.Regression.from_failure("acceptance", "golden", CASE, {}, "m")
    path = regressions.save(reg, directory=tmp_path)
    data = json.loads(path.read_text())
    data.update(format=2, tensors_sha256=None, arrays=None)
    path.write_text(json.dumps(data))
    npz = tmp_path / data["tensors"]
    with zipfile.ZipFile(npz) as z:
        members = {name: z.read(name) for name in z.namelist()}
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (2**42,)})
    members["q_scale.npy"] = header.getvalue()          # the header (with its magic) and no data
    with zipfile.ZipFile(npz, "w") as z:
        for name, body in members.items():
            z.writestr(name, body)
    with pytest.raises(ValueError, match=r"array 'q_scale' has shape \[4398046511104\], expected \[4, 4, 1\] "):
        regressions.load(reg.id, directory=tmp_path)


def test_a_law_whose_kernel_raised_is_captured_named_and_replayed(tmp_path):
    """A kernel that does not deliver (KernelRunError: an out-of-bounds read on the sim) fails the law like
    any other failure: the message names the law, the case and the backend, and the case is captured; its
    replay raises the kernel's error again (``cases replay`` and ``run`` call that an error, not a pass)."""
    backend = kernels.get_backend("tests/cases/run_doubles.py:RaisesKernelRunError")
    case = load_catalog()["edge_causal_s1_3_short"]
    with pytest.raises(AssertionError) as failed:
        regressions.check("acceptance", backend, case, directory=tmp_path)
    text = str(failed.value)
    assert text.startswith("Law acceptance: the kernel raised KernelRunError [case edge_causal_s1_3_short, "
                           "backend tests/cases/run_doubles.py:RaisesKernelRunError]")
    assert "outside its shape" in text and text.splitlines()[-1].startswith("Replay: pfa-verify cases")
    (captured,) = regressions.list_ids(directory=tmp_path)
    assert captured in text
    with pytest.raises(kernels.KernelRunError, match="outside its shape"):     # replay: an error, as run says
        regressions.replay(regressions.load(captured, directory=tmp_path), directory=tmp_path)

"""A case file is what its id says (cases/data/capture_identity.py): every field a replay uses is covered by
the id, re-derived on every read; the tolerance is the law's of this version; config and stored arrays
agree. Each tampering below is refused with its reason, by ``load``, ``cases list`` (unreadable: WHY),
``cases replay`` (one line, exit 2, nothing replayed) and ``run`` (an error verdict), and never replayed."""
from __future__ import annotations

import hashlib
import io
import json
import shutil
import zipfile

import numpy as np
import pytest
from old_records import as_old_record

from pfa_verify import golden
from pfa_verify.cases import cli
from pfa_verify.cases.data import capture_identity, regressions
from pfa_verify.properties.rule.case import Case

BUGGY = "tests/kernels/unsteady_kernels.py:make_buggy"
CASE = Case(golden.PagedAttentionConfig(batch=2, s1=2, s2=40, nq=4, nkv=2, head_dim=16, block_size=16, s2_tile=32,
                                        kv_act_seqs=(40, 3)), seed=5)
TABLED = Case(CASE.config.replace(block_table=((1, 0, 2), (3, -1, -1)), num_blocks=5), seed=5)


def _capture(folder, case=CASE):
    reg = regressions.Regression.from_failure("acceptance", BUGGY, case, {}, "Kernel output vs golden not close")
    path = regressions.save(reg, directory=folder)
    return reg, path, json.loads(path.read_text())


def _rehashed(folder, data: dict) -> str:
    """Write ``data`` as a capture that agrees with itself: the id its content hashes to (format 4), the file
    and the .npz named by it: a forged file, not a damaged one. Its id."""
    old_id = data["id"]
    rid = capture_identity.content_id(data, data["format"])
    if data.get("tensors"):
        name = capture_identity.tensors_name(data["format"], rid, data["tensors_sha256"])
        (folder / data["tensors"]).rename(folder / name)
        data["tensors"] = name
    (folder / f"{old_id}.json").unlink()
    data["id"] = rid
    (folder / f"{rid}.json").write_text(json.dumps(data))
    return rid


def _npz_edited(folder, data: dict, edit) -> None:
    """Rewrite the capture's .npz with ``edit(arrays)`` applied, and its sha256 in ``data`` to match."""
    path = folder / data["tensors"]
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    edit(arrays)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as z:
        for name, array in arrays.items():
            body = io.BytesIO()
            np.lib.format.write_array(body, array, allow_pickle=False)
            z.writestr(name + ".npy", body.getvalue())
    path.write_bytes(buffer.getvalue())
    data["tensors_sha256"] = hashlib.sha256(buffer.getvalue()).hexdigest()


def _other_law(d):
    d["law"] = "outputs_finite"          # the same tolerance as acceptance: only the id can tell


def _other_seed(d):
    d["case"]["seed"] = 6


def _other_kv_act_seqs(d):
    d["case"]["config"]["kv_act_seqs"] = [40, 5]


def _other_table(d):
    d["case"]["config"]["block_table"] = [[1, 0, 4], [3, -1, -1]]


TAMPERED = {   # name: (the case captured, edit(folder, data), rehash, the reason said)
    "law": (CASE, lambda f, d: _other_law(d), False, "its content hashes to id"),
    "backend": (CASE, lambda f, d: d.update(backend="golden"), False, "its content hashes to id"),
    "params": (CASE, lambda f, d: d.update(params={"perm_seed": 1}), False, "its content hashes to id"),
    "seed": (CASE, lambda f, d: _other_seed(d), False, "its content hashes to id"),
    "case name": (CASE, lambda f, d: d["case"].update(name="edge_causal_s1_3_short"), False, "its content hashes to id"),
    "tolerance": (CASE, lambda f, d: d["tolerance"].update(rtol=0.5), False,
                  ("captured under tolerance 'attention' (rtol 0.5, atol 0.0001), but law acceptance holds 'attention' "
                  "(rtol 0.0078125, atol 0.0001) in this version")),
    "tolerance, id rehashed": (CASE, lambda f, d: d.update(tolerance={"kind": "exact", "rtol": 0.0, "atol": 0.0}), True,
                               "captured under tolerance 'exact'"),
    "config's kv_act_seqs": (CASE, lambda f, d: _other_kv_act_seqs(d), False,
                             ("its config says kv_act_seqs [40, 5], but the stored kv_act_seqs is [40, 3]: config and "
                             "arrays disagree")),
    "config's kv_act_seqs, id rehashed": (CASE, lambda f, d: _other_kv_act_seqs(d), True,
                                          "its config says kv_act_seqs [40, 5], but the stored kv_act_seqs is [40, 3]"),
    "config's block_table, id rehashed": (TABLED, lambda f, d: _other_table(d), True,
                                          ("its config says block_table row 0 is [1, 0, 4], but the stored block_table's "
                                          "is [1, 0, 2]: config and arrays disagree")),
    "stored block_table, id rehashed": (CASE, lambda f, d: _npz_edited(f, d, lambda a: a["block_table"].fill(0)), True,
                                        "its stored block_table does not serve its config"),
    "stored kv_act_seqs, id rehashed": (CASE, lambda f, d: _npz_edited(f, d, lambda a: a["kv_act_seqs"].fill(1)), True,
                                        "but the stored kv_act_seqs is [1, 1]: config and arrays disagree"),
    "tensors and their sha256": (CASE, lambda f, d: _npz_edited(f, d, lambda a: a["q"].flat.__setitem__(0, 1)), False,
                                 "its content hashes to id"),
    "format 4 relabelled 3": (CASE, lambda f, d: d.update(format=3), False, "its content hashes to id"),
    "id": (CASE, lambda f, d: d.update(id="0123456789"), False, "records id '0123456789', not its file's name"),
}


@pytest.mark.parametrize("what", list(TAMPERED))
def test_a_tampered_case_file_is_refused_with_its_reason_and_never_replayed(tmp_path, capsys, what):
    case, edit, rehash, reason = TAMPERED[what]
    reg, path, data = _capture(tmp_path, case)
    regressions.load(reg.id, directory=tmp_path)         # as captured, it loads
    edit(tmp_path, data)
    if rehash:
        rid = _rehashed(tmp_path, data)
    else:
        rid = reg.id
        path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as refused:
        regressions.load(rid, directory=tmp_path)
    assert reason in str(refused.value) and "\n" not in str(refused.value)
    assert cli.main(["cases", "--regressions", str(tmp_path), "list"]) == 1
    assert f"{rid}  unreadable: {refused.value}" in capsys.readouterr().out.splitlines()
    assert cli.main(["cases", "--regressions", str(tmp_path), "replay", rid]) == 2      # refused before the backend starts
    out, err = capsys.readouterr()
    assert out == "" and err == f"pfa-verify: error: {refused.value}\n"


def test_the_id_covers_what_a_replay_uses_and_not_what_describes_the_capture():
    data = regressions.Regression.from_failure("acceptance", BUGGY, CASE, {}, "m").to_json()
    rid = capture_identity.content_id(data, 4)
    assert rid == data["id"]
    for field, value in [("message", "another"), ("versions", {}), ("created", "then"),
                         ("nondeterministic", {"seen": "x", "at": "y"}), ("arrays", None)]:
        assert capture_identity.content_id({**data, field: value}, 4) == rid, field
    for field, value in [("law", "outputs_finite"), ("backend", "golden"), ("params", {"a": 1}),
                         ("tolerance", {"kind": "exact", "rtol": 0.0, "atol": 0.0}), ("tensors_sha256", "0" * 64),
                         ("case", {**data["case"], "seed": 6})]:
        assert capture_identity.content_id({**data, field: value}, 4) != rid, field


def test_a_run_reports_each_tampered_case_as_an_error_and_replays_none(tmp_path):
    """``run --cases regressions``: every tampered file is an ``error`` verdict saying why; the one intact
    capture of the same buggy kernel is replayed and fails. Nothing passes."""
    folder = tmp_path / "regs"
    intact, _, _ = _capture(folder, TABLED)
    reasons = {}
    for k, what in enumerate(("law", "tolerance", "config's kv_act_seqs, id rehashed")):
        case, edit, rehash, reason = TAMPERED[what]
        sub = tmp_path / f"tampered{k}"
        reg, path, data = _capture(sub, Case(case.config, seed=10 + k))     # another id each
        edit(sub, data)
        rid = _rehashed(sub, data) if rehash else reg.id
        if not rehash:
            path.write_text(json.dumps(data))
        for name in (f"{rid}.json", data["tensors"]):
            shutil.copy(sub / name, folder / name)
        reasons[rid] = reason
    report = tmp_path / "r.json"
    assert cli.main(["run", "--backend", BUGGY, "--cases", "regressions", "--examples", "0", "--regressions",
                     str(folder), "--no-capture", "--json", str(report)]) == 1
    results = {r["name"]: r for r in json.loads(report.read_text())["results"]}
    assert results[intact.id]["verdict"] == "fail"
    for rid, reason in reasons.items():
        assert results[rid]["verdict"] == "error" and reason in results[rid]["message"], results[rid]
    assert set(results) == {intact.id, *reasons, *regressions.shipped_ids()}     # the shipped ones replay too


@pytest.mark.parametrize("edit, reason", [
    (lambda d: d.update(law="causal_prefix"), "its content hashes to id"),
    (lambda d: d["case"].update(seed=1), "its content hashes to id"),
    (lambda d: d.update(backend="sim"), "its content hashes to id"),
    (lambda d: d["tolerance"].update(atol=0.1), "captured under tolerance"),
], ids=["law", "seed", "backend", "tolerance"])
def test_a_shipped_capture_edited_is_refused(tmp_path, edit, reason):
    """The captures shipped in cases/regressions/, copied and edited: refused (their id re-derived by their
    format's rule), and each as shipped loads."""
    shipped = regressions.SHIPPED
    for path in shipped.iterdir():
        shutil.copy(path, tmp_path / path.name)
    for rid in regressions.list_ids(directory=tmp_path):
        regressions.load(rid, directory=tmp_path)
    rid = next(r for r in regressions.list_ids(directory=tmp_path)
               if json.loads((tmp_path / f"{r}.json").read_text())["case"]["kind"] == "paged")
    path = tmp_path / f"{rid}.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))
    with pytest.raises(ValueError, match=reason):
        regressions.load(rid, directory=tmp_path)


def test_a_shipped_capture_whose_npz_lost_one_bit_is_refused(tmp_path):
    shipped = regressions.SHIPPED
    rid = next(r for r in regressions.list_ids(directory=shipped)
               if json.loads((shipped / f"{r}.json").read_text())["tensors"])
    data = json.loads((shipped / f"{rid}.json").read_text())
    shutil.copy(shipped / f"{rid}.json", tmp_path / f"{rid}.json")
    blob = bytearray((shipped / data["tensors"]).read_bytes())
    blob[len(blob) // 2] ^= 1
    (tmp_path / data["tensors"]).write_bytes(bytes(blob))
    with pytest.raises(ValueError, match="records: the file was damaged or replaced"):
        regressions.load(rid, directory=tmp_path)


@pytest.mark.parametrize("fmt", [2, 3])
def test_old_formats_keep_their_own_rule_and_the_new_checks(tmp_path, fmt):
    """A record of format 2 or 3 (an older writer's) loads under its own id rule; edited, it is refused by
    that rule; and the tolerance and config/arrays checks hold it as they hold format 4."""
    _, _, data = _capture(tmp_path)
    old_id = as_old_record(tmp_path, data, fmt)
    assert regressions.load(old_id, directory=tmp_path).format == fmt
    regressions.load(old_id, directory=tmp_path)
    path = tmp_path / f"{old_id}.json"
    intact = json.loads(path.read_text())
    for edit, reason in [(_other_law, "its content hashes to id"),
                         (lambda d: d["tolerance"].update(atol=0.1), "captured under tolerance")]:
        data = json.loads(json.dumps(intact))
        edit(data)
        path.write_text(json.dumps(data))
        with pytest.raises(ValueError, match=reason):
            regressions.load(old_id, directory=tmp_path)
    data = json.loads(json.dumps(intact))
    _other_kv_act_seqs(data)
    new_id = capture_identity.content_id(data, fmt)          # forged under its format's own rule
    name = capture_identity.tensors_name(fmt, new_id, data["tensors_sha256"])
    (tmp_path / intact["tensors"]).rename(tmp_path / name)
    path.unlink()
    (tmp_path / f"{new_id}.json").write_text(json.dumps(dict(data, id=new_id, tensors=name)))
    with pytest.raises(ValueError, match=r"its config says kv_act_seqs \[40, 5\], but the stored kv_act_seqs is \[40, 3\]"):
        regressions.load(new_id, directory=tmp_path)

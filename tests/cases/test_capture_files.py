"""Reading captured cases as untrusted data (cases/data/capture_files.py, capture_tensors.py): a record or
.npz that is not a regular file, is too big, nests too deep, or whose arrays are not those its config
implies is refused in one line, by ``load`` and in ``cases list``; ``cases prune`` removes leftovers."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import json as json_module
import os
import re
import signal
import threading
import time
import zipfile

import numpy as np
import pytest
import torch
from old_records import as_old_record

from pfa_verify import golden
from pfa_verify.cases import cli
from pfa_verify.cases.data import capture_files, capture_tensors, regressions
from pfa_verify.cases.data.catalog import load_catalog
from pfa_verify.properties.rule.case import Case

CASE = Case(golden.PagedAttentionConfig(batch=2, s1=2, s2=40, nq=4, nkv=2, head_dim=16, block_size=16, s2_tile=32,
                                        kv_act_seqs=(40, 3)), seed=5)


def _saved(folder):
    reg = regressions.Regression.from_failure("acceptance", "golden", CASE, {}, "m")
    path = regressions.save(reg, directory=folder)
    return reg, path, json.loads(path.read_text())


@contextlib.contextmanager
def _deadline(seconds=10):
    """A read that hangs (a FIFO) fails the test instead of hanging the suite."""
    def expired(*_):
        raise TimeoutError(f"still reading after {seconds} s")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_expected_arrays_are_those_make_inputs_builds():
    """capture_tensors.expected derives names, dtypes and shapes from the config alone: it must be what
    golden.make_inputs returns, on every small catalog case and on explicit tables and spare blocks."""
    # small: under 2^20 values drawn (the memory estimate starts at 96 MiB, whatever the case)
    configs = [c.config for c in load_catalog().values() if golden.inputs.drawn_values(c.config) < 2**20]
    configs += [CASE.config, CASE.config.replace(num_blocks=9, max_blocks=5),
                CASE.config.replace(block_table=((1, 0, 2), (3, -1, -1)), num_blocks=5)]
    assert len(configs) > 10
    for config in configs:
        bundle = golden.make_inputs(config, 3).tensors()
        assert capture_tensors.expected(config) == capture_tensors.describe(bundle), config


def test_npz_bytes_depend_on_the_tensors_alone(monkeypatch):
    """The .npz is named by its sha256: the same tensors give the same bytes at any time of day."""
    tensors = CASE.inputs().tensors()
    monkeypatch.setattr(time, "time", lambda: 0.0)
    first = capture_tensors.npz_bytes(tensors)
    monkeypatch.setattr(time, "time", lambda: 2.0e9)
    assert capture_tensors.npz_bytes(tensors) == first
    other = dict(tensors, q_scale=tensors["q_scale"] * 2)
    assert capture_tensors.npz_bytes(other) != first


def test_a_record_names_its_npz_by_content_with_its_sha256_and_arrays(tmp_path):
    reg, path, data = _saved(tmp_path)
    digest = hashlib.sha256((tmp_path / data["tensors"]).read_bytes()).hexdigest()
    assert data["format"] == 4 and data["tensors"] == f"{reg.id}-{digest[:12]}.npz" and data["tensors_sha256"] == digest
    assert data["arrays"] == capture_tensors.expected(CASE.config) and data["arrays"][0] == {
        "name": "q", "dtype": "float8_e4m3fn", "stored_as": "uint8", "shape": [4, 4, 16]}
    assert sorted(os.listdir(tmp_path)) == sorted([path.name, data["tensors"]])


def _rewrite_npz(folder, data, edit, *, fix_sha=True):
    """Edit the .npz's members (a dict of numpy arrays) and write it back; the record's sha256 follows
    unless ``fix_sha`` is False, so that only the check under test can refuse it."""
    npz = folder / data["tensors"]
    with np.load(npz) as z:
        arrays = {k: z[k] for k in z.files}
    edit(arrays)
    np.savez(npz, **arrays)
    if fix_sha and data.get("tensors_sha256"):
        data["tensors_sha256"] = hashlib.sha256(npz.read_bytes()).hexdigest()


def _bad_marker(arrays):
    arrays["__dtype__k_cache"] = np.array("float32")


DAMAGE = {
    "record is a FIFO": (lambda f, d, p: (p.unlink(), os.mkfifo(p)), "a FIFO, not a regular file"),
    "record is a symlink": (lambda f, d, p: (os.replace(p, f / "elsewhere"), os.symlink(f / "elsewhere", p)),
                            "a symbolic link, not a regular file"),
    "npz is a FIFO": (lambda f, d, p: ((f / d["tensors"]).unlink(), os.mkfifo(f / d["tensors"])), "a FIFO"),
    "npz links to /dev/zero": (lambda f, d, p: ((f / d["tensors"]).unlink(), os.symlink("/dev/zero", f / d["tensors"])),
                               "a symbolic link"),
    "npz too big": (lambda f, d, p: os.truncate(f / d["tensors"], regressions.MAX_NPZ_BYTES + 1),
                    f"{regressions.MAX_NPZ_BYTES + 1} bytes, over the limit"),
    "record too big": (lambda f, d, p: os.truncate(p, regressions.MAX_FILE_BYTES + 1), "over the limit"),
    "record 100,000 deep": (lambda f, d, p: p.write_text("[" * 100_000 + "]" * 100_000),
                            "nested 100000 levels deep, over the limit of 64"),
    "npz missing": (lambda f, d, p: (f / d["tensors"]).unlink(), "its tensors file"),
    "array missing": (lambda f, d, p: _rewrite_npz(f, d, lambda a: a.pop("k_scale")), "missing array(s) ['k_scale']"),
    "wrong dtype": (lambda f, d, p: _rewrite_npz(f, d, lambda a: a.update(v_scale=a["v_scale"].astype(np.float64))),
                    "array 'v_scale' has dtype float64, expected float32"),
    "fp8 codes as float": (lambda f, d, p: _rewrite_npz(f, d, lambda a: a.update(q=a["q"].astype(np.float32))),
                           "array 'q' has dtype float32, expected uint8 (float8_e4m3fn codes)"),
    "wrong shape": (lambda f, d, p: _rewrite_npz(f, d, lambda a: a.update(k_cache=a["k_cache"][:, :8])),
                    "array 'k_cache' has shape [6, 8, 2, 16], expected [6, 16, 2, 16]"),
    "wrong marker": (lambda f, d, p: _rewrite_npz(f, d, _bad_marker),
                     "dtype marker of 'k_cache' is 'float32', expected 'float8_e4m3fn'"),
    "extra member": (lambda f, d, p: _rewrite_npz(f, d, lambda a: a.update(extra=np.zeros(1))), "unexpected member(s)"),
    "sha mismatch": (lambda f, d, p: _rewrite_npz(f, d, lambda a: a["q"].flat.__setitem__(0, a["q"].flat[0] ^ 1),
                                                  fix_sha=False), "records: the file was damaged or replaced"),
    "record's arrays disagree": (lambda f, d, p: d["arrays"][2]["shape"].__setitem__(0, 7),
                                 "its arrays are not those its config implies"),
    "record lists fewer arrays": (lambda f, d, p: d["arrays"].pop(),
                                  "its arrays are not those its config implies (first: 7 arrays)"),
    "tensors outside the folder": (lambda f, d, p: d.update(tensors="../x.npz"), "field 'tensors': '../x.npz' does not match"),
    "format 3 without sha256": (lambda f, d, p: d.pop("tensors_sha256"), "missing field(s) ['tensors_sha256']"),
    "old record, 1 of 16 arrays": (lambda f, d, p: (d.update(format=2, tensors_sha256=None, arrays=None),
                                                     _rewrite_npz(f, d, lambda a: [a.pop(k) for k in list(a) if k != "q"])),
                                   "missing array(s) ['q_scale', 'k_cache'"),
    "old record, truncated npz": (lambda f, d, p: (d.update(format=2, tensors_sha256=None, arrays=None),
                                                    os.truncate(f / d["tensors"], 4096)),
                                  "not a readable .npz (BadZipFile"),
    "truncated npz": (lambda f, d, p: os.truncate(f / d["tensors"], 4096), "the file was damaged or replaced"),
    "old record, wrong shape": (lambda f, d, p: (d.update(format=1, tensors_sha256=None, arrays=None),
                                                  _rewrite_npz(f, d, lambda a: a.update(q=a["q"][:2]))),
                                "array 'q' has shape [2, 4, 16], expected [4, 4, 16]"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_capture_is_refused_by_load_and_listed_unreadable(tmp_path, capsys, damage):
    edit, reason = DAMAGE[damage]
    reg, path, data = _saved(tmp_path)
    edit(tmp_path, data, path)
    if path.is_file() and not path.is_symlink() and path.stat().st_size < regressions.MAX_FILE_BYTES \
            and "deep" not in damage:
        path.write_text(json.dumps(data))              # the edits to the record's fields
    with _deadline():
        with pytest.raises(ValueError) as refused:
            regressions.load(reg.id, directory=tmp_path)
        assert reason in str(refused.value) and "\n" not in str(refused.value)
        assert cli.main(["cases", "--regressions", str(tmp_path), "list"]) == 1     # damaged evidence is a finding
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith(reg.id)] == [f"{reg.id}  unreadable: {refused.value}"]
    assert out[-1] == f"1 of {1 + len(regressions.shipped_ids())} case files unreadable"   # the shipped ones listed too


def test_an_old_record_whose_arrays_are_right_still_loads(tmp_path):
    reg, _, data = _saved(tmp_path)
    old_id = as_old_record(tmp_path, data, 2)
    assert old_id != reg.id                     # another rule, another id
    back = regressions.load(old_id, directory=tmp_path)
    for name, t in reg.explicit.items():
        assert back.explicit[name].dtype == t.dtype and torch.equal(back.explicit[name].view(torch.uint8),
                                                                    t.contiguous().view(torch.uint8))


def test_ids_that_leave_the_folder_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"regression '\.\./x': not an id"):
        regressions.load("../x", directory=tmp_path)


def test_a_deep_record_is_refused_before_json_recurses(monkeypatch):
    """The depth is counted without recursion: json.loads is never reached on a 100,000-deep text."""
    monkeypatch.setattr(json_module, "loads", lambda *a, **k: pytest.fail("json.loads reached"))
    text = ('{"a": "[[[[", "b": ' + "[" * 100_000 + "]" * 100_000 + "}").encode()
    with pytest.raises(ValueError, match="nested 100001 levels deep"):
        capture_files.parse_json(text, "deep.json")
    assert capture_files.json_depth('{"s": "[{[{", "t": [[1], {"u": []}]}') == 4


def _age(path, seconds):
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_prune_removes_leftovers_and_says_each(tmp_path, capsys):
    reg, path, data = _saved(tmp_path)
    stale = tmp_path / f".{reg.id}.json.abcd1234.tmp"
    legacy = tmp_path / "0123456789.json.tmp"                  # the fixed name of the format-2 writer, 0 bytes
    fresh = tmp_path / ".0123456789-aaaaaaaaaaaa.npz.efgh5678.tmp"
    orphan = tmp_path / "0123456789.npz"                       # a first capture killed before its record
    for leftover in (stale, legacy, fresh, orphan):
        leftover.write_bytes(b"" if leftover is legacy else b"x")
    _age(stale, 2 * regressions.STALE_TEMPORARY_SECONDS)
    _age(legacy, regressions.STALE_TEMPORARY_SECONDS + 1)
    (tmp_path / "fedcba9876.json").write_text("{")            # unreadable: its .npz may be its evidence
    kept_npz = tmp_path / "fedcba9876-0123456789ab.npz"
    kept_npz.write_bytes(b"x")
    assert cli.main(["cases", "--regressions", str(tmp_path), "list"]) == 1          # fedcba9876 is unreadable
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"1 of {2 + len(regressions.shipped_ids())} case files unreadable" and reg.summary() in out
    assert f"leftover {orphan.name}: an .npz no case file names (`pfa-verify cases prune` removes it)" in out
    assert re.search(rf"leftover {re.escape(fresh.name)}: a temporary file \d+ s old: a capture may be writing it", out)
    assert cli.main(["cases", "--regressions", str(tmp_path), "prune", "--dry-run", "--backend", "none"]) == 0
    out = capsys.readouterr().out
    for leftover in (stale, legacy, orphan):
        assert f"would remove leftover {leftover.name} (" in out and leftover.exists()
    assert cli.main(["cases", "--regressions", str(tmp_path), "prune", "--backend", "none"]) == 0
    out = capsys.readouterr().out
    assert f"removed leftover {stale.name} (a temporary file 2.0 h old: its writer is gone)" in out
    assert f"removed leftover {legacy.name} (a temporary file 60 min old: its writer is gone)" in out
    assert f"removed leftover {orphan.name} (an .npz no case file names)" in out
    # its age is whatever the machine took since it was made: the words, not the seconds, are the contract
    assert re.search(rf"kept {re.escape(fresh.name)} \(a temporary file \d+ s old: a capture may be writing it\)", out)
    assert f"kept {kept_npz.name} (may belong to fedcba9876.json, which cannot be read)" in out
    assert "0 passing case(s) and 3 leftover file(s) removed" in out
    assert sorted(os.listdir(tmp_path)) == sorted([path.name, data["tensors"], fresh.name, "fedcba9876.json",
                                                   kept_npz.name])
    assert regressions.load(reg.id, directory=tmp_path) == reg


@pytest.mark.parametrize("probe_too", [False, True], ids=["the captures refused", "the up-front probe refused too"])
def test_prune_in_a_folder_it_cannot_change_is_one_line(tmp_path, capsys, monkeypatch, probe_too):
    (tmp_path / "0123456789.npz").write_bytes(b"x")
    unlink = os.unlink
    def refuse(path, *args, **kwargs):     # in this folder only (the cache folder is probed too)
        inside, probe = str(path).startswith(str(tmp_path)), ".pfa-verify-probe-" in str(path)
        if not inside or (probe and not probe_too):
            return unlink(path, *args, **kwargs)
        raise OSError(30, "Read-only file system", str(path))
    monkeypatch.setattr(os, "unlink", refuse)
    assert cli.main(["cases", "--regressions", str(tmp_path), "prune"]) == 2
    err = capsys.readouterr().err
    if probe_too:       # cases/cli/preflight.py: a folder where files cannot be removed, before any case runs
        assert err == (f"pfa-verify: error: --regressions {tmp_path}: cannot remove files in {tmp_path} (Read-only file "
                       f"system); give --regressions another folder, or --dry-run\n")
    else:
        assert err == f"pfa-verify: error: cases prune: cannot remove files in {tmp_path}: Read-only file system\n"


def test_prune_waits_for_a_capture_between_its_npz_and_its_record(tmp_path, monkeypatch):
    """The window where a new .npz is named by no record yet: a concurrent prune must not take it for an
    orphan (the folder's lock). A capture is held in that window while prune runs beside it."""
    reg = regressions.Regression.from_failure("acceptance", "golden", CASE, {}, "m")
    real = capture_files.fsync_folder
    in_window = threading.Event()

    def slow_fsync(fd):
        if not in_window.is_set():            # the first one: just after the .npz is renamed into place
            in_window.set()
            time.sleep(0.3)
        real(fd)
    monkeypatch.setattr(capture_files, "fsync_folder", slow_fsync)
    writer = threading.Thread(target=regressions.save, args=(reg,), kwargs={"directory": tmp_path})
    writer.start()
    assert in_window.wait(5) and list(tmp_path.glob("*.npz")) and not list(tmp_path.glob("*.json"))
    started = time.monotonic()
    removed, _ = regressions.remove_leftovers(tmp_path, min_age=0)
    writer.join()
    assert time.monotonic() - started > 0.15 and removed == []
    assert regressions.load(reg.id, directory=tmp_path) == reg


def test_removing_a_case_removes_its_record_then_its_npz(tmp_path):
    reg, path, data = _saved(tmp_path)
    assert regressions.remove(reg.id, directory=tmp_path) == [path.name, data["tensors"]]
    assert os.listdir(tmp_path) == [] and regressions.remove(reg.id, directory=tmp_path) == []


def test_the_old_writer_s_npz_format_is_what_the_reader_expects():
    """The shipped captures were rewritten by this writer: the .npz members of each are the ones the
    module docstring lists, byte for byte what npz_bytes writes for the tensors that load returns."""
    for rid in regressions.shipped_ids():
        reg = regressions.load(rid, directory=regressions.SHIPPED)
        if reg.explicit:
            blob = (regressions.SHIPPED / reg.tensors).read_bytes()
            assert capture_tensors.npz_bytes(reg.explicit) == blob, rid
            assert zipfile.ZipFile(io.BytesIO(blob)).namelist()[:2] == ["q.npy", "q_scale.npy"]

"""A capture survives what can happen while it is written (SQLite-style: a fault injected at every write
step): an exception or a kill (``os._exit`` in a forked process) at each step of a first capture and of
a re-capture leaves the old capture or the new one, bit for bit, and ``cases list`` never shows a
damaged one as healthy; a failing disk or folder is one CaptureWriteError with nothing left behind; two
processes capturing into one folder never corrupt it; a really full tmpfs behaves like the injected one."""
from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import subprocess

import pytest
import torch

from pfa_verify import golden, kernels
from pfa_verify.cases import cli
from pfa_verify.cases.data import regressions
from pfa_verify.cases.data.catalog import load_catalog
from pfa_verify.properties.rule.case import Case

CASE = Case(golden.PagedAttentionConfig(batch=2, s1=2, s2=40, nq=4, nkv=2, head_dim=16, block_size=16, s2_tile=32,
                                        kv_act_seqs=(40, 3)), seed=5)
OLD = regressions.Regression.from_failure("acceptance", "golden", CASE, {}, "the old capture")
# The same id captured again: the same content (the id covers the tensors' sha256), another message.
NEW = dataclasses.replace(OLD, message="the new capture", created="2000-01-01T00:00:00+00:00")

# Every call a capture makes to the disk but reads: one step each (os.open creates the temporary files,
# and opens the folder and the old record).
STEPS = ((os, "open"), (os, "write"), (os, "fsync"), (os, "replace"), (os, "unlink"))


def _bits(reg) -> dict:
    return {name: t.contiguous().view(torch.uint8).clone() for name, t in reg.explicit.items()}


def _which(folder) -> str | None:
    """``None`` (no capture), ``"old"`` or ``"new"``: what loads, checked bit for bit; a capture that does
    not load fails here."""
    if not regressions.list_ids(directory=folder):
        return None
    back = regressions.load(OLD.id, directory=folder)
    name = {OLD.message: "old", NEW.message: "new"}[back.message]
    want = _bits(OLD if name == "old" else NEW)
    assert {k: torch.equal(v, want[k]) for k, v in _bits(back).items()} == dict.fromkeys(want, True)
    return name


def _files(folder) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir()} if folder.is_dir() else {}


def _inject(at: int | None, fault, calls: list, *, after: bool = False):
    """Patch every step to count itself and, at call ``at``, to run ``fault(step)`` before it (or, with
    ``after``, once it has been done)."""
    for module, name in STEPS:
        real = getattr(module, name)

        def step(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            if len(calls) - 1 == at and not after:
                fault(_name)
            done = _real(*args, **kwargs)
            if len(calls) - 1 == at and after:
                fault(_name)
            return done
        setattr(module, name, step)


def _restore(saved):
    for (module, name), real in zip(STEPS, saved, strict=True):
        setattr(module, name, real)


def _steps(tmp_path, first: bool) -> list:
    folder = tmp_path / "count"
    if not first:
        regressions.save(OLD, directory=folder)
    calls, saved = [], [getattr(m, n) for m, n in STEPS]
    try:
        _inject(None, None, calls)
        regressions.save(NEW, directory=folder)
    finally:
        _restore(saved)
    return calls


def _listing_is_honest(folder, capsys):
    """``cases list``: a summary line only for a capture that loads; every leftover said."""
    status = cli.main(["cases", "--regressions", str(folder), "list"])
    out = capsys.readouterr().out
    unreadable = 0
    for rid in regressions.list_ids(directory=folder):
        try:
            summary = regressions.load(rid, directory=folder).summary()
        except ValueError as exc:
            unreadable += 1
            summary = f"{rid}  unreadable: {exc}"
        assert summary in out
    assert status == (1 if unreadable else 0)
    stale, young = regressions.leftovers(folder, min_age=0)
    assert all(item.name in out for item in stale + young)


def test_each_file_is_fsynced_before_its_rename_and_the_npz_before_the_record(tmp_path, monkeypatch):
    """A kill cannot tell flushed from cached data (the page cache outlives the process); the order of
    the calls can: every temporary file fsynced before it is renamed, the folder fsynced between the
    .npz's rename and the record's (so that a power cut cannot keep the second without the first)."""
    regressions.save(OLD, directory=tmp_path)
    events, paths = [], {}
    real_open, real_fsync, real_replace = os.open, os.fsync, os.replace

    def opened(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        paths[fd] = "folder" if os.path.isdir(path) else str(path)
        return fd

    def fsync(fd):
        events.append(("fsync", paths[fd]))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src), os.path.basename(dst)))
        return real_replace(src, dst)
    monkeypatch.setattr(os, "open", opened)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    regressions.save(NEW, directory=tmp_path)
    renames = [e for e in events if e[0] == "replace"]
    assert [dst.rsplit(".", 1)[1] for _, _, dst in renames] == ["npz", "json"]
    for rename in renames:
        assert ("fsync", rename[1]) in events[:events.index(rename)]
    assert ("fsync", "folder") in events[events.index(renames[0]) + 1:events.index(renames[1])]


@pytest.mark.parametrize("first", [True, False], ids=["first capture", "re-capture"])
def test_a_kill_at_every_write_step_leaves_the_old_capture_or_the_new(tmp_path, capsys, first):
    calls = _steps(tmp_path, first)
    # a re-capture writes the same content-named .npz again: no old .npz to remove
    assert {"open", "write", "fsync", "replace"} <= set(calls) and "unlink" not in calls
    seen = set()
    for at in range(len(calls)):
        folder = tmp_path / f"kill{at}"
        if not first:
            regressions.save(OLD, directory=folder)
        pid = os.fork()
        if pid == 0:                                  # the child dies at step ``at``: no cleanup runs
            try:
                _inject(at, lambda step: os._exit(17), [])
                regressions.save(NEW, directory=folder)
            finally:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 17, f"step {at} ({calls[at]}) was not reached"
        state = _which(folder)
        assert state in ((None, "new") if first else ("old", "new")), (at, calls[at], state)
        seen.add(state)
        _listing_is_honest(folder, capsys)
        regressions.remove_leftovers(folder, min_age=0)           # what prune does with them
        assert _which(folder) == state
        named = {f"{OLD.id}.json", regressions.load(OLD.id, directory=folder).tensors} if state else set()
        assert set(_files(folder)) == named, (at, calls[at])
    assert seen == ({None, "new"} if first else {"old", "new"})    # the commit point lies between the steps


@pytest.mark.parametrize("first", [True, False], ids=["first capture", "re-capture"])
@pytest.mark.parametrize("fault, after", [(OSError(errno.EIO, "Input/output error"), False), (KeyboardInterrupt(), False),
                                          (KeyboardInterrupt(), True)], ids=["EIO", "Ctrl-C", "Ctrl-C after the step"])
def test_an_error_at_every_write_step_leaves_nothing_behind(tmp_path, capsys, first, fault, after):
    calls = _steps(tmp_path, first)
    for at in range(len(calls)):
        folder = tmp_path / f"fail{at}"
        if not first:
            regressions.save(OLD, directory=folder)
        before = _files(folder)
        saved = [getattr(m, n) for m, n in STEPS]

        def raise_fault(step):
            raise fault
        try:
            _inject(at, raise_fault, [], after=after)
            try:
                regressions.save(NEW, directory=folder)
                raised = None
            except (regressions.CaptureWriteError, KeyboardInterrupt) as exc:
                raised = exc
        finally:
            _restore(saved)
        state = _which(folder)
        if state == "new":     # the fault came after the commit: housekeeping, never a failed capture
            assert raised is None or isinstance(raised, KeyboardInterrupt), (at, calls[at])
        else:
            assert isinstance(raised, regressions.CaptureWriteError if isinstance(fault, OSError) else KeyboardInterrupt)
            assert _files(folder) == before, (at, calls[at])           # nothing left behind, the old one intact
            if isinstance(raised, OSError):
                assert str(raised) == (f"cannot write the captured case {folder / f'{OLD.id}.json'}: "
                                       "Input/output error (EIO)")
        _listing_is_honest(folder, capsys)


@pytest.mark.parametrize("where, code", [((os, "write"), errno.ENOSPC), ((os, "open"), errno.EACCES),
                                         ((os, "replace"), errno.EROFS)], ids=["ENOSPC", "EACCES", "EROFS"])
def test_a_refused_write_is_one_line_naming_the_path_and_the_error(tmp_path, monkeypatch, where, code):
    regressions.save(OLD, directory=tmp_path)
    before = _files(tmp_path)

    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(*where, refuse)
    with pytest.raises(regressions.CaptureWriteError) as failed:
        regressions.save(NEW, directory=tmp_path)
    monkeypatch.undo()
    assert str(failed.value) == (f"cannot write the captured case {tmp_path / f'{OLD.id}.json'}: "
                                 f"{os.strerror(code)} ({errno.errorcode[code]})")
    assert failed.value.errno == code and failed.value.__cause__ is None and failed.value.__suppress_context__
    assert _files(tmp_path) == before and _which(tmp_path) == "old"


def test_a_folder_that_is_a_file_is_a_capture_write_error(tmp_path):
    (tmp_path / "regs").write_text("not a folder")
    with pytest.raises(regressions.CaptureWriteError, match=r"regs/\w+\.json: Not a directory \(ENOTDIR\)$"):
        regressions.save(OLD, directory=tmp_path / "regs")
    with pytest.raises(regressions.CaptureWriteError, match=r"Not a directory \(ENOTDIR\)"):
        regressions.save(OLD, directory=tmp_path / "regs" / "below")
    assert os.listdir(tmp_path) == ["regs"]


def test_processes_capturing_into_one_folder_at_once(tmp_path):
    """Three writers, each re-capturing one shared id with alternating tensors and capturing an id of its
    own, while this process reads the shared id the whole time: every read is one of the two captures."""
    own = [regressions.Regression.from_failure("acceptance", "golden", dataclasses.replace(CASE, seed=s), {}, f"own {s}")
           for s in (11, 12, 13)]
    children = []
    for k in range(3):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for i in range(20):
                    regressions.save((OLD, NEW)[(i + k) % 2], directory=tmp_path)
                regressions.save(own[k], directory=tmp_path)
                code = 0
            except regressions.CaptureWriteError:
                code = 2                                    # a clean loss (the lock waited too long)
            finally:
                os._exit(code)
        children.append(pid)
    reads, codes = 0, {}
    while len(codes) < len(children):
        for pid in children:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        if (tmp_path / f"{OLD.id}.json").exists():
            assert _which(tmp_path) in ("old", "new")
            reads += 1
    codes = list(codes.values())
    assert reads > 0 and all(c in (0, 2) for c in codes)
    assert _which(tmp_path) in ("old", "new")
    for reg in own:
        assert regressions.load(reg.id, directory=tmp_path) == reg
    assert regressions.leftovers(tmp_path, min_age=0) == ([], [])
    assert len(list(tmp_path.glob("*.npz"))) == 4


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 64 KiB tmpfs (root only: skipped, with the reason, where mounting is not permitted)."""
    mount = shutil.which("mount")
    if mount is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root and mount(8): a full folder is covered by the ENOSPC test above")
    folder = tmp_path / "small"
    folder.mkdir()
    done = subprocess.run([mount, "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here ({done.stderr.strip()}): the ENOSPC test above covers it")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_really_full_folder(small_tmpfs):
    regressions.save(OLD, directory=small_tmpfs)
    filler = small_tmpfs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (4096, 1):                 # whole pages, then the last bytes: the folder is full
            with pytest.raises(OSError) as full:
                while True:
                    os.write(fd, b"\0" * size)
            assert full.value.errno == errno.ENOSPC
    finally:
        os.close(fd)
    before = _files(small_tmpfs)
    with pytest.raises(regressions.CaptureWriteError, match=r"No space left on device \(ENOSPC\)$"):
        regressions.save(NEW, directory=small_tmpfs)
    assert _files(small_tmpfs) == before and _which(small_tmpfs) == "old"
    filler.unlink()
    regressions.save(NEW, directory=small_tmpfs)
    assert _which(small_tmpfs) == "new" and len(list(small_tmpfs.glob("*.npz"))) == 1


def test_a_law_failure_whose_capture_cannot_be_written_still_fails_and_says_so(tmp_path):
    """regressions.check: the law's failure is raised as always; its last line says why it was not
    captured (one line), instead of a CaptureWriteError hiding the failure."""
    (tmp_path / "regs").write_text("a file where the folder should be")
    backend = kernels.get_backend("tests/cases/run_doubles.py:RaisesKernelRunError")
    with pytest.raises(AssertionError) as failed:
        regressions.check("acceptance", backend, load_catalog()["edge_causal_s1_3_short"], directory=tmp_path / "regs")
    assert str(failed.value).startswith("Law acceptance: the kernel raised KernelRunError")
    assert str(failed.value).splitlines()[-1].startswith(f"Not captured: cannot write the captured case {tmp_path}/regs/")
    assert str(failed.value).endswith(": Not a directory (ENOTDIR)")

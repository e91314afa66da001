"""cases/cli/preflight.py and the bounds of the count options: what a command needs from outside (its
PFA_VERIFY_* variables, its report files, its regressions folder) is checked before its first case, and a
problem is one line on stderr, exit 2, no traceback, nothing run and nothing written.

The read-only folder is a tmpfs mounted read-only where this process may mount (root: chmod does not stop
root), a chmod 0o555 folder where it is not root; a path under a regular file is the other unwritable
place, everywhere. The full filesystem is a 64 kB tmpfs filled up where mounting is permitted, else a
folder whose os.statvfs is patched to report no free block.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pfa_verify.cases import cli
from pfa_verify.cases.cli import arguments
from pfa_verify.cases.measuring import tightness
from pfa_verify.golden.errors import UsageError
from pfa_verify.properties.search import strategies
from tests.checkout import REPO_ROOT

RUN = ["run", "--backend", "golden", "--cases", "edge_causal_s1_3_short", "--examples", "0"]
SEARCH = ["search", "--backend", "golden", "--laws", "acceptance", "--examples", "1", "--tasks", "1"]
MATRIX = ["--examples", "1", "--laws", "acceptance", "--no-catalog", "--shrink-seconds", "0"]
MUTANTS = ["mutants", "--level", "golden", "--mutants", "causal_offset_ignored", *MATRIX]
CONFORMING = ["conforming", "--mutants", "forward", *MATRIX]

# (command, environment, the start of the one line after "pfa-verify: error: "). Placeholders: {tmp} a
# fresh folder, {file} a regular file in it, {ro} a folder on a read-only filesystem (holding old.json, a
# report of an earlier run), {full} a folder on a full filesystem.
BAD_INPUTS = {
    "MAX_LEN junk": (RUN, {"PFA_VERIFY_MAX_LEN": "junk"}, "PFA_VERIFY_MAX_LEN='junk': expected a whole number"),
    "MAX_LEN 0": (RUN, {"PFA_VERIFY_MAX_LEN": "0"}, "PFA_VERIFY_MAX_LEN='0': expected a whole number"),
    "MAX_LEN too long": (RUN, {"PFA_VERIFY_MAX_LEN": "131073"}, "PFA_VERIFY_MAX_LEN='131073': expected"),
    "MAX_BYTES junk": (RUN, {"PFA_VERIFY_MAX_BYTES": "junk"}, "PFA_VERIFY_MAX_BYTES='junk': expected a number"),
    "MAX_BYTES inf": (RUN, {"PFA_VERIFY_MAX_BYTES": "inf"}, "PFA_VERIFY_MAX_BYTES='inf': expected a number"),
    "MAX_BYTES 0": (RUN, {"PFA_VERIFY_MAX_BYTES": "0"}, "PFA_VERIFY_MAX_BYTES='0': expected a positive"),
    "CACHE a file": (RUN, {"PFA_VERIFY_CACHE": "{file}"}, "PFA_VERIFY_CACHE={file}: is a file, not a folder"),
    "CACHE under a file": (RUN, {"PFA_VERIFY_CACHE": "{file}/cache"}, "PFA_VERIFY_CACHE={file}/cache: {file} is a file"),
    "CACHE /proc": (RUN, {"PFA_VERIFY_CACHE": "/proc/x"}, "PFA_VERIFY_CACHE=/proc/x: /proc is a pseudo filesystem"),
    "CACHE read-only": (RUN, {"PFA_VERIFY_CACHE": "{ro}/cache"}, "PFA_VERIFY_CACHE={ro}/cache: cannot write in {ro}"),
    "REGRESSIONS /proc": (RUN, {"PFA_VERIFY_REGRESSIONS": "/proc/x"}, "PFA_VERIFY_REGRESSIONS=/proc/x: /proc is"),
    "REGRESSIONS a file": (RUN, {"PFA_VERIFY_REGRESSIONS": "{file}"}, "PFA_VERIFY_REGRESSIONS={file}: is a file"),
    "run --json folder": ([*RUN, "--json", "{tmp}"], {}, "--json {tmp}: is a folder, not a file"),
    "run --json /proc": ([*RUN, "--json", "/proc/x/y"], {}, "--json /proc/x/y: /proc is a pseudo filesystem"),
    "run --html /sys": ([*RUN, "--html", "/sys/x.html"], {}, "--html /sys/x.html: /sys is a pseudo filesystem"),
    "run --json /dev/full": ([*RUN, "--json", "/dev/full"], {}, "--json /dev/full: /dev is a pseudo filesystem"),
    "run --json under a file": ([*RUN, "--json", "{file}/r.json"], {}, "--json {file}/r.json: {file} is a file"),
    "run --json read-only": ([*RUN, "--json", "{ro}/r.json"], {}, "--json {ro}/r.json: cannot write in {ro}"),
    "run --json read-only, an old report": ([*RUN, "--json", "{ro}/old.json"], {},
                                             "--json {ro}/old.json: cannot be written ("),
    "run --html read-only, new folder": ([*RUN, "--html", "{ro}/new/r.html"], {}, "--html {ro}/new/r.html: cannot write in {ro}"),
    "run --json full": ([*RUN, "--json", "{full}/r.json"], {}, "--json {full}/r.json: the filesystem of {full} has"),
    "run --regressions a file": ([*RUN, "--regressions", "{file}"], {}, "--regressions {file}: is a file"),
    "run --regressions under a file": ([*RUN, "--regressions", "{file}/regs"], {}, "--regressions {file}/regs: {file} is"),
    "run --regressions /proc": ([*RUN, "--regressions", "/proc/x"], {}, "--regressions /proc/x: /proc is"),
    "run --regressions read-only": ([*RUN, "--regressions", "{ro}/regs"], {}, "--regressions {ro}/regs: cannot write"),
    "run --regressions full": ([*RUN, "--regressions", "{full}"], {}, "--regressions {full}: the filesystem of {full}"),
    "search --json folder": ([*SEARCH, "--json", "{tmp}"], {}, "--json {tmp}: is a folder"),
    "search --regressions read-only": ([*SEARCH, "--regressions", "{ro}"], {}, "--regressions {ro}: cannot write"),
    "search MAX_LEN junk": (SEARCH, {"PFA_VERIFY_MAX_LEN": "x"}, "PFA_VERIFY_MAX_LEN='x': expected"),
    "mutants --json folder": ([*MUTANTS, "--json", "{tmp}"], {}, "--json {tmp}: is a folder"),
    "mutants --html /proc": ([*MUTANTS, "--html", "/proc/x.html"], {}, "--html /proc/x.html: /proc is"),
    "mutants --latency --json full": ([*MUTANTS[:5], "--latency", "--examples", "1", "--json", "{full}/l.json"], {},
                                      "--json {full}/l.json: the filesystem"),
    "conforming --json read-only": ([*CONFORMING, "--json", "{ro}/c.json"], {}, "--json {ro}/c.json: cannot write"),
    "bench --json folder": (["bench", "--workload", "small", "--small-cases", "1", "--repeat", "1", "--json", "{tmp}"],
                            {}, "--json {tmp}: is a folder"),
    "compare --html folder": (["compare", "{tmp}/a.json", "{tmp}/b.json", "--html", "{tmp}"], {},
                              "--html {tmp}: is a folder"),
    "cases list --regressions a file": (["cases", "--regressions", "{file}", "list"], {}, "--regressions {file}: is a file"),
    "cases show --regressions /proc": (["cases", "--regressions", "/proc/x", "show", "abc"], {},
                                       "--regressions /proc/x: /proc is"),
    "cases replay --regressions a file": (["cases", "--regressions", "{file}", "replay", "abc"], {}, "--regressions {file}: is a file"),
    "cases prune --regressions read-only": (["cases", "--regressions", "{ro}", "prune"], {}, "--regressions {ro}: cannot write in {ro}"),
    "cases list REGRESSIONS /proc": (["cases", "list"], {"PFA_VERIFY_REGRESSIONS": "/proc/x"},
                                     "PFA_VERIFY_REGRESSIONS=/proc/x: /proc is"),
}


def _mount(*argv: str) -> bool:
    """Mount as asked where this process may (root, and a mount that is permitted here)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", *argv], capture_output=True, timeout=30, check=False).returncode == 0


@pytest.fixture
def read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    if _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)):
        (folder / "old.json").write_text("{}\n")              # a report of an earlier run
        remounted = _mount("-o", "remount,ro", str(folder))
        if remounted:
            yield folder
        subprocess.run(["umount", "-l", str(folder)], check=False, timeout=30)
        assert remounted, "a tmpfs mounted here could not be remounted read-only"
    elif os.geteuid() != 0:
        (folder / "old.json").write_text("{}\n")
        (folder / "old.json").chmod(0o444)
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
    else:
        pytest.skip("root without permission to mount: chmod does not stop root and no read-only filesystem "
                    "can be made (the paths under a file are the unwritable places checked here)")


@pytest.fixture
def full_folder(tmp_path, monkeypatch):
    folder = tmp_path / "full"
    folder.mkdir()
    if _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)):
        with open(folder / "filler", "wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(b"\0" * 4096)
            except OSError:
                pass
        assert os.statvfs(folder).f_bavail == 0
        yield folder
        subprocess.run(["umount", "-l", str(folder)], check=False, timeout=30)
    else:
        real = os.statvfs

        def no_free_block(path):
            got = real(path)
            if Path(path).resolve() != folder.resolve():
                return got
            return os.statvfs_result((got.f_bsize, got.f_frsize, got.f_blocks, 0, 0, got.f_files, got.f_ffree,
                                      got.f_favail, got.f_flag, got.f_namemax))
        monkeypatch.setattr(os, "statvfs", no_free_block)
        yield folder


def _tree(root: Path) -> set:
    return {(str(p), p.stat().st_size) for p in root.rglob("*")}


@pytest.mark.parametrize("argv, env, message", list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
def test_a_bad_input_is_one_line_and_exit_2_before_anything_runs(argv, env, message, tmp_path, monkeypatch, capsys,
                                                                   request):
    places = {"tmp": tmp_path, "file": tmp_path / "a-file"}
    places["file"].write_text("not a folder\n")
    given = " ".join([*argv, *env.values()])
    if "{ro}" in given:
        places["ro"] = request.getfixturevalue("read_only_folder")
    if "{full}" in given:
        places["full"] = request.getfixturevalue("full_folder")
    regressions = tmp_path / "regs"          # where a run or a search would capture, unless the case says
    monkeypatch.setenv("PFA_VERIFY_REGRESSIONS", str(regressions))
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(**places))
    before = _tree(tmp_path)
    status = cli.main([a.format(**places) for a in argv])   # a traceback would raise here
    out, err = capsys.readouterr()
    assert status == 2, (out, err)
    assert err.splitlines() == [err.strip()] and err.startswith("pfa-verify: error: " + message.format(**places)), err
    assert "Traceback" not in out + err
    assert out == ""                                   # no case announced, none run, no report line
    assert _tree(tmp_path) == before and not regressions.exists()   # nothing captured, no report written


def test_tightness_record_checks_the_recorded_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tightness, "RECORDED", tmp_path)
    assert cli.main(["tightness", "--record"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == (f"pfa-verify: error: --record {tmp_path}: is a folder, not a file; give a file "
                                         f"path in it, such as --record {tmp_path}/report.json")


def test_a_bad_max_len_neither_breaks_the_import_nor_the_command():
    """PFA_VERIFY_MAX_LEN was parsed at the import of properties/search/strategies.py: a bad value was a ValueError
    traceback out of any import of the suite. It is read when a strategy is built, and checked first."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PFA_VERIFY_MAX_LEN="junk")
    imported = subprocess.run([sys.executable, "-c", "import pfa_verify.properties.search.strategies"], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
    assert imported.returncode == 0 and imported.stderr == "", imported.stderr
    ran = subprocess.run([sys.executable, "-m", "pfa_verify.cases.cli", *RUN, "--no-capture"], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 2 and ran.stdout == "", ran.stdout
    assert ran.stderr.splitlines() == [("pfa-verify: error: PFA_VERIFY_MAX_LEN='junk': expected a whole number of "
                                       "tokens from 1 to 131072 (default 640)")], ran.stderr


def test_max_len_is_read_when_a_strategy_is_built(monkeypatch):
    monkeypatch.setenv("PFA_VERIFY_MAX_LEN", "64")
    assert strategies.max_len() == 64
    monkeypatch.setenv("PFA_VERIFY_MAX_LEN", "6.4")
    with pytest.raises(UsageError, match=r"^PFA_VERIFY_MAX_LEN='6.4': expected a whole number"):
        strategies.kv_act_seqs(1, block_size=16, s2_tile=16)
    monkeypatch.delenv("PFA_VERIFY_MAX_LEN")
    assert strategies.max_len() == 640


# (command, the option over its bound, the bound): argparse's usage error names the option and the bound.
BOUNDS = [
    (RUN, "--examples", arguments.RUN_EXAMPLES),
    (RUN, "--workers", arguments.worker_bound()),
    (RUN, "--budget", arguments.RUN_SECONDS),
    (RUN, "--case-timeout", arguments.RUN_SECONDS),
    (RUN, "--shrink-seconds", arguments.SHRINK_SECONDS),
    (SEARCH, "--examples", arguments.SEARCH_EXAMPLES),
    (SEARCH, "--tasks", arguments.SEARCH_TASKS),
    (SEARCH, "--workers", arguments.worker_bound()),
    (SEARCH, "--shrink-seconds", arguments.SHRINK_SECONDS),
    (MUTANTS, "--examples", arguments.MATRIX_EXAMPLES),
    (MUTANTS, "--workers", arguments.worker_bound()),
    (MUTANTS, "--shrink-seconds", arguments.SHRINK_SECONDS),
    (CONFORMING, "--examples", arguments.MATRIX_EXAMPLES),
    (["bench"], "--repeat", arguments.BENCH_REPEATS),
    (["bench"], "--small-cases", arguments.BENCH_CASES),
    (["bench"], "--kernel-cases", arguments.BENCH_CASES),
    (["tightness"], "--examples", arguments.TIGHTNESS_CASES),
]


@pytest.mark.parametrize("argv, option, bound", BOUNDS, ids=[f"{a[0]} {o}" for a, o, _ in BOUNDS])
def test_a_count_over_its_bound_is_a_usage_error(argv, option, bound, capsys):
    """Parsed only (what cli.main does first): a bound that stopped holding fails here instead of running
    the command with it."""
    assert getattr(cli.build_parser().parse_args([*argv, option, str(bound)]), option[2:].replace("-", "_")) == bound
    with pytest.raises(SystemExit) as stop:
        cli.build_parser().parse_args([*argv, option, str(bound + 1)])
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and out == "" and "Traceback" not in err
    assert err.splitlines()[-1] == (f"pfa-verify {argv[0]}: error: argument {option}: '{bound + 1}' is over the bound: "
                                    f"at most {bound:,}"), err


@pytest.mark.parametrize("cpus, bound", [(1, 4), (2, 8), (16, 64), (64, 256), (192, 256)])
def test_the_worker_bound_is_four_per_cpu_and_256_at_most(cpus, bound, monkeypatch, capsys):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    assert arguments.worker_bound() == bound
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert f"at most 4 per CPU and 256: {bound} here" in " ".join(capsys.readouterr().out.split())

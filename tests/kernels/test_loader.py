"""kernels/backends/loader.py: the one loader of backend files, PyPTO-Gym kernel files and modules, and
the kernel mutants' copies (issue 18 item 1). A file whose code raises is the same one-line ValueError
every time it is loaded (never a traceback, never "has no callable" on the second try), and the
command line turns it into exit 2."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from pfa_verify import kernels
from pfa_verify.cases import cli
from pfa_verify.cases.measuring import mutants as matrix
from pfa_verify.kernels import mutants
from pfa_verify.kernels.backends.guarded import GuardedBackend
from pfa_verify.kernels.backends.loader import import_named_module, load_file_module
from pfa_verify.kernels.backends.upstream import load_kernel
from pfa_verify.kernels.mutants import kernel_level
from tests.checkout import REPO_ROOT

RAISES = 'raise RuntimeError("boom at import")\n\n\ndef f():\n    return None\n'


def _run(backend: str) -> list:
    return ["run", "--backend", backend, "--cases", "catalog", "--examples", "0", "--no-capture"]


def test_a_backend_file_that_raises_at_import_is_one_line_and_exit_2_every_time(tmp_path, capsys):
    bad = tmp_path / "bad_backend.py"
    bad.write_text(RAISES)
    errors = []
    for _ in range(2):                                   # one process: the second load must run the file again
        assert cli.main(_run(f"{bad}:f")) == 2
        errors.append(capsys.readouterr().err)
    assert errors[0] == errors[1], errors
    assert errors[0].count("\n") == 1 and "Traceback" not in errors[0]
    assert str(bad) in errors[0] and "failed to import: RuntimeError: boom at import" in errors[0]
    assert not [m for m in sys.modules if m.startswith("_pfa_backend_") and "bad_backend" in m]
    # and through `python -m cases.cli`, as a user types it
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-m", "pfa_verify.cases.cli", *_run(f"{bad}:f")], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2 and done.stderr == errors[0], done.stderr


def test_a_module_that_raises_at_import_is_a_value_error_naming_it(tmp_path, monkeypatch):
    (tmp_path / "raises_at_import_xyz.py").write_text(RAISES)
    monkeypatch.syspath_prepend(str(tmp_path))
    for _ in range(2):
        with pytest.raises(ValueError, match=r"cannot import module 'raises_at_import_xyz': RuntimeError: boom"):
            import_named_module("raises_at_import_xyz")
    assert "raises_at_import_xyz" not in sys.modules
    with pytest.raises(ValueError, match=r"^name='raises_at_import_xyz:f': cannot import module"):
        kernels.get_backend("raises_at_import_xyz:f")


def test_a_file_is_loaded_once_per_content(tmp_path):
    file = tmp_path / "versioned.py"
    file.write_text("VALUE = 1\n")
    first = load_file_module(file)
    assert load_file_module(str(file)) is first and first.VALUE == 1
    file.write_text("VALUE = 2\n")                       # edited since: a new module, not the old one
    assert load_file_module(file).VALUE == 2
    with pytest.raises(ValueError, match=r"'nowhere.py': no such file"):
        load_file_module("nowhere.py")


def test_a_pypto_gym_file_that_raises_is_the_same_error_twice(tmp_path):
    bad = tmp_path / "gym_kernel.py"
    bad.write_text(RAISES)
    messages = []
    for _ in range(2):
        with pytest.raises(ValueError) as info:
            load_kernel(str(bad))
        messages.append(str(info.value))
    assert messages[0] == messages[1] == f"kernel source {str(bad)!r} failed to import: RuntimeError: boom at import"


def test_a_kernel_mutant_that_does_not_import_is_a_value_error(monkeypatch, tmp_path):
    """The mutated copy is loaded by the same loader: a snippet that breaks the file's Python is a
    ValueError naming the copy (cases/measuring/mutants.py then reports the row broken, never killed)."""
    monkeypatch.setenv("PFA_VERIFY_CACHE", str(tmp_path))
    monkeypatch.setitem(kernel_level.KERNEL_MUTANTS, "broken_syntax", kernel_level.KernelMutant(
        "a snippet that does not parse", "p = pypto.exp(pypto.sub(s, m_j))", "p = pypto.exp(pypto.sub(s, m_j)"))
    for _ in range(2):
        with pytest.raises(ValueError, match=r"pfa_fp8_broken_syntax_\w+\.py' failed to import: SyntaxError"):
            kernel_level._mutated_module("broken_syntax")
    assert not [m for m in sys.modules if "broken_syntax" in m]


@pytest.mark.sim
def test_a_kernel_mutant_that_does_not_import_is_a_broken_row_never_a_kill(pypto_module, monkeypatch):
    """cases/measuring/mutants.py (issue 18 item 5): the mutant's backend fails to build, so its row is broken:
    not killed, its error reported, and the matrix's exit status 1 whatever the kill ratio."""
    broken = kernel_level.KernelMutant("a snippet that does not parse", "p = pypto.exp(pypto.sub(s, m_j))",
                                       "p = pypto.exp(pypto.sub(s, m_j)")
    monkeypatch.setitem(kernel_level.KERNEL_MUTANTS, "broken_syntax", broken)
    monkeypatch.setitem(mutants.MUTANTS, "sim/broken_syntax", mutants.Mutant("sim/broken_syntax", "sim", broken.bug, None))
    # the entries above exist in this process only, so the row's backend is built here, not in a worker
    monkeypatch.setattr(matrix, "worker_backend", lambda name, **options: GuardedBackend(kernels.get_backend(name)))
    row = matrix._one_or_error("sim/broken_syntax", level="sim", examples=2, seed=0, laws=("acceptance",),
                               catalog=True, shrink_s=0)
    assert not row.killed and row.cells == [], row
    assert row.error.startswith("UsageError: ") and "failed to import: SyntaxError" in row.error
    baseline = matrix.MutantResult("none (baseline)", "sim", "the unmutated reference", None, [])
    run = matrix.MutantsRun("sim", 2, 0, baseline, [row], matrix.GOALS["sim"], 0.0)
    assert run.kill_ratio == 0.0 and run.exit_status == 1
    assert "1 mutant(s) broke the matrix (sim/broken_syntax)" in matrix.summary_line(run)


def _kernel_beside_its_helper(folder, helper: str):
    """A backend file in ``folder`` that imports ``helper`` (a module beside it) at its top and in its kernel."""
    folder.mkdir()
    (folder / f"{helper}.py").write_text("from pfa_verify import golden\n\n\ndef attention(**kw):\n"
                                         "    return golden.paged_attention_fp8(**kw)\n")
    (folder / "kernel.py").write_text(
        f"import {helper}\n\n\nclass B:\n    name = 'neighbour'\n    codec = None\n\n"
        "    def paged_attention_fp8(self, **kw):\n"
        f"        import {helper} as again        # an import inside the kernel finds it too\n"
        "        return again.attention(**kw)\n\n\ndef make():\n    return B()\n")
    return folder / "kernel.py"


def test_a_backend_file_imports_its_neighbours_from_any_folder(tmp_path, monkeypatch, capsys):
    """Issue 54: ``--backend path/to/file.py:factory`` from a folder that is not the file's: the file's
    ``import helper`` finds helper.py beside it, in the supervised worker and --in-process alike."""
    kernel = _kernel_beside_its_helper(tmp_path / "kernel_folder", "helper_beside_kernel_54")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", list(sys.path))        # the loader puts the file's folder on it
    monkeypatch.delitem(sys.modules, "helper_beside_kernel_54", raising=False)
    digest = hashlib.sha256(kernel.read_bytes()).hexdigest()      # the driver still hashes the named file
    for mode in ([], ["--in-process"]):
        argv = ["run", "--backend", "../kernel_folder/kernel.py:make", "--cases", "edge_causal_s1_3_short",
                "--examples", "0", "--no-capture", *mode]
        assert cli.main(argv) == 0, capsys.readouterr()
        out = capsys.readouterr().out
        assert "1 checked on neighbour (1 passed, 0 failed)" in out and f"sha256 {digest}" in out, out
    sys.modules.pop("helper_beside_kernel_54", None)


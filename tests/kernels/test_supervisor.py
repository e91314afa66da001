"""kernels/backends/supervisor.py, supervised.py, worker_process.py, sandbox.py and wire.py: the kernel under a supervisor.

Every hostile kernel of tests/kernels/hostile_kernels.py against the one rule through a supervised
backend: none passes, each ends as the failure it is, and the next call gets a working process."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pfa_verify import golden
from pfa_verify.cases.data.catalog import load_catalog
from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels import BackendUnavailable, KernelRunError
from pfa_verify.kernels.backends import wire
from pfa_verify.kernels.backends.faults import KernelFault, KernelRaised
from pfa_verify.kernels.backends.supervised import SupervisedBackend
from pfa_verify.kernels.backends.supervisor import Supervisor
from pfa_verify.kernels.backends.worker_process import LOG_DIR_PREFIX, BackendSpec, remove_orphaned_logs
from pfa_verify.properties.rule.acceptance import InputsModified, judge, split_bundle

HOSTILE = "tests/kernels/hostile_kernels.py"
CASE = load_catalog()["edge_tail_tile_3_tokens"]


def _supervised(factory: str, **options) -> SupervisedBackend:
    return SupervisedBackend(Supervisor(BackendSpec(name=f"{HOSTILE}:{factory}"), **options))


@pytest.fixture(scope="module")
def golden_backend():
    backend = SupervisedBackend(Supervisor(BackendSpec(name="golden")))
    yield backend
    backend.close()


def test_a_supervised_golden_gives_the_golden_bits(golden_backend):
    tensors, scalars = split_bundle(CASE.inputs())
    here = golden.paged_attention_fp8_loop(**tensors, **scalars)
    there = golden_backend.paged_attention_fp8(**tensors, **scalars)
    assert torch.equal(here.view(torch.int16), there.view(torch.int16))
    assert judge(golden_backend, CASE).passed


@pytest.mark.parametrize("factory, error, text", [
    ("system_exit_0", KernelRaised, "the kernel called sys.exit(0)"),
    ("interrupts", KernelRaised, "KeyboardInterrupt"),
    ("os_exit_0", KernelFault, "exited with status 0 during the call; its last output: the kernel says goodbye"),
    ("segfault", KernelFault, "was killed by SIGSEGV during the call"),
    ("forks_and_exits", KernelFault, "exited with status 0 during the call"),
    ("garbage_on_the_pipe", KernelFault, "sent a malformed reply (a frame starts with b'not '"),
    ("returns_none", KernelRunError, "the kernel returned NoneType, not a torch.Tensor"),
])
def test_a_kernel_that_ends_or_breaks_its_process_is_a_failure_never_a_pass(factory, error, text):
    backend = _supervised(factory)
    try:
        with pytest.raises(error) as raised:
            judge(backend, CASE)
        assert text in str(raised.value)
    finally:
        backend.close()


def test_a_kernel_whose_process_ends_is_run_once_more_in_a_new_process():
    backend = _supervised("os_exit_0")
    try:
        with pytest.raises(KernelFault, match="so did the 1 new process"):
            judge(backend, CASE)
        assert backend.supervisor.started == 2
    finally:
        backend.close()


def test_a_kernel_that_hangs_outlives_its_time_limit_and_its_process_is_killed():
    backend = _supervised("sleeps", case_timeout=2)
    start = time.monotonic()
    try:
        with pytest.raises(KernelFault, match="did not return within 2 s") as raised:
            judge(backend, CASE)
        assert raised.value.kind == "timeout" and time.monotonic() - start < 30
        pid = backend.supervisor._slots[0].process.pid
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    finally:
        backend.close()


def _group_gone(pgid: int, within_s: float = 10.0) -> bool:
    """Whether process group ``pgid`` is empty within ``within_s`` (a killed orphan is reaped by init)."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_forked_child_of_the_kernel_ends_with_its_worker():
    """The kernel forks a child that sleeps (holding the worker's reply pipe) and ends its own process:
    the call is a fault (the supervisor looks at the process, not only the pipe) and the child is killed."""
    backend = _supervised("forks_and_exits")
    groups = []
    try:
        with pytest.raises(KernelFault, match="a process it started kept its pipe"):
            judge(backend, CASE)
        groups = [w.process.pid for w in backend.supervisor._slots if w is not None]
    finally:
        backend.close()
    assert groups and all(_group_gone(g) for g in groups)


@pytest.mark.parametrize("factory", ["returns_a_lie", "patches_the_judge"])
def test_a_kernel_that_lies_in_its_own_process_is_judged_by_its_bits(factory):
    backend = _supervised(factory)
    try:
        verdict = judge(backend, CASE)
        assert not verdict.passed and verdict.deciding.comparison.mismatched > 0
    finally:
        backend.close()


def test_a_changed_input_comes_back_and_the_rule_sees_it():
    backend = SupervisedBackend(Supervisor(BackendSpec(name="tests/cases/run_doubles.py:ModifiesInput")))
    try:
        with pytest.raises(InputsModified):
            judge(backend, CASE)
    finally:
        backend.close()


def test_a_kernel_that_hides_its_writes_in_its_own_process_is_caught_by_the_driver():
    """The kernel zeroes k_cache and patches whatever its worker could compare: the driver reads the
    input memory back itself (kernels/backends/protocol.py)."""
    backend = _supervised("hides_its_writes")
    try:
        with pytest.raises(InputsModified, match="Input k_cache after the hostile-hides-its-writes call"):
            judge(backend, CASE)
    finally:
        backend.close()


def test_a_kernel_that_cuts_its_input_memory_is_a_protocol_error_and_the_driver_lives():
    backend = _supervised("truncates_its_inputs")
    try:
        with pytest.raises(KernelFault, match="the memory holding the kernel's inputs was cut short") as raised:
            judge(backend, CASE)
        assert raised.value.kind == "protocol"
    finally:
        backend.close()


def test_a_well_formed_forged_reply_does_not_hide_a_changed_input():
    """A result frame the kernel writes itself, with the right request number and the golden's output,
    after zeroing k_cache: the driver's own reading of the input memory still sees the write."""
    backend = _supervised("forges_its_reply")
    try:
        with pytest.raises(InputsModified, match="k_cache"):
            judge(backend, CASE)
    finally:
        backend.close()


@pytest.mark.parametrize("frame, text", [
    ("claims_changed_none", "field(s) the protocol does not have: changed"),
    ("unknown_tensor", "exactly one tensor, named output"),
    ("null_tensors", "whose tensors is NoneType, not list"),
    ("wrong_seq", "not the answer to this request"),
    ("unknown_type", "a reply of type 'zzz' to a call request"),
])
def test_a_malformed_or_unexpected_reply_is_an_error_naming_the_worker(frame, text):
    backend = SupervisedBackend(Supervisor(BackendSpec(name=f"{HOSTILE}:forges_its_reply", options={"frame": frame})))
    try:
        with pytest.raises(KernelFault) as raised:
            judge(backend, CASE)
        assert raised.value.kind == "protocol" and text in str(raised.value)
        assert "worker 0, pid" in str(raised.value) and backend.supervisor._slots[0].process.poll() is not None
    finally:
        backend.close()


def _alive_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker.encode() in argv and state not in ("Z", "X"):
                found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finding every process a kernel started needs /proc (Linux)")
def test_every_process_the_kernel_starts_ends_with_its_worker(monkeypatch):
    """One process in a session of its own, one more that also clears its environment and loses its parent:
    none outlives the supervisor (kernels/backends/reaping.py)."""
    marker = f"pfa-verify-test-orphan-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv("PFA_VERIFY_TEST_MARKER", marker)
    backend = _supervised("starts_a_session")
    try:
        assert judge(backend, CASE).passed
        deadline = time.monotonic() + 20
        while len(_alive_with(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_alive_with(marker)) == 2          # both were started: the test can fail
    finally:
        backend.close()
    deadline = time.monotonic() + 10
    while _alive_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive_with(marker) == []


def test_the_kernel_source_is_the_drivers_reading_of_the_file_not_the_backends_claim():
    backend = _supervised("claims_another_source")
    try:
        source = backend.capabilities.kernel_source
        assert source is not None
        assert source["sha256"] == hashlib.sha256(Path(HOSTILE).read_bytes()).hexdigest()
        assert source["path"] == str(Path(HOSTILE).resolve()) and source["function"] == "claims_another_source"
    finally:
        backend.close()


def test_the_worker_runs_the_bytes_the_driver_hashed(tmp_path):
    """The file changes after the driver read it: the worker executes what was hashed."""
    file = tmp_path / "swapped.py"
    file.write_text("from kernels.backends.golden_backend import GoldenBackend\n"
                    "def make():\n    b = GoldenBackend(); b.name = 'as-hashed'; return b\n")
    supervisor = Supervisor(BackendSpec(name=f"{file}:make"))
    try:
        file.write_text("def make():\n    raise RuntimeError('swapped after hashing')\n")
        assert supervisor.start().name == "as-hashed"
    finally:
        supervisor.close()


def test_backend_unavailable_from_a_call_is_an_error_never_a_skip():
    backend = _supervised("unavailable_in_a_call")
    try:
        with pytest.raises(KernelRaised, match="built for one KV head") as raised:
            judge(backend, load_catalog()["pfa_fp8_b16_s1_1_s2_256_nkv_4"])
        assert raised.value.type_name == "BackendUnavailable"
    finally:
        backend.close()


def test_a_backend_declares_the_kernels_it_implements():
    backend = _supervised("paged_only")
    try:
        assert backend.capabilities.operators == ("paged_attention_fp8",)
    finally:
        backend.close()


def test_the_next_call_after_a_death_gets_a_working_process(golden_backend):
    backend = _supervised("os_exit_0")
    try:
        with pytest.raises(KernelFault):
            judge(backend, CASE)
    finally:
        backend.close()
    assert judge(golden_backend, CASE).passed


@pytest.mark.parametrize("factory, error, text", [
    ("exits_at_import_time", BackendUnavailable, "loading it called sys.exit"),
    ("factory_raises", BackendUnavailable, "loading it raised RuntimeError: no device here"),
    ("no_name", UsageError, "name=None must be a non-empty string"),
    ("string_codec", UsageError, "codec='str' must be None (the spec's E4M3) or one of golden.codec.CODECS"),
    ("bad_shapes", UsageError, "supported_shapes={'head_dim': 128} must be None or a dict"),
])
def test_a_backend_that_cannot_load_is_one_line_naming_why(factory, error, text):
    with pytest.raises(error) as raised:
        Supervisor(BackendSpec(name=f"{HOSTILE}:{factory}")).start()
    assert text in str(raised.value) and "\n" not in str(raised.value)


def test_a_module_that_exits_at_import_cannot_start():
    with pytest.raises(BackendUnavailable, match="cannot start"):
        Supervisor(BackendSpec(name="tests/kernels/exits_at_import.py:make_backend")).start()


def test_workers_end_with_their_supervisor(golden_backend):
    supervisor = Supervisor(BackendSpec(name="golden"), workers=2)
    supervisor.start()
    pids = [w.process.pid for w in supervisor._slots]
    supervisor.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_the_logs_of_a_driver_killed_with_sigkill_are_removed_by_the_next_one(tmp_path):
    """SIGKILL leaves no time to clean up: the next supervisor removes a folder whose driver is gone, and
    keeps a live driver's and one whose owner its name does not tell."""
    program = ("import time\n"
               "from kernels.backends.supervisor import Supervisor\n"
               "from kernels.backends.worker_process import BackendSpec\n"
               "s = Supervisor(BackendSpec(name='golden')); s.start()\n"
               "print(s._log_dir, flush=True); time.sleep(600)")
    driver = subprocess.Popen(
        [sys.executable, "-c", program],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        killed = Path(driver.stdout.readline().strip())
    finally:
        driver.kill()
        driver.wait()
    assert killed.parent == tmp_path and killed.name.startswith(f"{LOG_DIR_PREFIX}{driver.pid}-")
    assert killed.is_dir() and any(killed.glob("worker-0-*.log"))
    live = tmp_path / f"{LOG_DIR_PREFIX}{os.getpid()}-abcd"
    unnamed = tmp_path / f"{LOG_DIR_PREFIX}abcd1234"
    for folder in (live, unnamed):
        folder.mkdir()
    assert remove_orphaned_logs(str(tmp_path)) == [killed]
    assert not killed.exists() and live.is_dir() and unnamed.is_dir()


# -- the wire: data only, bounded ---------------------------------------------------------------

def _pipe_roundtrip(header, buffers, *, max_bytes=2**20):
    r, w = os.pipe()
    try:
        wire.write_message(w, header, buffers)
        os.close(w)
        return wire.read_message(r, max_bytes=max_bytes)
    finally:
        os.close(r)


def test_tensors_cross_bit_for_bit_with_their_layout():
    q = torch.randn(4, 3).to(torch.float8_e4m3fn)
    t = torch.arange(6, dtype=torch.int16).reshape(2, 3).t()        # not contiguous
    one = torch.zeros(1, 1, dtype=torch.int32).as_strided((1, 1), (3, 3))   # a one-element view, odd strides
    nan = torch.tensor([float("nan"), -0.0]).to(torch.bfloat16)
    entries, buffers = wire.pack_tensors({"q": q, "t": t, "one": one, "nan": nan})
    header, got = _pipe_roundtrip({"type": "x", "tensors": entries}, buffers)
    back = wire.unpack_tensors(header["tensors"], got)
    for name, original in {"q": q, "t": t, "one": one, "nan": nan}.items():
        assert back[name].dtype == original.dtype and back[name].shape == original.shape
        assert back[name].stride() == original.stride() or original.numel() == 1
        assert bytes(wire.raw_bytes(back[name])) == bytes(wire.raw_bytes(original)), name


@pytest.mark.parametrize("frame, error", [
    (b"XXXX" + b"\x00" * 4, "not b'PFAW'"),
    (b"PFAW" + (2**31).to_bytes(4, "little"), "over the limit"),
    (b"PFAW" + (3).to_bytes(4, "little") + b"{{{", "not JSON"),
    (b"PFAW" + (2).to_bytes(4, "little") + b"[]", "not an object"),
])
def test_a_malformed_frame_is_refused(frame, error):
    r, w = os.pipe()
    os.write(w, frame)
    os.close(w)
    try:
        with pytest.raises(wire.WireError, match=error):
            wire.read_message(r, max_bytes=2**20)
    finally:
        os.close(r)


def test_buffers_over_the_limit_are_refused_before_they_are_read():
    with pytest.raises(wire.WireError, match="over the limit of 10"):
        _pipe_roundtrip({"type": "x"}, [b"x" * 11], max_bytes=10)


def test_a_tensor_entry_that_does_not_match_its_buffer_is_refused():
    entries, buffers = wire.pack_tensors({"q": torch.zeros(4)})
    entries[0]["shape"] = [5]
    with pytest.raises(wire.WireError, match="16 bytes for shape"):
        wire.unpack_tensors(entries, [bytearray(b) for b in buffers])
    with pytest.raises(wire.WireError, match="malformed"):
        wire.unpack_tensors([{"name": "q", "dtype": "object"}], [])

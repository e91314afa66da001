"""A pytest law run whose kernel ends its process fails, never passes (tests/conftest.py's ``backend``).

Every backend but the golden runs under a supervisor in a law run: its kernel is in a worker process of
the test process, so a kernel that exits (any status), is killed or hangs past --case-timeout raises a
KernelFault in the law, which check_law reports as the test's failure (and captures). With --in-process
the kernel runs in the test process; its SystemExit, KeyboardInterrupt and os._exit are failures too."""
from __future__ import annotations

import pytest

LAW_TEST = """
from pfa_verify.cases.data.catalog import load_catalog


def test_acceptance_on_one_case(check_law):
    check_law("acceptance", load_catalog()["edge_tail_tile_3_tokens"])
"""


# One pytest session each (10 s). The supervisor's own tests (tests/kernels/test_supervisor.py) name every way a
# kernel ends; here the plugin's path from a KernelFault to a failed test, in the default run through an exit
# with status 0 (the one a careless check takes for success); the other two, slow, in tox -e slow.
@pytest.mark.parametrize("factory, expected", [
    ("os_exit_0", "exited with status 0 during the call"),
    pytest.param("segfault", "was killed by SIGSEGV during the call", marks=pytest.mark.slow),
    pytest.param("system_exit_0", "the kernel called sys.exit(0)", marks=pytest.mark.slow),
])
def test_a_kernel_that_ends_its_process_fails_its_test(suite_pytester, tmp_path, factory, expected):
    suite_pytester.makepyfile(test_law=LAW_TEST)
    result = suite_pytester.runpytest_subprocess("--backend", f"tests/kernels/hostile_kernels.py:{factory}",
                                                 "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    assert result.ret == 1 and expected in result.stdout.str()


def test_a_kernel_that_hangs_fails_its_test_at_the_time_limit(suite_pytester):
    suite_pytester.makepyfile(test_law=LAW_TEST)
    result = suite_pytester.runpytest_subprocess("--backend", "tests/kernels/hostile_kernels.py:sleeps",
                                                 "--case-timeout", "3", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    assert "did not return within 3 s" in result.stdout.str()


@pytest.mark.parametrize("factory", ["os_exit_0", "system_exit_0", "interrupts"])
def test_in_process_the_kernel_s_exits_are_failures_too(suite_pytester, factory):
    suite_pytester.makepyfile(test_law=LAW_TEST)
    result = suite_pytester.runpytest_subprocess("--backend", f"tests/kernels/hostile_kernels.py:{factory}",
                                                 "--in-process", "-p", "no:cacheprovider")
    assert result.ret == 1
    result.assert_outcomes(failed=1)

"""Kernel-level mutants on the sim (issue 12; the `slow` marker: `tox -e mutants`, `tox -e sim`).

Each textual mutant of kernels/pfa_fp8.py is run by the sim backend through the paged-attention laws
(5 kernel-sized examples each, the first law that kills ends the row) and must be killed, except the
ledger's survivors (properties/rule/ledger.py), strict xfails: one a law kills fails this test, and its entry
goes. The unmutated kernel passing every law is `tox -e sim`'s job and pfa-verify mutants' baseline."""
from __future__ import annotations

import pytest
from ledger_marks import survivor_params

from pfa_verify.cases.measuring import mutants as matrix
from pfa_verify.kernels.mutants.kernel_level import KERNEL_MUTANTS
from pfa_verify.properties.search.law_examples import PAGED_LAWS

pytestmark = [pytest.mark.sim, pytest.mark.slow]


@pytest.mark.parametrize("name", survivor_params(sorted(KERNEL_MUTANTS), prefix="sim/"))
def test_every_kernel_mutant_is_killed_on_the_sim(name, pypto_module):
    # In a spawned process of its own (cases/mutants.rows): this one is an xdist worker.
    [result] = matrix.rows([f"sim/{name}"], level="sim", examples=5, seed=0, laws=PAGED_LAWS, catalog=False,
                           shrink_s=0, first_kill_only=True)
    if result.error is not None:
        pytest.fail(f"sim/{name}: {result.error}")       # a broken row is not a survivor: never an xfail
    assert result.killed, f"sim/{name} survived every law with 5 examples each"

"""Kernel-level mutants on the sim (issue 12; the `slow` marker: `tox -e mutants`, `tox -e sim`).

Each textual mutant of kernels/pfa_fp8.py is run by the sim backend through the paged-attention laws
(5 kernel-sized examples each, the first law that kills ends the row) and must be killed, except the
known survivor, which is held to surviving (README: Verification power says why). The unmutated
kernel passing every law is `tox -e sim`'s job and pfa-verify mutants' baseline."""
from __future__ import annotations

import pytest

from cases import mutants as matrix
from kernels.mutants.kernel_level import KERNEL_MUTANTS
from properties.law_examples import PAGED_LAWS

pytestmark = [pytest.mark.sim, pytest.mark.slow]

KNOWN_SURVIVORS = {"softmax_scale_before_dequant"}


@pytest.mark.parametrize("name", sorted(KERNEL_MUTANTS))
def test_every_kernel_mutant_is_killed_on_the_sim(name, pypto_module):
    # In a spawned process of its own (cases/mutants.rows): this one is an xdist worker.
    [result] = matrix.rows([f"sim/{name}"], level="sim", examples=5, seed=0, laws=PAGED_LAWS, catalog=False,
                           shrink_s=0, first_kill_only=True)
    assert result.error is None, result.error
    if name in KNOWN_SURVIVORS:
        assert not result.killed, f"sim/{name} is killed now ({result.killing_laws}): remove it from KNOWN_SURVIVORS"
        return
    assert result.killed, f"sim/{name} survived every law with 5 examples each"

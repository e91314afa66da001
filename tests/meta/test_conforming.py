"""Tests of the suite itself (issue 16): no false red. Every conforming variant (kernels/conforming: a
correct kernel using only SPEC §4.1's freedoms) passes every paged-attention law on the laws' own
examples, as the mutants are searched (cases/measuring/conforming.py); a failure here is the suite calling a correct
kernel wrong. The vertex variants (every raw score at an end of its interval) are run through the one
acceptance rule, which they stress. ``tox -e mutants`` runs the same with 20 examples per law, the
catalog, and the acceptance law's search steered towards the edge of the rule."""
from __future__ import annotations

import pytest

from pfa_verify.cases.measuring import conforming
from pfa_verify.kernels.conforming import VARIANTS
from pfa_verify.properties.search.law_examples import PAGED_LAWS

VERTICES = [n for n, v in VARIANTS.items() if v.mm1.startswith("vertex")]
REALISTIC = [n for n in VARIANTS if n not in VERTICES]


@pytest.mark.parametrize("name", REALISTIC)
def test_a_conforming_variant_fails_no_law(name):
    result = conforming._variant(name, examples=2, seed=0, laws=PAGED_LAWS, catalog=False)
    assert result.error is None, result.error
    reds = [(c.law, c.first_failure["message"]) for c in result.cells if c.failures]
    assert not reds, f"{name}: false reds {reds}"
    assert all(c.examples == 2 for c in result.cells)


@pytest.mark.parametrize("name", VERTICES)
def test_a_vertex_variant_passes_the_one_rule(name):
    result = conforming._variant(name, examples=4, seed=0, laws=("acceptance",), catalog=False)
    assert result.error is None, result.error
    assert result.false_reds == 0, result.cells[0].first_failure

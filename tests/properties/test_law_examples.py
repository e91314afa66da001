"""properties/search/law_examples.py: the laws' examples are aimed at the coverage bins the plain draws rarely
reach (as a run's generated cases are, properties/search/directed.py), inside each law's own domain."""
from __future__ import annotations

from collections import Counter

import pytest

from pfa_verify.kernels.config import KERNEL_SHAPES
from pfa_verify.properties.rule.coverage import classify
from pfa_verify.properties.search import law_examples
from pfa_verify.properties.search import strategies as ps
from pfa_verify.properties.search.directed import draw, narrowing


def test_aims_leave_the_laws_domain_and_a_kernels_shapes_alone():
    free = law_examples.aims()
    assert {"nkv": 3} in free and {"s2_tile_blocks": 8} in free
    assert all("group" not in kwargs for kwargs in law_examples.aims(group=ps.st.just(2)))
    assert all("s1" not in kwargs for kwargs in law_examples.aims(s1=2))
    kernel_sized = law_examples.aims(KERNEL_SHAPES)
    assert kernel_sized and all("s2_tile_blocks" not in kwargs for kwargs in kernel_sized)
    assert len(kernel_sized) == len(free) - sum("s2_tile_blocks" in kwargs for kwargs in free)
    assert all(narrowing(name) in free for name in ("distribution_sinks", "garbage_nan", "nkv_3_plus", "extra_columns"))


def _bins(law: str, backend=None, n: int = 300) -> Counter:
    return Counter(name for case, _ in draw(law_examples.examples(law, backend), seed=7, draws=n)
                   for name in classify(case.config))


@pytest.mark.parametrize("law", ["acceptance", "causal_prefix"])
def test_the_laws_reach_bins_the_plain_draws_never_do(law):
    """Plain draws have at most 2 KV heads and an s2_tile of at most 4 blocks; the aimed ones go past them."""
    plain = Counter(name for case in draw(ps.cases_for(None, s1=ps.st.integers(2, 3)), seed=7, draws=300)
                    for name in classify(case.config))
    assert plain["nkv_3_plus"] == 0 and plain["s2_tile_8_blocks"] == 0
    aimed = _bins(law)
    assert aimed["nkv_3_plus"] + aimed["s2_tile_8_blocks"] > 0, sorted(aimed.items())


def test_a_kernel_sized_backend_gets_only_its_shapes():
    for case, _ in draw(law_examples.examples("acceptance", KERNEL_SHAPES), seed=3, draws=60):
        c = case.config
        assert c.head_dim in KERNEL_SHAPES["head_dim"] and c.block_size in KERNEL_SHAPES["block_size"]
        assert c.s2_tile // c.block_size <= 2

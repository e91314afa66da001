"""An output that is not what SPEC §1 says a kernel returns (bf16 [B*S1, NQ, D] on the CPU) is named as such by
the one rule (properties/rule/acceptance.py): its category is ``wrong dtype``, ``wrong shape`` or ``wrong device``,
and its message's first line says what it is and what was expected; it is never a numeric ``kernel logic``."""
from __future__ import annotations

import pytest

from pfa_verify import golden
from pfa_verify.properties.rule.acceptance import CATEGORIES, judge
from pfa_verify.properties.rule.case import Case

CASE = Case(golden.PagedAttentionConfig(batch=1, s1=1, s2=16, nq=2, nkv=1, head_dim=8, block_size=16, s2_tile=16),
            seed=0)


class Reshaped:
    """The golden's output, changed by ``change`` before it is returned."""

    def __init__(self, change):
        self.change, self.name, self.codec = change, "reshaped", None

    def paged_attention_fp8(self, **kwargs):
        return self.change(golden.paged_attention_fp8(**kwargs))


@pytest.mark.parametrize("change, category, first_line", [
    (lambda out: out.float(), "wrong dtype", "wrong dtype: float32, expected bfloat16"),
    (lambda out: out[:, :, :-1], "wrong shape", "wrong shape: (1, 2, 7), expected (1, 2, 8)"),
    (lambda out: out.to("meta"), "wrong device", "wrong device: meta, expected cpu"),
], ids=["dtype", "shape", "device"])
def test_a_wrong_output_is_named_by_what_is_wrong(change, category, first_line):
    verdict = judge(Reshaped(change), CASE)
    assert not verdict.passed and category in CATEGORIES
    assert verdict.deciding.category == category
    lines = verdict.message().splitlines()
    assert lines[0] == f"Kernel output vs golden: {first_line} [case {CASE.label()}, backend reshaped]"
    assert len(lines) == 1                     # nothing numeric follows: no value was compared

"""properties/rule/compare.py: the tolerance table, both-or-neither overrides, check order, NaN and
signed zero, and the failure text (snapshots)."""
from __future__ import annotations

import math

import pytest
import torch

from pfa_verify.properties.rule import compare as cmp


def test_tolerance_table_follows_spec_section_4():
    assert cmp.get_tolerance("attention") == (1 / 128, 1e-4)
    assert cmp.get_tolerance("at12") == (1 / 128, 1e-4)
    assert cmp.get_tolerance("exact") == (0.0, 0.0)


@pytest.mark.parametrize("kwargs", [dict(rtol=0.1), dict(atol=0.1), dict(rtol=None, atol=1e-3)],
                         ids=lambda kw: "get_tolerance(" + ", ".join(f"{k}={v}" for k, v in kw.items()) + ")")
def test_overrides_are_both_or_neither(kwargs):
    with pytest.raises(ValueError, match="both be given or both omitted"):
        cmp.get_tolerance("attention", **kwargs)
    with pytest.raises(ValueError, match="both be given or both omitted"):
        cmp.assert_close(torch.zeros(2), torch.zeros(2), **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(kind="loose"), "not a known comparison"),
    (dict(rtol=-1.0, atol=0.0), "rtol=-1.0 must be >= 0"),
    (dict(rtol=0.0, atol=-1.0), "atol=-1.0 must be >= 0"),
    (dict(rtol=0.0, atol=torch.tensor([-1.0])), "atol tensor must be >= 0"),
], ids=["kind='loose'", "rtol=-1", "atol=-1", "atol=tensor(-1)"])
def test_bad_tolerance_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cmp.compare(torch.zeros(1), torch.zeros(1), **kwargs)


def test_the_rule_is_atol_plus_rtol_times_expected():
    e = torch.tensor([1.0, 64.0, 0.0])
    a = e + torch.tensor([2**-13 + 2**-7, 0.5, 2**-14])  # on or under atol + rtol * |e|
    assert cmp.compare(a, e, rtol=2**-7, atol=2**-13).passed
    assert not cmp.compare(a + torch.tensor([2**-10, 0, 0]), e, rtol=2**-7, atol=2**-13).passed


def test_attributes_come_before_values():
    r = cmp.compare(torch.zeros(2, 3), torch.ones(2, 4))
    assert not r.passed and (r.wrong, r.attribute) == ("shape", "wrong shape: (2, 3), expected (2, 4)")
    r = cmp.compare(torch.zeros(2, dtype=torch.bfloat16), torch.zeros(2))
    assert (r.wrong, r.attribute) == ("dtype", "wrong dtype: bfloat16, expected float32")
    r = cmp.compare(torch.zeros(3, 2).T, torch.zeros(2, 3))
    assert r.wrong == "layout" and r.attribute.startswith("wrong layout: strides (1, 2), expected (3, 1)")


def test_nonfinite_placement_is_its_own_finding():
    e = torch.tensor([1.0, float("nan"), float("inf"), 2.0])
    a = torch.tensor([float("nan"), float("nan"), float("inf"), float("-inf")])
    r = cmp.compare(a, e)
    assert [(f.what, f.count) for f in r.nonfinite] == [("NaN where expected is finite", 1),
                                                       ("inf where expected is finite", 1)]
    assert r.mismatched == 2 and r.max_abs_index is None
    assert cmp.compare(torch.tensor([float("nan")]), torch.tensor([float("nan")]), kind="exact").passed
    assert not cmp.compare(torch.tensor([1.0]), torch.tensor([float("nan")])).passed
    assert not cmp.compare(torch.tensor([-math.inf]), torch.tensor([math.inf])).passed


def _nan(bits: int, dtype=torch.float32) -> torch.Tensor:
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[dtype]
    return torch.tensor([bits], dtype=ints).view(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.float8_e4m3fn],
                         ids=lambda d: str(d).removeprefix("torch."))
def test_exact_means_bits_signed_zero(dtype):
    """-0.0 and +0.0 are close (SPEC §4) but not bit-identical."""
    neg, pos = torch.tensor([-0.0]).to(dtype), torch.tensor([0.0]).to(dtype)
    assert cmp.compare(neg.float(), pos.float()).passed
    r = cmp.compare(neg, pos, kind="exact")
    assert not r.passed and [(f.what, f.section) for f in r.nonfinite] == [("zero of the other sign", "Bits differ")]


def test_exact_means_bits_nan_payload():
    """NaN with other bits (sign or payload) is not bit-identical; the same NaN bits are."""
    for dtype, a_bits, b_bits in ((torch.float32, 0x7FC00000, 0x7FC00001), (torch.float32, 0x7FC00000, -0x400000),
                                  (torch.bfloat16, 0x7FC0, 0x7FAB)):
        a, b = _nan(a_bits, dtype), _nan(b_bits, dtype)
        assert cmp.compare(a, b).passed                                   # both NaN: placement agrees
        r = cmp.compare(a, b, kind="exact")
        assert not r.passed and r.nonfinite[0].what == "NaN with other bits than the expected NaN"
        assert cmp.compare(a, a.clone(), kind="exact").passed
    text = cmp.make_mismatch_message(cmp.compare(_nan(0x7FC00001), _nan(0x7FC00000), kind="exact"), identifier="x")
    assert text == ("x not bit-identical\nMismatched elements: 1 / 1 (100.0%)\n"
                    "Bits differ: 1 NaN with other bits than the expected NaN, first at (0,)")


def test_exact_takes_no_tolerance_and_bound_needs_one():
    with pytest.raises(ValueError, match="kind='exact' compares bits"):
        cmp.compare(torch.zeros(1), torch.zeros(1), kind="exact", rtol=0.0, atol=1e-3)
    with pytest.raises(ValueError, match="kind='bound' takes the bound from the caller"):
        cmp.compare(torch.zeros(1), torch.zeros(1), kind="bound")
    assert cmp.compare(torch.zeros(1), torch.full((1,), 1e-3), kind="bound", rtol=0.0, atol=1e-3).passed


def test_error_ratio_is_error_over_allowed():
    e = torch.tensor([1.0, 0.0, float("nan"), 2.0, float("inf")])
    a = torch.tensor([1.0 + 1 / 128, 5e-5, float("nan"), float("nan"), float("inf")])
    r = cmp.error_ratio(a, e)
    allowed = 1e-4 + 1 / 128
    assert r.tolist()[:3] == pytest.approx([(1 / 128) / allowed, 0.5, 0.0])
    assert math.isinf(r[3]) and r[4] == 0


def test_integer_tensors_compare_exactly():
    big = torch.tensor([2**24 + 1], dtype=torch.int32)
    assert not cmp.compare(big, big - 1, kind="exact").passed


@pytest.mark.parametrize("value", [2**53, 2**62, -(2**63), 2**63 - 2])
def test_integers_compare_as_integers_past_float64(value):
    """int64 values a float64 view merges (2**53 + 1 reads as 2**53 there) still differ, by 1."""
    e = torch.tensor([value, 7], dtype=torch.int64)
    a = e + torch.tensor([1, 0])
    r = cmp.compare(a, e, kind="exact")
    assert not r.passed and r.mismatched == 1 and r.max_abs_index == (0,) and r.max_abs_err == 1.0
    assert cmp.compare(e.clone(), e, kind="exact").passed
    assert float(cmp.error_ratio(a, e, kind="exact")[0]) == math.inf and float(cmp.error_ratio(a, e, kind="exact")[1]) == 0


def test_integer_tolerance_is_decided_on_the_exact_distance():
    e = torch.tensor([2**60, 2**60, -(2**63)], dtype=torch.int64)
    a = torch.tensor([2**60 + 3, 2**60 + 4, 2**63 - 1], dtype=torch.int64)   # distances 3, 4 and 2**64 - 1
    r = cmp.compare(a, e, kind="bound", rtol=0.0, atol=3.5)
    assert r.mismatch_mask.tolist() == [False, True, True]
    assert cmp.compare(torch.tensor([True, False]), torch.tensor([True, True]), kind="exact").mismatched == 1


def test_device_is_an_attribute_checked_with_shape_and_dtype():
    """A tensor on another device is an attribute finding, before any value is read (a meta tensor
    has no values to read)."""
    r = cmp.compare(torch.zeros(3, device="meta"), torch.zeros(3))
    assert not r.passed and (r.wrong, r.attribute) == ("device", "wrong device: meta, expected cpu")
    assert cmp.compare(torch.zeros(2, 3, device="meta"), torch.zeros(2, 4)).wrong == "shape"
    with pytest.raises(AssertionError, match=r"^x: wrong device: meta, expected cpu$"):
        cmp.assert_close(torch.zeros(3, device="meta"), torch.zeros(3), kind="exact", identifier="x")


def test_maxima_count_only_mismatches_and_index_renders_as_b_i_h_d():
    e = torch.zeros(4, 2, 3, dtype=torch.bfloat16)
    a = e.clone()
    a[3, 1, 2] = 0.5    # batch 1, position 1 with s1=2
    a[0, 0, 0] = 5e-5   # within atol: not a mismatch
    r = cmp.compare(a, e, s1=2)
    assert r.mismatched == 1 and r.max_abs_index == (3, 1, 2)
    assert r.format_index(r.max_abs_index) == "(b=1, i=1, h=1, d=2)"


def test_message_snapshot_close():
    e = torch.ones(2, 2, 4, dtype=torch.bfloat16)
    a = e.clone()
    a[1, 1, 3] = 1.5
    a[0, 0, 0] = float("nan")
    with pytest.raises(AssertionError) as info:
        cmp.assert_close(a, e, identifier="Kernel output vs golden", tags={"case": "c1", "backend": "sim"},
                         s1=1, context=["Attribution: all 2 in batch 1", "Replay: pfa-verify cases replay abc"])
    assert str(info.value) == (
        "Kernel output vs golden not close (SPEC §4) [case c1, backend sim]\n"
        "Worst element by the rule: (b=0, i=0, h=0, d=0), NaN where expected is finite\n"
        "Mismatched elements: 2 / 16 (12.5%)\n"
        "Non-finite: 1 NaN where expected is finite, first at (b=0, i=0, h=0, d=0)\n"
        "Greatest absolute difference: 5.0e-01 at (b=1, i=0, h=1, d=3) (7.9e-03 allowed there)\n"
        "Greatest relative difference: 5.0e-01 at (b=1, i=0, h=1, d=3) (7.8e-03 allowed)\n"
        "Attribution: all 2 in batch 1\n"
        "Replay: pfa-verify cases replay abc")


def test_the_headline_is_the_element_farthest_beyond_what_is_allowed_there():
    """Not the greatest absolute difference: a small error where little is allowed is the worse one."""
    e = torch.tensor([100.0, 1e-3])
    a = torch.tensor([101.5, 2e-3])          # 1.5 off where ~0.78 is allowed; 1e-3 off where ~1e-4 is allowed
    res = cmp.compare(a, e, kind="attention")
    assert res.max_abs_index == (0,) and res.beyond_index == (1,)
    assert res.worst_line().startswith("Worst element by the rule: (1,), off by 1.0e-03 where 1.1e-04 is allowed (9.")


def test_message_snapshot_exact_and_attributes():
    with pytest.raises(AssertionError) as info:
        cmp.assert_close(torch.zeros(3), torch.zeros(2), kind="exact", identifier="Input q after the call vs before")
    # Not a numeric failure: the attribute is the first line, with nothing numeric after it.
    assert str(info.value) == "Input q after the call vs before: wrong shape: (3,), expected (2,)"


def test_context_callable_only_runs_on_failure():
    calls = []
    cmp.assert_close(torch.ones(2), torch.ones(2), context=lambda r: calls.append(r) or [])
    assert calls == []


def test_per_element_atol_reports_the_allowance_at_the_index():
    r = cmp.compare(torch.tensor([0.0, 0.3]), torch.zeros(2), rtol=0.0, atol=torch.tensor([1.0, 0.25]))
    assert r.mismatched == 1 and r.max_abs_allowed == 0.25
    text = cmp.make_mismatch_message(r, identifier="x")
    assert text.splitlines()[0] == "x not close (rtol=0, atol=per element)"

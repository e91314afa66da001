"""pfa_verify.properties.rule.acceptance.call: a backend call must leave its inputs bit for bit as they were.

Each change below is one a value comparison misses (a zero's sign, a NaN's payload) or one byte of a
large buffer; each is made on a small tensor (one torch.equal) and on a large one (through numpy), the
two paths of the check, and must raise InputsModified naming the tensor. Untouched inputs pass."""
from __future__ import annotations

import pytest
import torch

import pfa_verify.properties.rule.acceptance as acceptance
from pfa_verify.properties.rule.acceptance import InputsModified, call

SMALL, LARGE = 12, 3 * 4096          # elements: either side of the check's torch.equal / numpy switch


class _Writes:
    """A backend that applies ``change`` to the named input in place and returns zeros."""

    name = "writes"

    def __init__(self, key: str, change) -> None:
        self.key, self.change = key, change

    def paged_attention_fp8(self, **tensors):
        if self.change is not None:
            self.change(tensors[self.key])
        return torch.zeros(2)


def _negate_zero(x):
    x.view(-1)[-1] = -0.0


def _nan_payload(x):
    x.view(torch.int32).view(-1)[-1] ^= 1          # a NaN stays a NaN of another payload


def _one_byte(x):
    x.view(torch.uint8).view(-1)[-1] ^= 0x01


def _inputs(n: int) -> dict:
    scale = torch.zeros(n, dtype=torch.float32)     # no NaN: a comparison by value would see any change
    return {"q_scale": scale, "k_cache": torch.arange(n, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn),
            "block_table": torch.arange(n, dtype=torch.int32)}


@pytest.mark.parametrize("n", [SMALL, LARGE])
@pytest.mark.parametrize("key", ["k_cache", "block_table"])
def test_one_changed_byte_is_caught(n, key):
    with pytest.raises(InputsModified, match=f"Input {key} after the writes call"):
        call(_Writes(key, _one_byte), _inputs(n))


@pytest.mark.parametrize("n", [SMALL, LARGE])
def test_a_nan_of_another_payload_is_caught(n):
    tensors = _inputs(n)
    tensors["q_scale"].view(-1)[-1] = float("nan")
    with pytest.raises(InputsModified, match="Input q_scale"):
        call(_Writes("q_scale", _nan_payload), tensors)


@pytest.mark.parametrize("n", [SMALL, LARGE])
def test_a_zero_that_changes_sign_is_caught(n):
    tensors = _inputs(n)
    tensors["q_scale"].view(-1)[-1] = 0.0
    with pytest.raises(InputsModified, match="Input q_scale"):
        call(_Writes("q_scale", _negate_zero), tensors)


@pytest.mark.parametrize("n", [SMALL, LARGE])
def test_untouched_inputs_pass(n):
    assert call(_Writes("q_scale", None), _inputs(n)).shape == (2,)


@pytest.mark.parametrize("where", [0, 5000, LARGE - 1], ids=["first slice", "a middle slice", "last slice"])
def test_a_changed_byte_in_any_slice_of_a_large_buffer_is_caught(where, monkeypatch):
    """Large buffers are compared a slice at a time (no mask the size of a 128k-token cache): a change in
    any slice is caught, not only in the first."""
    monkeypatch.setattr(acceptance, "_SLICE_ELEMENTS", 1000)

    def flip(x):
        x.view(torch.uint8).view(-1)[where] ^= 0x01
    with pytest.raises(InputsModified, match="Input k_cache"):
        call(_Writes("k_cache", flip), _inputs(LARGE))
    assert call(_Writes("k_cache", None), _inputs(LARGE)).shape == (2,)

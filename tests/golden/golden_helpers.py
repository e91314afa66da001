"""Helpers of tests/golden: bit-level equality, hand-built paged inputs, readable ids.

Imported by the test modules of this folder as ``gh``. Comparisons go through properties.rule.compare
(the project's one comparison core); "bit-identical" compares the integer views of two tensors
with the ``exact`` rule, so NaN payloads and signed zeros count too.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from pfa_verify.golden import SPEC_CODEC, contiguous_to_paged
from pfa_verify.properties.rule import compare as cmp

__all__ = ["bits", "assert_identical", "HandCase", "hand_case", "call_id", "clone_tensors", "assert_unchanged"]

_INT_VIEW = {
    torch.float8_e4m3fn: torch.uint8,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int32,  # two int32 halves: an int64 view would not survive compare's float64 view
}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The integer view of ``t``'s storage (integers are returned as they are)."""
    if t.dtype in _INT_VIEW:
        return t.contiguous().view(_INT_VIEW[t.dtype])
    return t


def assert_identical(actual: torch.Tensor, expected: torch.Tensor, identifier: str = "Tensors") -> None:
    """Bit-for-bit equality of two tensors of the same dtype (shape and dtype checked first):
    properties.rule.compare's ``exact`` kind, which compares floats through their integer views."""
    __tracebackhide__ = True
    cmp.assert_close(actual.contiguous(), expected.contiguous(), kind="exact", identifier=identifier)


def call_id(name: str, **kwargs: object) -> str:
    """A test id that reads as a call: ``call_id("f", x=1)`` -> ``"f(x=1)"``."""
    return f"{name}(" + ", ".join(f"{k}={v}" for k, v in kwargs.items()) + ")"


@dataclass(frozen=True)
class HandCase:
    """The arguments of one ``paged_attention_fp8`` call, built from E4M3-exact values."""

    q: torch.Tensor
    q_scale: torch.Tensor
    k_cache: torch.Tensor
    k_scale: torch.Tensor
    v_cache: torch.Tensor
    v_scale: torch.Tensor
    block_table: torch.Tensor
    kv_act_seqs: torch.Tensor

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.q, self.q_scale, self.k_cache, self.k_scale, self.v_cache, self.v_scale,
                self.block_table, self.kv_act_seqs)

    def replace(self, **changes: torch.Tensor) -> HandCase:
        return replace(self, **changes)


def _fp8(values: object) -> torch.Tensor:
    x = torch.as_tensor(values, dtype=torch.float32)
    codes = SPEC_CODEC.to_fp8(x)
    # The helper is for hand-worked examples: every value must already be on the E4M3 grid.
    assert torch.equal(SPEC_CODEC.from_fp8(codes), x), f"not E4M3-exact: {values!r}"
    return codes


def hand_case(*, q, q_scale, k, k_scale, v, v_scale, block_table, kv_act_seqs, block_size) -> HandCase:
    """A case from contiguous lists: q [B*S1, NQ, D], k / v [B, S, NKV, D], k_scale [B, S, NKV, 1].

    K and V are paged through ``block_table`` (int32 [B, MAXB]) with NB = 1 + the largest entry;
    unread cells hold 0.
    """

    table = torch.tensor(block_table, dtype=torch.int32)
    lengths = torch.tensor(kv_act_seqs, dtype=torch.int32)
    num_blocks = int(table.max()) + 1
    page = dict(block_table=table, kv_act_seqs=lengths, block_size=block_size, num_blocks=num_blocks)
    return HandCase(
        q=_fp8(q), q_scale=torch.tensor(q_scale, dtype=torch.float32),
        k_cache=contiguous_to_paged(_fp8(k), **page),
        k_scale=contiguous_to_paged(torch.tensor(k_scale, dtype=torch.float32), **page),
        v_cache=contiguous_to_paged(_fp8(v), **page),
        v_scale=torch.tensor(v_scale, dtype=torch.float32),
        block_table=table, kv_act_seqs=lengths,
    )


def clone_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in tensors.items()}


def assert_unchanged(after: dict[str, torch.Tensor], before: dict[str, torch.Tensor], what: str) -> None:
    """Every tensor of ``after`` bit-identical to its copy in ``before``."""
    __tracebackhide__ = True
    for name, t in before.items():
        assert_identical(after[name], t, identifier=f"{name} after {what}")

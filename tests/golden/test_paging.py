"""golden/paging.py, SPEC §1 and §2 item 2: block tables (unique blocks, -1 padding, spare
blocks, determinism) and the contiguous <-> paged layouts (round trips in fp8 and float32, fill
only in unread cells). Bad arguments: tests/golden/test_validate.py."""
from __future__ import annotations

import math

import golden_helpers as gh
import numpy as np
import pytest
import torch

from pfa_verify.golden import SPEC_CODEC, contiguous_to_paged, gen_block_table, paged_to_contiguous, paging
from pfa_verify.golden.paging import blocks_needed, ceil_div, positive_int, token_slots

TABLES = [  # (kv_act_seqs, block_size, max_blocks_per_query, num_blocks)
    ([5, 0, 8, 1], 4, 3, None),
    ([5, 0, 8, 1], 4, 5, 20),
    ([0, 0], 16, 1, None),
    ([128, 129, 256], 128, 3, None),
    ([1], 1, 7, 9),
]


@pytest.mark.parametrize("lengths, bs, maxb, nb", TABLES,
                         ids=[gh.call_id("gen_block_table", kv=l, bs=b, maxb=m, nb=n) for l, b, m, n in TABLES])
def test_gen_block_table(lengths, bs, maxb, nb):
    table = gen_block_table(lengths, bs, maxb, num_blocks=nb, generator=torch.Generator().manual_seed(0))
    assert table.dtype == torch.int32 and table.shape == (len(lengths), maxb)
    needed = [math.ceil(n / bs) for n in lengths]
    for b, k in enumerate(needed):
        assert (table[b, :k] >= 0).all(), f"row {b}: -1 inside its {k} needed blocks"
        assert (table[b, k:] == -1).all(), f"row {b}: not -1 exactly past its {k} needed blocks"
    used = table[table >= 0]
    assert used.numel() == sum(needed)
    assert used.unique().numel() == used.numel(), "a physical block is owned twice"
    total = nb if nb is not None else max(sum(needed), 1)
    assert used.numel() == 0 or int(used.max()) < total
    if nb is None:  # the default NB is exactly what the lengths need: every block is used
        assert sorted(used.tolist()) == list(range(sum(needed)))


def test_gen_block_table_spare_blocks():
    table = gen_block_table([8, 8], 4, 2, num_blocks=100, generator=torch.Generator().manual_seed(1))
    used = set(table.flatten().tolist())
    assert len(used) == 4 and used <= set(range(100))
    assert max(used) >= 4, "with 96 spare blocks the draw should reach past the first four"


def test_gen_block_table_is_deterministic_for_a_generator():
    def draw(seed):
        return gen_block_table([40, 17, 0, 64], 8, 8, num_blocks=30, generator=torch.Generator().manual_seed(seed))

    gh.assert_identical(draw(5), draw(5), "same seed")
    assert not torch.equal(draw(5), draw(6)), "different seeds gave the same table"


def test_gen_block_table_is_shuffled():
    tables = {tuple(gen_block_table([64], 1, 64, generator=torch.Generator().manual_seed(s))[0].tolist()) for s in range(3)}
    assert len(tables) == 3 and tuple(range(64)) not in tables


def test_gen_block_table_accepts_tensors():
    for dtype in (torch.int32, torch.int64):
        table = gen_block_table(torch.tensor([3, 9], dtype=dtype), 4, 3, generator=torch.Generator().manual_seed(2))
        gh.assert_identical(table, gen_block_table([3, 9], 4, 3, generator=torch.Generator().manual_seed(2)), str(dtype))


def test_blocks_needed_and_token_slots():
    lengths = torch.tensor([3, 0, 5])
    assert blocks_needed(lengths, 2).tolist() == [2, 0, 3]
    assert blocks_needed(lengths.numpy(), 2).tolist() == [2, 0, 3]  # the golden's numpy path
    table = torch.tensor([[4, 1, -1], [-1, -1, -1], [0, 2, 3]], dtype=torch.int32)
    b, t, block, row = token_slots(table, lengths, 2)
    assert list(zip(b.tolist(), t.tolist(), block.tolist(), row.tolist(), strict=True)) == [
        (0, 0, 4, 0), (0, 1, 4, 1), (0, 2, 1, 0),
        (2, 0, 0, 0), (2, 1, 0, 1), (2, 2, 2, 0), (2, 3, 2, 1), (2, 4, 3, 0),
    ]


def test_contiguous_to_paged_hand_worked():
    # BS = 2; batch 0 has 3 tokens in blocks 2 then 0; batch 1 has 1 token in block 1.
    x = torch.arange(1, 9, dtype=torch.float32).view(2, 4, 1, 1)  # batch 0: 1..4, batch 1: 5..8
    table = torch.tensor([[2, 0], [1, -1]], dtype=torch.int32)
    paged = contiguous_to_paged(x, table, [3, 1], block_size=2, num_blocks=4, fill=-1.0)
    assert paged.shape == (4, 2, 1, 1)
    assert paged.flatten().tolist() == [3.0, -1.0, 5.0, -1.0, 1.0, 2.0, -1.0, -1.0]
    back = paged_to_contiguous(paged, table, [3, 1], seq_len=4, fill=0.0)
    assert back.flatten().tolist() == [1.0, 2.0, 3.0, 0.0, 5.0, 0.0, 0.0, 0.0]


def layout_case(dtype: torch.dtype):
    """A ragged case with spare blocks and spare table columns, in ``dtype``."""
    lengths = [7, 0, 16, 1, 9]
    bs, maxb, nb, seq = 4, 6, 20, 16
    table = gen_block_table(lengths, bs, maxb, num_blocks=nb, generator=torch.Generator().manual_seed(3))
    x = torch.randn(len(lengths), seq, 2, 3, generator=torch.Generator().manual_seed(4))
    if dtype == torch.float8_e4m3fn:
        x = SPEC_CODEC.to_fp8(x * 100)
    return x, table, lengths, bs, nb, seq


@pytest.mark.parametrize("scatter", [None, 1, 5], ids=["every token at once", "a token at a time", "5 tokens at a time"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float8_e4m3fn], ids=["float32", "float8_e4m3fn"])
def test_layout_round_trip(dtype, scatter, monkeypatch):
    """contiguous_to_paged copies golden.paging.SCATTER_TOKENS tokens at a time; any slicing gives the layout."""
    if scatter is not None:
        monkeypatch.setattr(paging, "SCATTER_TOKENS", scatter)
    x, table, lengths, bs, nb, seq = layout_case(dtype)
    paged = contiguous_to_paged(x, table, lengths, block_size=bs, num_blocks=nb)
    assert paged.dtype == dtype and paged.shape == (nb, bs, 2, 3)
    back = paged_to_contiguous(paged, table, lengths, seq_len=seq)
    for b, n in enumerate(lengths):
        gh.assert_identical(back[b, :n], x[b, :n], f"batch {b}'s {n} tokens")
        assert (gh.bits(back[b, n:]) == 0).all(), f"batch {b} past its length is not the fill"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float8_e4m3fn], ids=["float32", "float8_e4m3fn"])
def test_fill_lands_only_in_unread_cells(dtype):
    x, table, lengths, bs, nb, seq = layout_case(dtype)
    paged = contiguous_to_paged(x, table, lengths, block_size=bs, num_blocks=nb, fill=math.nan)
    read = torch.zeros(nb, bs, dtype=torch.bool)
    for b, n in enumerate(lengths):
        for t in range(n):
            read[int(table[b, t // bs]), t % bs] = True
    values = SPEC_CODEC.from_fp8(paged) if dtype == torch.float8_e4m3fn else paged
    assert torch.isnan(values[~read]).all(), "an unread cell does not hold the fill"
    assert not torch.isnan(values[read]).any(), "the fill landed in a cell some token lives in"
    if dtype == torch.float8_e4m3fn:
        assert (paged.view(torch.uint8)[~read] == 0x7F).all()  # NaN encoded by the spec codec
    back = paged_to_contiguous(paged, table, lengths, seq_len=seq, fill=math.nan)
    back_values = SPEC_CODEC.from_fp8(back) if dtype == torch.float8_e4m3fn else back
    for b, n in enumerate(lengths):
        assert not torch.isnan(back_values[b, :n]).any() and torch.isnan(back_values[b, n:]).all()


def test_layouts_do_not_modify_inputs():
    x, table, lengths, bs, nb, seq = layout_case(torch.float32)
    before = gh.clone_tensors({"x": x, "block_table": table})
    paged = contiguous_to_paged(x, table, lengths, block_size=bs, num_blocks=nb)
    paged_before = paged.clone()
    paged_to_contiguous(paged, table, lengths, seq_len=seq)
    gh.assert_unchanged({"x": x, "block_table": table}, before, "contiguous_to_paged")
    gh.assert_identical(paged, paged_before, "paged after paged_to_contiguous")


def test_ceil_div_is_exact_for_ints_arrays_and_tensors():
    """pfa_verify.golden.paging.ceil_div: integer arithmetic only, so no float rounding even past 2**53."""
    assert [ceil_div(n, 4) for n in (0, 1, 3, 4, 5, 8, 9)] == [0, 1, 1, 1, 2, 2, 3]
    assert ceil_div(2 ** 60 + 1, 2) == 2 ** 59 + 1              # math.ceil((2**60 + 1) / 2) is 2**59
    assert ceil_div(np.array([0, 5, 128, 129]), 128).tolist() == [0, 1, 1, 2]
    assert ceil_div(torch.tensor([0, 5, 128, 129]), 128).tolist() == [0, 1, 1, 2]


@pytest.mark.parametrize("value, minimum, error, match", [
    (0, 1, ValueError, r"^x=0 must be >= 1$"), (-1, 0, ValueError, r"^x=-1 must be >= 0$"),
    (1.0, 1, TypeError, r"^x must be an int, got float 1.0$"), (True, 0, TypeError, r"^x must be an int, got bool True$"),
    ("3", 1, TypeError, r"^x must be an int, got str '3'$"),
])
def test_positive_int_rejects(value, minimum, error, match):
    with pytest.raises(error, match=match):
        positive_int(value, "x", minimum=minimum)


def test_positive_int_returns_the_value():
    assert positive_int(3, "x") == 3 and positive_int(0, "x", minimum=0) == 0

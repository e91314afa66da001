"""golden/softmax_state.py, SPEC §2.3-2.5: the local softmax of one tile, the online (m, l, O)
update against a one-shot float64 softmax, first-tile-sets, rows without tokens, the valid mask,
and the float64-then-float32 exp decision."""
from __future__ import annotations

import math

import golden_helpers as gh
import pytest
import torch

from pfa_verify.golden import OnlineSoftmaxState
from pfa_verify.golden.softmax_state import exp_f32, local_softmax
from pfa_verify.properties.rule import compare as cmp


def scores_and_values(seed: int, rows: int, tokens: int, d: int, spread: float = 8.0):
    generator = torch.Generator().manual_seed(seed)
    s = (torch.randn(rows, tokens, generator=generator) * spread).float()
    v = torch.randn(tokens, d, generator=generator).float()
    return s, v


def run_tiles(s: torch.Tensor, v: torch.Tensor, tile: int) -> OnlineSoftmaxState:
    state = OnlineSoftmaxState.empty((s.shape[0],), v.shape[1])
    for start in range(0, s.shape[1], tile):
        m_j, p, l_j = local_softmax(s[:, start:start + tile])
        o_j = (p.double() @ v[start:start + tile].double()).float()
        state.update(m_j, l_j, o_j)
    return state


@pytest.mark.parametrize("tokens, tile", [(1, 1), (7, 7), (37, 8), (100, 16), (100, 1), (256, 128)],
                         ids=str)
def test_online_state_equals_one_shot_softmax(tokens, tile):
    s, v = scores_and_values(tokens * 31 + tile, 6, tokens, 5)
    expected = torch.softmax(s.double(), dim=-1) @ v.double()
    out = run_tiles(s, v, tile).finalize()
    assert out.dtype == torch.float32
    # float32 noise: a few ulps of the largest |O| term per rescale step
    cmp.assert_close(out.double(), expected, rtol=2.0 ** -18, atol=2.0 ** -20 * float(v.abs().max()),
                     identifier=f"online softmax over tiles of {tile} vs one-shot float64")


def test_local_softmax_hand_worked():
    s = torch.tensor([[0.0, -math.log(2.0), 1.0]], dtype=torch.float32)
    m_j, p, l_j = local_softmax(s)
    assert m_j.item() == 1.0
    expected = torch.exp(s.double() - 1.0).float()  # exp computed in float64, rounded once
    gh.assert_identical(p, expected, "P")
    assert l_j.item() == torch.tensor(expected.double().sum().item(), dtype=torch.float32).item()


def test_local_softmax_valid_mask_never_reads_invalid_columns():
    s = torch.tensor([[2.0, math.nan, 1.0, math.inf], [math.nan, math.nan, math.nan, math.nan]])
    valid = torch.tensor([[True, False, True, False], [False, False, False, False]])
    m_j, p, l_j = local_softmax(s, valid)
    ref_m, ref_p, ref_l = local_softmax(s[:1, [0, 2]])
    assert m_j[0].item() == ref_m.item() and l_j[0].item() == ref_l.item()
    assert p[0].tolist() == [ref_p[0, 0].item(), 0.0, ref_p[0, 1].item(), 0.0]
    # a row without a valid column: m = -inf, l = 0, P = 0 (no NaN)
    assert m_j[1].item() == -math.inf and l_j[1].item() == 0.0 and (p[1] == 0).all()


def test_first_tile_sets_the_state():
    state = OnlineSoftmaxState.empty((2,), 3)
    m_j = torch.tensor([[1.5], [-7.0]])
    l_j = torch.tensor([[2.25], [1.0]])
    o_j = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.5, 0.0]])
    state.update(m_j, l_j, o_j)
    gh.assert_identical(state.m, m_j, "m")
    gh.assert_identical(state.l, l_j, "l")
    gh.assert_identical(state.o, o_j, "o")
    assert state.started.all()


def test_second_tile_follows_the_update_formula():
    state = OnlineSoftmaxState.empty((1,), 2)
    state.update(torch.tensor([[1.0]]), torch.tensor([[2.0]]), torch.tensor([[4.0, -2.0]]))
    state.update(torch.tensor([[3.0]]), torch.tensor([[1.5]]), torch.tensor([[1.0, 1.0]]))
    a = torch.tensor(math.exp(1.0 - 3.0), dtype=torch.float32)  # exp(m - m'), m' = 3
    c = torch.tensor(1.0)  # exp(m_j - m')
    assert state.m.item() == 3.0
    assert state.l.item() == (a * 2.0 + c * 1.5).item()
    gh.assert_identical(state.o, (a * torch.tensor([[4.0, -2.0]]) + c * torch.tensor([[1.0, 1.0]])), "o")
    gh.assert_identical(state.finalize(), state.o / state.l, "finalize = O / l")


def test_rows_without_tokens_finalize_to_zero():
    state = OnlineSoftmaxState.empty((3,), 4)
    assert (state.finalize() == 0).all() and not torch.signbit(state.finalize()).any()
    valid = torch.tensor([[True], [False], [True]])
    m_j, _p, l_j = local_softmax(torch.tensor([[0.0, 1.0], [math.nan, math.nan], [2.0, 2.0]]),
                                valid.expand(3, 2))
    state.update(m_j, l_j, torch.ones(3, 4), valid=valid)
    out = state.finalize()
    assert (out[1] == 0).all() and torch.isfinite(out).all()
    assert state.started.flatten().tolist() == [True, False, True]


def test_valid_mask_leaves_rows_untouched():
    s, v = scores_and_values(3, 4, 16, 3)
    state = run_tiles(s[:, :8], v[:8], 8)
    before = {"m": state.m.clone(), "l": state.l.clone(), "o": state.o.clone()}
    m_j, p, l_j = local_softmax(s[:, 8:])
    o_j = (p.double() @ v[8:].double()).float()
    valid = torch.tensor([[True], [False], [True], [False]])
    state.update(m_j, l_j, o_j, valid=valid)
    for name, t in before.items():
        gh.assert_identical(getattr(state, name)[[1, 3]], t[[1, 3]], f"{name} of rows without this tile")
    full = run_tiles(s, v, 8)
    for name in ("m", "l", "o"):
        gh.assert_identical(getattr(state, name)[[0, 2]], getattr(full, name)[[0, 2]], f"{name} of updated rows")


def test_exp_f32_is_the_rounded_float64_exp_in_any_layout():
    """Decision: exp is float32(exp(float64(x))), so one element comes out the same whether it sits
    in a SIMD body or a scalar tail (the loop and vectorized goldens rely on it)."""
    x = torch.linspace(-80.0, 0.0, 1001, dtype=torch.float32)
    whole = exp_f32(x)
    gh.assert_identical(whole, torch.exp(x.double()).float(), "exp_f32")
    one_by_one = torch.cat([exp_f32(x[i:i + 1]) for i in range(0, 1001, 97)])
    gh.assert_identical(one_by_one, whole[::97], "exp_f32 element by element")


@pytest.mark.parametrize("some_rows_empty", [False, True], ids=["every row has tiles", "some rows have none"])
def test_from_tiles_is_sequential_update(some_rows_empty):
    """from_tiles over n tiles gives the same bits as n calls of update, signed zeros included, and
    never reads a tile past a row's count (those hold NaN here); so does from_tiles over the first tiles
    and fold_tiles over the others."""
    g = torch.Generator().manual_seed(3)
    for trial in range(40):
        rows, tiles, d = 5, 1 + trial % 6, 3
        m_t = torch.randn(rows, tiles, 1, generator=g) * 3
        l_t = torch.rand(rows, tiles, 1, generator=g) * 5
        o_t = torch.randn(rows, tiles, d, generator=g)
        o_t[o_t.abs() < 0.3] = -0.0
        counts = torch.randint(0 if some_rows_empty else 1, tiles + 1, (rows,), generator=g)
        past = torch.arange(tiles)[None, :, None] >= counts[:, None, None]
        one = OnlineSoftmaxState.empty((rows,), d)
        for j in range(tiles):
            one.update(m_t[:, j], l_t[:, j], o_t[:, j], valid=(j < counts)[:, None])
        many = OnlineSoftmaxState.from_tiles(m_t.masked_fill(past, math.nan), l_t.masked_fill(past, math.nan),
                                             o_t.masked_fill(past, math.nan), counts)
        for name in ("m", "l", "o"):
            assert torch.equal(getattr(one, name).view(torch.int32), getattr(many, name).view(torch.int32)), (trial, name)
        assert torch.equal(one.started, many.started), trial
        # In two windows, as the golden folds a long context: from_tiles, then fold_tiles on the rest.
        split = trial % tiles
        nan_t = [t.masked_fill(past, math.nan) for t in (m_t, l_t, o_t)]
        two = OnlineSoftmaxState.from_tiles(*(t[:, :split + 1] for t in nan_t), counts.clamp(max=split + 1))
        two.fold_tiles(*(t[:, split + 1:] for t in nan_t), (counts - split - 1).clamp(min=0))
        for name in ("m", "l", "o"):
            assert torch.equal(getattr(one, name).view(torch.int32), getattr(two, name).view(torch.int32)), (trial, name)
        assert torch.equal(one.started, two.started), trial


def test_from_tiles_broadcasts_counts_and_rejects_out_of_range():
    m_t, l_t, o_t = torch.zeros(2, 3, 4, 1), torch.ones(2, 3, 4, 1), torch.ones(2, 3, 4, 2)
    state = OnlineSoftmaxState.from_tiles(m_t, l_t, o_t, torch.tensor([4, 0, 2]))  # [3] -> [2, 3]
    assert state.started[..., 0].tolist() == [[True, False, True]] * 2
    gh.assert_identical(state.finalize()[:, 1], torch.zeros(2, 2), "rows without a tile")
    for bad in (torch.tensor([5]), torch.tensor([-1])):
        with pytest.raises(ValueError, match=r"tiles_per_row must lie in \[0, 4\]"):
            OnlineSoftmaxState.from_tiles(m_t, l_t, o_t, bad)
    with pytest.raises(ValueError, match=r"tiles_per_row of shape \(2,\) does not broadcast to the rows \(2, 3\)"):
        OnlineSoftmaxState.from_tiles(m_t, l_t, o_t, torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="tiles_per_row must be an integer tensor"):
        OnlineSoftmaxState.from_tiles(m_t, l_t, o_t, torch.tensor([1.0]))

"""The stage models of the online update and the output (SPEC §2.3's update, §2.4), written from the spec
as properties/diagnosis/stage_models.py's are: the staged golden (kernels/mutants/staged.py) with its update or its
final division changed. Each slip is one a kernel engineer makes writing the recurrence

    m' = max(m, m_j),  a = exp(m - m'),  c = exp(m_j - m'),  l' = a l + c l_j,  O' = a O + c O_j,  out = O / l

by hand: the running max never stored, or stored before ``a`` is taken; the two factors swapped (for O, for O
from an empty first state, for O and l); the tile's factor ``c`` left out; the state started at m = 0; the
output not divided, or divided by the last tile's l_j. properties/diagnosis/stage_models.py lists them with the rest.
"""
from __future__ import annotations

from typing import Any

import torch

from pfa_verify.golden.softmax_state import exp_f32
from pfa_verify.kernels.mutants.staged import StagedGolden, WrittenOutUpdate

__all__ = ["RunningMaxNotUpdated", "ORescaleFactorsSwapped", "RescaleFactorsSwapped", "ORescaleFactorsSwappedFromEmpty",
           "NotNormalized", "RescaleAfterMaxStored", "OnlineMaxStartsAtZero", "TileFactorForgotten",
           "DividedByLastTileSum"]


class RunningMaxNotUpdated(WrittenOutUpdate):
    store_max = False


# §2.3, the online update: O's two factors swapped (the running O times the tile's exp(m_j - m'), the
# tile's O_j times the old exp(m - m')), or both O's and l's. A kernel that starts from (m, l, O) =
# (-inf, 0, 0) and runs the update on the first tile too (the same result when the update is right)
# loses the first tile's O_j to the swap: exp(-inf) = 0 multiplies it.


class ORescaleFactorsSwapped(WrittenOutUpdate):
    swap_l = False
    from_empty = False

    def update(self, state: Any, m_j: torch.Tensor, l_j: torch.Tensor, o_j: torch.Tensor, *,
               p: torch.Tensor | None = None, valid: torch.Tensor | None = None) -> None:
        if not bool(state.started.any()):
            state.started = torch.ones_like(state.started)
            if not self.from_empty:
                state.m, state.l, state.o = m_j, l_j, o_j
                return
        m_new = torch.maximum(state.m, m_j)
        a, c = exp_f32(state.m - m_new), exp_f32(m_j - m_new)
        state.l = c * state.l + a * l_j if self.swap_l else a * state.l + c * l_j
        state.o, state.m = c * state.o + a * o_j, m_new


class RescaleFactorsSwapped(ORescaleFactorsSwapped):
    swap_l = True


class ORescaleFactorsSwappedFromEmpty(ORescaleFactorsSwapped):
    from_empty = True


# §2.4: the output is O without the division by l.


class NotNormalized(StagedGolden):
    def finalize(self, state: Any) -> torch.Tensor:
        return torch.where(state.started, state.o, 0.0)


# §2.3, the online update: the new max stored before the old one's factor is taken, so a = exp(m' - m') = 1
# (the running O and l are never scaled down when the max moves): the written-out update without a.
class RescaleAfterMaxStored(WrittenOutUpdate):
    rescale_o = rescale_l = False


# §2.3, the online update's start: the running max taken as 0 (not -inf) and the update run on the first
# tile too: a row whose scores all lie far below 0 underflows exp(m_j - 0), and l and O with it.
class OnlineMaxStartsAtZero(WrittenOutUpdate):
    def update(self, state: Any, m_j: torch.Tensor, l_j: torch.Tensor, o_j: torch.Tensor, *,
               p: torch.Tensor | None = None, valid: torch.Tensor | None = None) -> None:
        if not bool(state.started.any()):
            state.m, state.l = torch.zeros_like(m_j), torch.zeros_like(l_j)
            state.o, state.started = torch.zeros_like(o_j), torch.ones_like(state.started)
        super().update(state, m_j, l_j, o_j, p=p, valid=valid)  # type: ignore[no-untyped-call]  # WrittenOutUpdate.update is unannotated (kernels/mutants/staged.py)


# §2.3: the tile's factor c = exp(m_j - m') left out: l' = a l + l_j, O' = a O + O_j. Right while the newest
# tile holds the row's max (c = 1), wrong once an earlier tile's max is larger.
class TileFactorForgotten(WrittenOutUpdate):
    scale_tile = False


# §2.4: O divided by the last tile's own sum l_j (the local variable the loop left behind), not the running l.
class DividedByLastTileSum(StagedGolden):
    def update(self, state: Any, m_j: torch.Tensor, l_j: torch.Tensor, o_j: torch.Tensor, *,
               p: torch.Tensor | None = None, valid: torch.Tensor | None = None) -> None:
        super().update(state, m_j, l_j, o_j, p=p, valid=valid)
        state.last_l = l_j

    def finalize(self, state: Any) -> torch.Tensor:
        last_l = getattr(state, "last_l", state.l)
        return torch.where(state.started, state.o / torch.where(state.started, last_l, 1.0), 0.0)

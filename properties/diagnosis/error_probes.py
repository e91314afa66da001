"""What an error needs: the kernel run on neighbours of a case it raised on.

A kernel that raises (an out-of-bounds read, a shape it does not handle) gives no output to score fault
models against, so the diagnosis of an error is its probes alone: the case changed one SPEC quantity at a
time, and on each whether the kernel still raises, or runs and passes or fails the rule. The first
neighbour is the one an out-of-bounds table read needs: the case's own block table padded with -1 columns
to a whole number of tiles, pool and data unchanged (SPEC §5: upstream never checks a table narrower than
the tile walk); then the
neighbours of properties/diagnosis/probes.py (a length to or from a multiple of s2_tile, one tile against two, the
batches' lengths in another order, one more KV head, one more query row, other data) and the ablations
that keep one batch or one tile. "error" on one and "passes" on another says what the error needs,
beside what the run's erroring cases share (properties/diagnosis/separation.py). The kernel passing on the padded
table where it raised on the case, and raising again on another neighbour, locates the error in the tile
walk (its read of the table). Within the probes' budget of kernel calls and seconds; never a verdict.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterator

import torch

from pfa_verify import golden
from pfa_verify.golden.paging import ceil_div
from pfa_verify.properties.diagnosis.ablations import ablations
from pfa_verify.properties.diagnosis.diagnosis import Diagnosis
from pfa_verify.properties.diagnosis.probes import MAX_CALLS, PROBE_BUDGET_S, neighbours, outcome_probes
from pfa_verify.properties.diagnosis.readout import Location
from pfa_verify.properties.rule.acceptance import JudgedBackend
from pfa_verify.properties.rule.case import Case

__all__ = ["probe_error", "error_neighbours", "WIDENED"]

#: How the neighbour with the block table widened to whole tiles begins its description.
WIDENED = "block table widened"


def error_neighbours(case: Case) -> Iterator[tuple[str, Case]]:
    """(what changed, the neighbour) of ``case`` for an error: its own block table padded with -1 columns to
    the whole tile walk first (the same pool of blocks, the same data: the width alone changes), then
    properties.diagnosis.probes.neighbours and the one-batch and one-tile ablations, each config once."""
    c = case.config
    tile_blocks = max(1, c.s2_tile // c.block_size)
    columns = c.table_columns
    wide = ceil_div(columns, tile_blocks) * tile_blocks           # a whole number of tiles of columns
    if wide != columns:
        tensors = case.inputs().tensors()
        table = tensors["block_table"]
        padded = torch.cat([table, torch.full((table.shape[0], wide - columns), -1, dtype=table.dtype)], dim=1)
        yield (f"{WIDENED} from {columns} to {wide} columns (-1 filled: a whole number of tiles)",
               dataclasses.replace(case, name=None, explicit={**tensors, "block_table": padded}))
    yield from itertools.chain(neighbours(case), ablations(case, ("one batch", "one tile")))


def probe_error(case: Case, backend: JudgedBackend, error: str, *, max_calls: int = MAX_CALLS,
                budget_s: float = PROBE_BUDGET_S, codec: golden.Fp8Codec | None = None,
                stop: Callable[[], object] | None = None) -> Diagnosis:
    """The diagnosis of the error ``error`` (its first line) the kernel raised on ``case``: no candidates,
    the probes of :func:`error_neighbours`, at most ``max_calls`` kernel calls and about ``budget_s``
    seconds; ``codec`` the backend's (default the spec's) for the rule on a neighbour it runs."""
    start = time.perf_counter()
    probes = outcome_probes(backend, error_neighbours(case), codec or golden.SPEC_CODEC, calls=max_calls,
                            deadline=start + budget_s, stop=stop or (lambda: None))
    elapsed = time.perf_counter() - start
    note = (f"{len(probes)} probe{'s' if len(probes) != 1 else ''} in {elapsed:.1f} s to show what the error needs "
            f"(budget {max_calls} kernel calls, {budget_s:g} s)") if probes else \
        f"no probe: no neighbour of the case could run within the budget ({elapsed:.1f} s)"
    # The widened table changes the table's width alone: the kernel passing there where it raised on the
    # case, and raising again on another neighbour (the error is the kernel's, not a passing fault), says
    # the error needs the narrower table. Failing by values there says no more than that it ran.
    located = None
    if (probes and probes[0].change.startswith(WIDENED) and probes[0].outcome == "passes"
            and any(p.outcome == "error" for p in probes[1:])):
        located = Location("the tile walk", f"the error goes away with the {probes[0].change.split(' (')[0]}: the "
                           "walk reads block-table columns past the row's width (SPEC §5: a table narrower than "
                           "the tile walk)")
    return Diagnosis((), 0, 0, 0.0, 0.0, codec=(codec or golden.SPEC_CODEC).name, probes=tuple(probes), probe_note=note,
                     located=located, error=error.strip().splitlines()[0][:200] if error.strip() else "the kernel raised")

"""properties/search/strategies.py: validity (every draw is a config the golden accepts, with the promised
shape), reach (the special lengths, tables and fills occur; hypothesis.find) and argument checks."""
from __future__ import annotations

import math
import re

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from pfa_verify.kernels.backends import Backend, Skip
from pfa_verify.kernels.config import KERNEL_SHAPES
from pfa_verify.properties.search import strategies as ps
from pfa_verify.properties.search.directed import draw

FIND = settings(max_examples=2000, database=None, deadline=None, derandomize=True)  # find() is random otherwise: 1 of 10 runs shrank short of the target


def _widest_and_needed(config):
    need = [math.ceil(n / config.block_size) for n in config.lengths]
    return max(need + [1]), sum(need)


@given(ps.configs())
def test_configs_keep_their_promises(config):
    """What configs() promises beyond what PagedAttentionConfig enforces (its docstring and its
    strategies' defaults): s2 is the longest length, lengths within the capacity with one token at
    least, s2_tile of 1 to 4 blocks, g_tile None or a proper divisor, 0 to 2 extra table columns and 0 to
    3 spare blocks, and a table that is -1 after each row's valid blocks (the config accepts any block
    there)."""
    c = config
    widest, needed = _widest_and_needed(c)
    assert c.s2 == max(c.lengths) and 0 < max(c.lengths) <= max(c.block_size, ps.max_len() // c.block_size * c.block_size)
    assert c.s2_tile // c.block_size in (1, 2, 3, 4)
    assert c.g_tile is None or c.g_tile < c.nq // c.nkv
    assert c.max_blocks - widest in (0, 1, 2), (c.max_blocks, widest)
    assert c.num_blocks - needed in (0, 1, 2, 3), (c.num_blocks, needed)      # needed >= 1: a token at least
    for n, row in zip(c.lengths, c.block_table, strict=True):
        assert all(p == -1 for p in row[math.ceil(n / c.block_size):]), row


class _Kernel(Backend):
    """A backend as kernels.backends builds them: its shapes, and its own skip_reason (the base class's
    rule, kernels.backends.unsupported_shape), counted."""
    name = "test-kernel"

    def __init__(self, supported, refuse=None):
        self.supported_shapes, self.refuse, self.asked, self.refused = supported, refuse, 0, 0

    def skip_reason(self, config):
        self.asked += 1
        skip = super().skip_reason(config)
        if skip is None and self.refuse is not None and self.refuse(config):
            skip = Skip("unsupported", "refused by the test double")
        self.refused += skip is not None
        return skip


@given(st.data())
def test_cases_for_draw_only_what_the_backend_runs(data):
    """The one narrowing path: the backend's supported_shapes narrow the draws so that its own
    skip_reason refuses none of them (a refusal is a wasted draw), and a limit it declares beyond its
    shapes (here: at most 2 batches) is honoured through that skip_reason; nothing in properties/ knows
    either. The guard and the narrowing are each checked by what the backend itself answers."""
    kernel = _Kernel({"head_dim": (64,), "block_size": (32,)})
    case = data.draw(ps.cases_for(kernel), label="case")
    assert kernel.skip_reason(case.config) is None and kernel.refused == 0 and kernel.asked >= 2
    picky = _Kernel({"head_dim": (64,), "block_size": (32,)}, refuse=lambda c: c.batch > 2)
    case = data.draw(ps.cases_for(picky), label="case for a backend that runs at most 2 batches")
    assert case.config.batch <= 2 and picky.skip_reason(case.config) is None


@given(st.data())
def test_block_tables_are_valid(data):
    bs = data.draw(st.sampled_from((16, 128)), label="block_size")
    lengths = data.draw(ps.kv_act_seqs(3, block_size=bs, s2_tile=2 * bs), label="lengths")
    table = data.draw(ps.block_tables(lengths, block_size=bs), label="table")
    used = [p for row in table.table for p in row if p >= 0]
    assert len(used) == len(set(used)) and all(0 <= p < table.num_blocks for p in used)
    for n, row in zip(lengths, table.table, strict=True):
        k = math.ceil(n / bs)
        assert all(p >= 0 for p in row[:k]) and all(p == -1 for p in row[k:])


@pytest.mark.parametrize("target", [0, 1, 15, 16, 17, 31, 32, 33])
def test_kv_act_seqs_reach_special_lengths(target):
    find(ps.kv_act_seqs(2, block_size=16, s2_tile=32), lambda t: t[0] == target, settings=FIND)


@given(ps.kv_act_seqs(st.integers(1, 4), block_size=16, s2_tile=32))
def test_kv_act_seqs_always_have_a_token(lengths):
    """Every length 0 checks nothing but zeros: the catalog holds that case once, strategies never."""
    assert max(lengths) > 0


def test_kv_act_seqs_may_be_all_empty_on_request():
    find(ps.kv_act_seqs(2, block_size=16, s2_tile=32, allow_all_empty=True), lambda t: max(t) == 0, settings=FIND)


def test_kv_act_seqs_reach_row_capacity():
    find(ps.kv_act_seqs(2, block_size=16, s2_tile=16, capacity=64), lambda t: 64 in t, settings=FIND)


@pytest.mark.parametrize("name, predicate", [
    ("spare physical blocks", lambda c: c.num_blocks > sum(math.ceil(n / c.block_size) for n in c.lengths)),
    ("extra table columns", lambda c: c.max_blocks > max(math.ceil(n / c.block_size) for n in c.lengths)),
    ("a batch with no tokens next to one with tokens", lambda c: 0 in c.lengths and max(c.lengths) > 0),
    ("nan garbage", lambda c: c.garbage == "nan"),
    ("huge garbage", lambda c: c.garbage == "huge"),
    ("split group (g_tile < group)", lambda c: c.g_tile is not None and c.g_tile < c.nq // c.nkv),
    ("a tail tile of 3 tokens", lambda c: any(n > c.s2_tile and n % c.s2_tile == 3 for n in c.lengths)),
    ("causal S1 > 1 with a row that sees nothing", lambda c: c.s1 > 1 and any(0 < n < c.s1 for n in c.lengths)),
    ("GQA grouping", lambda c: c.nq > c.nkv),
    ("outlier rows", lambda c: c.distribution == "outliers"),
    ("tiny magnitudes", lambda c: c.distribution == "tiny"),
    ("attention sinks", lambda c: c.distribution == "sinks"),
    ("outlier channels", lambda c: c.distribution == "outlier_channels"),
    ("plausible garbage", lambda c: c.garbage == "plausible"),
    ("a length on a late block boundary", lambda c: any(n >= 4 * c.block_size and n % c.block_size in (0, 1, c.block_size - 1)
                                                        for n in c.lengths)),
    ("a row whose blocks are out of order", lambda c: any(list(r) != sorted(r) for r in _valid_rows(c))),
    ("a layout that is not the identity", lambda c: c.block_table != _identity(c) and c.batch >= 2),
])
def test_configs_reach(name, predicate):
    find(ps.configs(), predicate, settings=FIND)


def _valid_rows(c):
    return [row[:math.ceil(n / c.block_size)] for n, row in zip(c.lengths, c.block_table, strict=True)]


def _identity(c):
    """The identity layout of ``c``'s shape: row b owns the next blocks in order, 0 first."""
    rows, k = [], 0
    for n in c.lengths:
        need = math.ceil(n / c.block_size)
        rows.append(tuple(range(k, k + need)) + (-1,) * (c.max_blocks - need))
        k += need
    return tuple(rows)


def test_block_tables_shrink_towards_the_identity_layout_then_fewer_columns():
    """Pinned shrink targets of the drawn table (properties.search.strategies.block_tables, carried in the config):
    a table that must not be the identity shrinks to the smallest permutation, one token in block 1 with
    block 0 spare; one that only needs a second column shrinks to the identity with one extra column."""
    c = find(ps.configs(), lambda c: c.block_table != _identity(c), settings=FIND)
    assert (c.lengths, c.block_table, c.num_blocks, c.max_blocks) == ((1,), ((1,),), 2, 1)
    c = find(ps.configs(), lambda c: c.max_blocks >= 2, settings=FIND)
    assert (c.lengths, c.block_table, c.num_blocks) == ((1,), ((0, -1),), 1)


def test_shrinks_towards_small_cases():
    c = find(ps.configs(), lambda c: max(c.lengths) > c.s2_tile, settings=FIND)
    assert c.batch == 1 and c.s1 == 1 and c.lengths[0] == c.s2_tile + 1 and c.block_size == 16


def e(fn, *args, **kwargs):
    """A row of the bad-argument table, its id the call: e(ps.dims, batch=0)(ValueError, "batch") is
    'dims(batch=0)' expecting a ValueError whose message starts with the argument ``batch``."""
    def expecting(error, argument):
        return pytest.param(fn, args, kwargs, error, argument, id=f"{fn.__name__}(" + ", ".join(
            [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]) + ")")
    return expecting


@pytest.mark.parametrize("fn, args, kwargs, error, argument", [
    e(ps.dims, batch=0)(ValueError, "batch"), e(ps.dims, nkv=1.5)(TypeError, "nkv"),
    e(ps.dims, group=True)(TypeError, "group"), e(ps.dims, head_dim=())(ValueError, "head_dim"),
    e(ps.dims, s2_tile_blocks=0)(ValueError, "s2_tile_blocks"),
    e(ps.kv_act_seqs, 2, block_size=0, s2_tile=16)(ValueError, "block_size"),
    e(ps.kv_act_seqs, 2, block_size=16, s2_tile=24)(ValueError, "s2_tile"),
    e(ps.kv_act_seqs, 0, block_size=16, s2_tile=16)(ValueError, "batch"),
    e(ps.kv_act_seqs, 1, block_size=16, s2_tile=16, capacity=-1)(ValueError, "capacity"),
    e(ps.block_tables, (1, 2), block_size=0)(ValueError, "block_size"),
    e(ps.block_tables, (1,), block_size=16, extra_columns=-1)(ValueError, "extra_columns"),
    e(ps.block_tables, (1, -1), block_size=16)(ValueError, "lengths[1]"),
    e(ps.block_tables, "12", block_size=16)(TypeError, "lengths"),
    e(ps.configs, garbage=("zeros",))(ValueError, "garbage"), e(ps.configs, distribution=())(ValueError, "distribution"),
    e(ps.configs, spare_blocks=-1)(ValueError, "spare_blocks"), e(ps.configs, capacity=-1)(ValueError, "capacity"),
    e(ps.cases, seed=-1)(ValueError, "seed"), e(ps.cases_for, None, seed=1.0)(TypeError, "seed"),
    e(ps.cases_for, None, batch=0)(ValueError, "batch"),
    e(ps.quant_rows, rows=0)(ValueError, "rows"), e(ps.at12_cases, k_tile=0)(ValueError, "k_tile"),
])
def test_bad_arguments_raise_naming_them(fn, args, kwargs, error, argument):
    """Each row names the one argument its message must start with, and the exception type: TypeError
    for a value that is not an int (golden.paging.positive_int), ValueError for a value out of range."""
    with pytest.raises(error) as info:
        fn(*args, **kwargs)
    assert type(info.value) is error
    assert re.match(rf"{re.escape(argument)}(=| must)", str(info.value)), (argument, str(info.value))


@pytest.mark.parametrize("distribution", ps.DISTRIBUTIONS)
def test_kernel_sized_cases_draw_every_distribution(distribution):
    """Kernel backends draw every value distribution: the acceptance envelope (SPEC §4.2) judges outlier
    channels and sinks soundly, so nothing is left out (tests/properties/test_one_rule_envelope.py)."""
    find(ps.cases_for(KERNEL_SHAPES), lambda c: c.config.distribution == distribution, settings=FIND)


@pytest.mark.parametrize("bad", [-1.0, 0.0, float("nan"), True, "0.1", [0.1, float("inf")]])
def test_a_softmax_scale_that_is_not_a_finite_positive_float_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="softmax_scale="):
        ps.configs(softmax_scale=bad)


def test_the_drawn_cases_carry_the_default_softmax_scale_and_the_custom_ones():
    """Before the strategies drew one, no case carried a softmax_scale: a kernel that ignores the argument
    passed every law. A plain draw holds both the default (None) and every custom value."""
    scales = {case.config.softmax_scale for case in draw(ps.cases_for(), 0, 200)}
    assert scales == {None, *ps.CUSTOM_SOFTMAX_SCALES}

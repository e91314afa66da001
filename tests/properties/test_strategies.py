"""properties/strategies.py: validity (every draw is a config the golden accepts, with the promised
shape), reach (the special lengths, tables and fills occur; hypothesis.find) and argument checks."""
from __future__ import annotations

import math

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from properties import strategies as ps

FIND = settings(max_examples=2000, database=None, deadline=None)


@given(ps.configs())
def test_configs_are_valid(config):
    group = config.nq // config.nkv
    assert config.nq % config.nkv == 0 and config.s2_tile % config.block_size == 0
    assert config.g_tile is None or group % config.g_tile == 0
    need = [math.ceil(n / config.block_size) for n in config.lengths]
    assert config.max_blocks >= max(need + [1]) and config.num_blocks >= sum(need)
    assert max(config.lengths) <= ps.MAX_LEN


@given(ps.kernel_configs())
def test_kernel_configs_are_a_narrowing(config):
    assert ps.kernel_supports(config)


@given(st.data())
def test_cases_for_follow_the_backend_and_the_narrowing(data):
    from types import SimpleNamespace
    kernel = SimpleNamespace(supported_shapes={"head_dim": (64,), "block_size": (32,)})
    case = data.draw(ps.cases_for(kernel, group=st.just(2), s1=st.integers(2, 3), spare_blocks=st.just(1)))
    c = case.config
    assert (c.head_dim, c.block_size, c.nq // c.nkv) == (64, 32, 2) and c.s1 >= 2 and c.s2_tile in (32, 64)
    need = sum(math.ceil(n / c.block_size) for n in c.lengths)
    assert c.num_blocks == max(1, need + 1)
    anything = data.draw(ps.cases_for(None))
    assert anything.config.head_dim in (16, 32, 64, 128)


@given(st.data())
def test_block_tables_are_valid(data):
    bs = data.draw(st.sampled_from((16, 128)), label="block_size")
    lengths = data.draw(ps.kv_act_seqs(3, block_size=bs, s2_tile=2 * bs), label="lengths")
    table = data.draw(ps.block_tables(lengths, block_size=bs), label="table")
    used = [p for row in table.table for p in row if p >= 0]
    assert len(used) == len(set(used)) and all(0 <= p < table.num_blocks for p in used)
    for n, row in zip(lengths, table.table):
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
])
def test_configs_reach(name, predicate):
    find(ps.configs(), predicate, settings=FIND)


def test_shrinks_towards_small_cases():
    c = find(ps.configs(), lambda c: max(c.lengths) > c.s2_tile, settings=FIND)
    assert c.batch == 1 and c.s1 == 1 and c.lengths[0] == c.s2_tile + 1 and c.block_size == 16


def e(fn, *args, **kwargs):
    """Render a call for test ids: e(ps.dims, batch=0) -> 'dims(batch=0)'."""
    return pytest.param(fn, args, kwargs, id=f"{fn.__name__}(" + ", ".join(
        [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]) + ")")


@pytest.mark.parametrize("fn, args, kwargs", [
    e(ps.dims, batch=0), e(ps.dims, nkv=1.5), e(ps.dims, group=True), e(ps.dims, head_dim=()),
    e(ps.dims, s2_tile_blocks=0),
    e(ps.kv_act_seqs, 2, block_size=0, s2_tile=16), e(ps.kv_act_seqs, 2, block_size=16, s2_tile=24),
    e(ps.kv_act_seqs, 0, block_size=16, s2_tile=16), e(ps.kv_act_seqs, 1, block_size=16, s2_tile=16, capacity=-1),
    e(ps.block_tables, (1, 2), block_size=0), e(ps.block_tables, (1,), block_size=16, extra_columns=-1),
    e(ps.configs, garbage=("zeros",)), e(ps.configs, distribution=()), e(ps.cases, seed=-1),
    e(ps.quant_rows, rows=0), e(ps.at12_cases, k_tile=0),
])
def test_bad_arguments_raise_value_error_naming_them(fn, args, kwargs):
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    named = list(kwargs) or ["batch"]
    assert any(n in str(info.value) for n in named + ["batch", "lengths"])


@pytest.mark.parametrize("distribution", ps.DISTRIBUTIONS)
def test_kernel_sized_cases_draw_every_distribution(distribution):
    """Kernel backends draw every value distribution: the acceptance envelope (SPEC §4.2) judges outlier
    channels and sinks soundly, so nothing is left out (tests/properties/test_one_rule_envelope.py)."""
    find(ps.kernel_configs(), lambda c: c.distribution == distribution, settings=FIND)

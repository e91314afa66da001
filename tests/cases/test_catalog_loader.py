"""cases/data/catalog.py, catalog.json and catalog.schema.json: SPEC §5 names verbatim, defaults as data, bad input
rejected naming the case and the key."""
from __future__ import annotations

import json
import math

import pytest
import torch

from pfa_verify.cases.data import catalog, schemas
from pfa_verify.golden.errors import UsageError


def test_catalog_holds_the_six_spec_cases_by_name():
    cases = catalog.load_catalog()
    assert [n for n in cases if n.startswith("pfa_fp8_")] == list(catalog.SPEC_CASE_NAMES)
    for name in catalog.SPEC_CASE_NAMES:
        c = cases[name].config
        assert c.head_dim == 128 and c.block_size == 128 and c.g_tile is None and c.kv_act_seqs is None
        assert c.physical_blocks == c.batch * math.ceil(c.s2 / 128)  # NB = B * ceil(S2 / BS)
    assert cases["pfa_fp8_b16_s1_1_s2_8k_nkv_1"].config.s2_tile == 1024


def test_catalog_entries_list_only_differences_from_defaults():
    data = json.loads(catalog.CATALOG_PATH.read_text())
    for section in ("upstream", "edge"):
        for name, entry in data[section].items():
            same = [k for k, v in entry.items() if k in data["defaults"] and data["defaults"][k] == v]
            assert not same, f"{name} repeats defaults {same}"


EDGE = [name for name in catalog.load_catalog() if name.startswith("edge_")]


@pytest.mark.parametrize("name", EDGE)
def test_edge_cases_build_the_inputs_their_entries_describe(name):
    """Each edge case builds inputs of the SPEC §1 shapes for its entry: its lengths, its table width
    (-1 past each batch's valid blocks, SPEC §2 item 2), its physical blocks (every valid column a
    distinct block in range), and, where it asks for garbage, NaN in the cache blocks nothing reads."""
    c = catalog.load_catalog()[name].config
    b = catalog.load_catalog()[name].inputs()
    nb, maxb = c.physical_blocks, c.table_columns
    assert b.q.shape == (c.batch * c.s1, c.nq, c.head_dim) and b.q_scale.shape == (c.batch * c.s1, c.nq, 1)
    assert b.k_cache.shape == b.v_cache.shape == (nb, c.block_size, c.nkv, c.head_dim)
    assert b.k_scale.shape == (nb, c.block_size, c.nkv, 1) and b.v_scale.shape == (c.batch, c.nkv, c.head_dim)
    assert b.block_table.shape == (c.batch, maxb) and b.kv_act_seqs.tolist() == list(c.lengths)
    valid = [b.block_table[k, :math.ceil(n / c.block_size)].tolist() for k, n in enumerate(c.lengths)]
    used = [blk for row in valid for blk in row]
    assert all(0 <= blk < nb for blk in used) and len(set(used)) == len(used), b.block_table
    assert all((b.block_table[k, len(row):] == -1).all() for k, row in enumerate(valid)), b.block_table
    unread = sorted(set(range(nb)) - set(used))
    if c.garbage == "nan" and unread:
        assert torch.isnan(b.k_cache[unread].float()).all() and torch.isnan(b.v_cache[unread].float()).all()


GOOD = {"batch": 1, "s1": 1, "s2": 16, "nq": 2, "nkv": 1, "block_size": 16, "s2_tile": 16}


def doc(**entry):
    return json.dumps({"defaults": {"head_dim": 16}, "edge": {"x": {**GOOD, **entry}}})


@pytest.mark.parametrize("text, match", [
    ('{"edge": {"x": {}, "x": {}}}', "duplicate key 'x'"),
    ('{"defaults": {}, "defaults": {}}', "duplicate key 'defaults'"),
    (doc(batchs=2), r"case 'x': unknown key\(s\) \['batchs'\]"),
    (doc(batch=0), "case 'x', key 'batch': 0 is less than the minimum of 1"),
    (doc(batch=True), "case 'x', key 'batch': True is not of type 'integer'"),
    (doc(batch=2.5), "case 'x', key 'batch': 2.5 is not of type 'integer'"),
    (doc(softmax_scale=0), "case 'x', key 'softmax_scale': 0 is less than or equal to the minimum of 0"),
    (doc(s2_tile=24), "case 'x': s2_tile=24 must be a multiple of block_size=16"),
    (doc(nq=3, nkv=2), "case 'x': nq=3 must be a multiple of nkv=2"),
    (doc(kv_act_seqs=[17]), r"case 'x': kv_act_seqs\[0\]=17 must be <= s2=16"),
    (doc(kv_act_seqs=[-1]), r"case 'x', key 'kv_act_seqs'\[0\]: -1 is less than the minimum of 0"),
    (doc(distribution="zipf"), "case 'x': distribution='zipf'"),
    (doc(seed=None), "case 'x', key 'seed': None is not of type 'integer'"),
    (json.dumps({"defaults": {"head_dim": "16"}}), "defaults, key 'head_dim': '16' is not of type 'integer'"),
    ("[]", "catalog: \\[\\] is not of type 'object'"),
    (json.dumps({"cases": {}}), r"unknown catalog section\(s\) \['cases'\]"),
    (json.dumps({"edge": {"Bad-Name": GOOD}}), "case name 'Bad-Name'"),
    (json.dumps({"upstream": {"x": GOOD}, "edge": {"x": GOOD}}), "case 'x' appears in more than one section"),
    (json.dumps({"edge": {"x": {"batch": 1}}}), r"case 'x': missing key\(s\) \['s1', 's2', 'nq', 'nkv'\]"),
    ("{", "not valid JSON"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 60 else None)
def test_loader_rejects_bad_input_naming_the_key(text, match):
    with pytest.raises(UsageError, match=match):
        catalog.parse_catalog(text)


def test_loader_accepts_a_minimal_entry():
    assert catalog.parse_catalog(doc())["x"].config.head_dim == 16


def test_the_catalog_file_matches_its_schema():
    assert schemas.errors(json.loads(catalog.CATALOG_PATH.read_text()), "catalog") == []

"""golden/inputs.py ``make_inputs``: the same config and seed give the same tensors, bit for bit,
as before its speed-up (issue 17). The sha256 digests of every tensor were stored from the code of
5a86cd3 (tests/golden/input_digests.py says how; data/make_inputs_digests.json holds them): captured
regressions store only a config and a seed, so any change here would change what they replay."""
from __future__ import annotations

import input_digests as idg
import pytest

from pfa_verify import golden

STORED = idg.load()


def _params():
    for name, entry in STORED.items():
        marks = [pytest.mark.slow] if entry["slow"] else []
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", list(_params()))
def test_make_inputs_bits_match_stored_digests(name):
    entry = STORED[name]
    config = golden.PagedAttentionConfig.from_dict(entry["config"])
    got = idg.bundle_digests(golden.make_inputs(config, entry["seed"]))
    assert set(got) == set(entry["digests"])
    changed = {k: (got[k], entry["digests"][k]) for k in got if got[k] != entry["digests"][k]}
    assert not changed, f"make_inputs({name}, seed={entry['seed']}) changed: " + "; ".join(
        f"{k}: got {g}, stored {s}" for k, (g, s) in changed.items())


def test_stored_entries_are_the_listed_ones():
    """The data file holds exactly the entries input_digests.py lists, with the same configs and seeds
    (an entry edited in one place and not the other would check something else than it says)."""
    listed = {e["name"]: e for e in idg.entries()}
    assert sorted(listed) == sorted(STORED), "run `python tests/golden/input_digests.py` to add missing digests"
    for name, entry in listed.items():
        assert (entry["config"], entry["seed"], entry["slow"]) == (
            STORED[name]["config"], STORED[name]["seed"], STORED[name]["slow"]), name


def test_digests_cover_every_distribution_and_garbage_fill():
    covered = {(e["config"]["distribution"], e["config"]["garbage"]) for e in STORED.values() if not e["slow"]}
    missing = [(d, g) for d in golden.DISTRIBUTIONS for g in golden.GARBAGE if (d, g) not in covered]
    assert not missing, (f"no stored make_inputs digest for (distribution, garbage) {missing}; "
                         "`python tests/golden/input_digests.py` adds them (existing digests are kept)")


@pytest.mark.parametrize("name", [n for n, e in STORED.items() if not e["slow"]])
def test_inputs_made_in_pieces_of_16_tokens_match_the_digests_stored_from_whole_draws(name, monkeypatch):
    """K and V made in pieces (golden.inputs.PIECE_VALUES; 16 tokens each here, the smallest piece) give
    the bits that one draw of the whole gave when the digests were stored, for every distribution: the
    generator draws the pieces' values in the same order, and the second draw of normal, outliers and
    wide comes from a second generator set where one draw of the whole would start it."""
    entry = STORED[name]
    config = golden.PagedAttentionConfig.from_dict(entry["config"])
    monkeypatch.setattr(golden.inputs, "PIECE_VALUES", 1)
    made = golden.inputs.pieces(config)
    assert len(made) > 1 or config.batch * config.s2 < 32
    got = idg.bundle_digests(golden.make_inputs(config, entry["seed"]))
    assert got == entry["digests"]

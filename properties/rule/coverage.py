"""What a run covered: named corner bins read from the contract, and the crosses that matter.

A pass says every case checked was right, not which corners were checked. As in hardware verification's
functional coverage, the corners are declared from the spec, each case is classified into them, and the
bins no case hit are *holes*. :data:`BINS` holds the single bins, each naming the SPEC line it comes from;
:data:`CROSSES` the combinations of two families that matter. :func:`classify` reads a case's config only
(no inputs are built), so a whole selection classifies in milliseconds.

Families (docs/spec.md):

- lengths (§2.1-2.3): a row's visible length at a block boundary and one either side, at a tile boundary
  and one either side; rows with ``cur == 0`` from an empty batch and from causality; rows of 1, 2 and 3 or
  more tiles; a last tile of one token;
- shapes (§1): ``S1`` of 1, 2 and 3 or more; group sizes 1, 2, 3 (not a power of two) and 4 or more; a
  ``g_tile`` that splits the group; ``NKV`` of 1, 2 and 3 or more; ``s2_tile`` of 1, 2, 3 and 4 blocks and
  the upstream tile of 8 blocks (§5); a ``softmax_scale`` the caller gives (§1, §2.3);
- values (§3): every value distribution of the golden's inputs, every kind of garbage in unused cells;
- paging (§2.2): a shuffled table, extra table columns, spare physical blocks, a table width that is not
  a multiple of the blocks per tile, a last tile that spans columns holding -1.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias

from pfa_verify import golden
from pfa_verify.golden.paging import ceil_div

__all__ = ["Bin", "Coverage", "BINS", "CROSSES", "Facts", "classify", "coverage", "coverage_text", "bin_names",
           "facts_of"]

#: What the bins read of one case (:func:`facts_of`): counts, lists of lengths and names, by fact.
Facts: TypeAlias = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Bin:
    """A named corner: ``hit(facts)`` on the facts :func:`facts_of` reads from a case's config."""
    name: str
    spec: str
    description: str
    hit: Callable[[Facts], bool] = dataclasses.field(repr=False, compare=False)


def _rows(config: golden.PagedAttentionConfig) -> list[tuple[int, int]]:
    """(batch length, cur) of every query row (SPEC §2.1)."""
    return [(length, max(0, length - (config.s1 - 1 - i))) for length in config.lengths for i in range(config.s1)]


def facts_of(config: golden.PagedAttentionConfig) -> Facts:
    """What the bins read, computed once per case (properties/diagnosis/separation.py reads them too)."""
    rows = _rows(config)
    seen = [cur for _, cur in rows if cur > 0]
    bs, tile = config.block_size, config.s2_tile
    tiles = [ceil_div(cur, tile) for cur in seen]
    group = config.nq // config.nkv
    table = [list(r) for r in config.block_table] if config.block_table is not None else None
    used = [b for r in table for b in r if b >= 0] if table else []
    blocks_needed = [ceil_div(length, bs) for length in config.lengths]
    return {
        "cur": seen, "tiles": tiles, "rows": rows, "s1": config.s1, "group": group, "nkv": config.nkv,
        "g_tile": config.g_tile or group, "tile_blocks": tile // bs, "distribution": config.distribution,
        "garbage": config.garbage, "columns": config.table_columns, "needed": max(blocks_needed, default=0),
        "physical": config.physical_blocks, "used": len(used), "lengths": config.lengths, "bs": bs, "tile": tile,
        "shuffled": bool(used) and used != sorted(used), "softmax_scale": config.softmax_scale,
        "tile_over_unused": any(_last_tile_over_unused(length, cur, bs, tile // bs, config.table_columns)
                                for length, cur in rows),
    }


def _last_tile_over_unused(length: int, cur: int, bs: int, tile_blocks: int, columns: int) -> bool:
    """Whether the last tile of a row (batch ``length``, ``cur`` visible) spans a table column past the
    batch's blocks, where the table holds -1 (SPEC §1, §2.2)."""
    if cur == 0:
        return False
    first = (ceil_div(cur, bs * tile_blocks) - 1) * tile_blocks
    return min(first + tile_blocks, columns) > ceil_div(length, bs)


def _any_cur(test: Callable[[int, Facts], bool]) -> Callable[[Facts], bool]:
    return lambda f: any(test(cur, f) for cur in f["cur"])


def _is(fact: str, value: object) -> Callable[[Facts], bool]:
    """A bin's test that ``fact`` equals ``value``."""
    return lambda f: bool(f[fact] == value)


_SINGLE: list[Bin] = [
    Bin("cur_at_block", "§2.2", "a row's visible length is a multiple of the block size", _any_cur(lambda c, f: c % f["bs"] == 0)),
    Bin("cur_block_plus_1", "§2.2", "a row's visible length is one past a block boundary", _any_cur(lambda c, f: c % f["bs"] == 1)),
    Bin("cur_block_minus_1", "§2.2", "a row's visible length is one short of a block boundary",
        _any_cur(lambda c, f: c % f["bs"] == f["bs"] - 1)),
    Bin("cur_at_tile", "§2.3", "a row's visible length is a multiple of s2_tile", _any_cur(lambda c, f: c % f["tile"] == 0)),
    Bin("cur_tile_plus_1", "§2.3", "a row ends with a one-token tile", _any_cur(lambda c, f: c % f["tile"] == 1)),
    Bin("cur_tile_minus_1", "§2.3", "a row's last tile is one token short of s2_tile",
        _any_cur(lambda c, f: c % f["tile"] == f["tile"] - 1)),
    Bin("empty_batch", "§2.5", "a batch with kv_act_seqs = 0 (its rows are 0)", lambda f: 0 in f["lengths"]),
    Bin("empty_by_causality", "§2.1, §2.5", "a row with cur = 0 in a batch that has tokens",
        lambda f: any(length > 0 and cur == 0 for length, cur in f["rows"])),
    Bin("one_tile_row", "§2.3", "a row of one tile", lambda f: 1 in f["tiles"]),
    Bin("two_tile_row", "§2.3", "a row of two tiles (one online update)", lambda f: 2 in f["tiles"]),
    Bin("three_plus_tile_row", "§2.3", "a row of three tiles or more", lambda f: any(t >= 3 for t in f["tiles"])),
    Bin("s1_1", "§1", "S1 = 1", lambda f: f["s1"] == 1),
    Bin("s1_2", "§1, §2.1", "S1 = 2 (causal rows)", lambda f: f["s1"] == 2),
    Bin("s1_3_plus", "§1, §2.1", "S1 of 3 or more", lambda f: f["s1"] >= 3),
    Bin("group_1", "§2.2", "a group of 1 (NQ = NKV)", lambda f: f["group"] == 1),
    Bin("group_2", "§2.2", "a group of 2", lambda f: f["group"] == 2),
    Bin("group_3", "§2.2", "a group of 3 (not a power of two)", lambda f: f["group"] == 3),
    Bin("group_4_plus", "§2.2", "a group of 4 or more", lambda f: f["group"] >= 4),
    Bin("split_g_tile", "§1", "a g_tile that splits the group", lambda f: f["g_tile"] < f["group"]),
    Bin("nkv_1", "§1", "NKV = 1", lambda f: f["nkv"] == 1),
    Bin("nkv_2", "§1", "NKV = 2", lambda f: f["nkv"] == 2),
    Bin("nkv_3_plus", "§1", "NKV of 3 or more", lambda f: f["nkv"] >= 3),
    *[Bin(f"s2_tile_{k}_blocks", "§1, §2.3" + (", §5" if k == 8 else ""), f"s2_tile of {k} block{'s' if k > 1 else ''}"
          + (" (the upstream tile of the 8k cases)" if k == 8 else ""), _is("tile_blocks", k))
      for k in (1, 2, 3, 4, 8)],
    *[Bin(f"distribution_{d}", "§3", f"values drawn from the {d} distribution", _is("distribution", d))
      for d in golden.DISTRIBUTIONS],
    *[Bin(f"garbage_{g or 'none'}", "§2.2", f"unused cells hold {g} garbage" if g else "unused cells left as drawn",
          _is("garbage", g)) for g in golden.GARBAGE],
    Bin("custom_softmax_scale", "§1, §2.3", "a softmax_scale given by the caller (not the default 1 / sqrt(D))",
        lambda f: f["softmax_scale"] is not None),
    Bin("shuffled_table", "§2.2", "a block table that is not in physical order", lambda f: f["shuffled"]),
    Bin("extra_columns", "§2.2", "a block table wider than the longest batch needs", lambda f: f["columns"] > f["needed"]),
    Bin("spare_blocks", "§2.2", "physical blocks no table entry uses", lambda f: f["physical"] > f["used"]),
    Bin("table_width_not_tile_multiple", "§2.2-2.3", "a table width that is not a multiple of the blocks per tile",
        lambda f: f["columns"] % f["tile_blocks"] != 0),
    Bin("last_tile_over_unused_columns", "§2.2-2.3", "a row's last tile spans table columns that hold -1 (clamped "
        "when gathered: nothing there may reach the result)", lambda f: f["tile_over_unused"]),
]

BINS: tuple[Bin, ...] = tuple(_SINGLE)
_BY_NAME = {b.name: b for b in BINS}


def _cross(a: str, b: str) -> Bin:
    first, second = _BY_NAME[a], _BY_NAME[b]
    return Bin(f"{a} x {b}", f"{first.spec}; {second.spec}", f"{first.description}, and {second.description}",
               lambda f: first.hit(f) and second.hit(f))


def _multi_tile(f: Facts) -> bool:
    return any(t >= 2 for t in f["tiles"])


def _ragged(f: Facts) -> bool:
    return len(set(f["lengths"])) > 1


_MULTI = Bin("multi_tile_rows", "§2.3", "a row of two tiles or more", _multi_tile)
_RAGGED = Bin("ragged_lengths", "§2.1", "batches of different lengths", _ragged)
_BY_NAME.update({_MULTI.name: _MULTI, _RAGGED.name: _RAGGED})

CROSSES: tuple[Bin, ...] = (
    *[_cross(f"distribution_{d}", "multi_tile_rows") for d in golden.DISTRIBUTIONS],
    *[_cross(f"garbage_{g}", "extra_columns") for g in ("nan", "huge", "plausible")],
    _cross("s1_2", "ragged_lengths"), _cross("s1_3_plus", "ragged_lengths"),
    _cross("group_2", "split_g_tile"), _cross("group_3", "split_g_tile"), _cross("group_4_plus", "split_g_tile"),
)


def bin_names() -> tuple[str, ...]:
    """Every bin's and cross's name (what ``--coverage`` accepts)."""
    return tuple(b.name for b in BINS + CROSSES)


def classify(config: golden.PagedAttentionConfig) -> frozenset[str]:
    """The names of the bins and crosses one case (a golden.PagedAttentionConfig) falls in."""
    facts = facts_of(config)
    return frozenset(b.name for b in BINS + CROSSES if b.hit(facts))


@dataclasses.dataclass(frozen=True)
class Coverage:
    """Hit counts of every bin and cross over a selection of cases; ``errored``: the bins that no checked
    case hit and a case that ended in an error did (those corners were tried, not checked: not holes of
    the selection, and not evidence either)."""
    counts: dict[str, int]
    cases: int
    errored: frozenset[str] = frozenset()

    @property
    def holes(self) -> tuple[str, ...]:
        return tuple(b.name for b in BINS if not self.counts[b.name] and b.name not in self.errored)

    @property
    def not_checked(self) -> tuple[str, ...]:
        """Bins and crosses hit only by cases that ended in an error."""
        return tuple(b.name for b in BINS + CROSSES if not self.counts[b.name] and b.name in self.errored)

    @property
    def cross_holes(self) -> tuple[str, ...]:
        return tuple(b.name for b in CROSSES if not self.counts[b.name] and b.name not in self.errored)

    @classmethod
    def from_hits(cls, hits: Mapping[str, int], cases: int) -> Coverage:
        """From hit counts by name (bins no case hit may be absent), e.g. merged from several processes."""
        return cls({b.name: int(hits.get(b.name, 0)) for b in BINS + CROSSES}, cases)

    def line(self, what: str = "checked case(s)") -> str:
        """One line: bins and crosses hit by the ``cases`` (``what`` they are), and the holes."""
        return coverage_text(self.to_dict(), what)

    def missing(self, required: Iterable[str]) -> tuple[str, ...]:
        """The required bins (names, or "all" for every single bin) that no case hit."""
        names = [b.name for b in BINS] if "all" in required else list(required)
        return tuple(n for n in names if not self.counts.get(n))

    def to_dict(self) -> dict[str, Any]:
        return {"cases": self.cases, "bins": {b.name: {"hits": self.counts[b.name], "spec": b.spec}
                                              for b in BINS + CROSSES},
                "holes": list(self.holes), "cross_holes": list(self.cross_holes), "not_checked": list(self.not_checked)}


def coverage_text(cv: Mapping[str, Any], what: str = "checked case(s)") -> str:
    """:meth:`Coverage.line` of a :meth:`Coverage.to_dict` (as a report holds it): the bins and crosses
    hit, the holes (no case tried them), and the corners only erroring cases reached (not checked)."""
    singles = [n for n in cv["bins"] if " x " not in n]
    crosses = [n for n in cv["bins"] if " x " in n]
    unchecked = list(cv.get("not_checked", ()))
    hit_singles = len(singles) - len(cv["holes"]) - len([n for n in unchecked if " x " not in n])
    hit_crosses = len(crosses) - len(cv["cross_holes"]) - len([n for n in unchecked if " x " in n])
    text = (f"Coverage: {hit_singles}/{len(singles)} bins and {hit_crosses}/{len(crosses)} crosses hit by "
            f"{cv['cases']} {what}")
    if cv["holes"]:
        text += "; holes (no case drawn there): " + ", ".join(cv["holes"])
    if cv["cross_holes"]:
        text += "; cross holes: " + ", ".join(cv["cross_holes"])
    if unchecked:
        text += "; not checked (only erroring cases reached them): " + ", ".join(unchecked)
    if cv["holes"] or cv["cross_holes"] or unchecked:
        # a hole is the verdict's limit, not a failure: nothing there was compared
        text += ". The verdict says nothing about those corners: no case there was compared"
    return text


def coverage(configs: Iterable[golden.PagedAttentionConfig],
             errored: Iterable[golden.PagedAttentionConfig] = ()) -> Coverage:
    """Hit counts of every bin and cross over ``configs`` (golden.PagedAttentionConfig values, the checked
    cases); ``errored``: the configs of cases that ended in an error (:attr:`Coverage.not_checked`)."""
    counts = {b.name: 0 for b in BINS + CROSSES}
    cases = 0
    for config in configs:
        cases += 1
        for name in classify(config):
            counts[name] += 1
    tried = frozenset(name for config in errored for name in classify(config))
    return Coverage(counts, cases, tried)

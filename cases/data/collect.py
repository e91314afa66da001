"""What ``pfa-verify run`` checks, in order: captured regressions, catalog cases, generated cases.

The first stage of the cases/ pipeline (collect -> run -> report -> html_report -> cli). A captured
case that cannot be loaded (malformed, over the memory limit) becomes an item that carries its load
error: the run reports it as an ``error`` verdict instead of stopping, since a case file is data.

The generated cases depend on the project's strategies, the Hypothesis version, the seed, the
backend's ``supported_shapes`` and the catalog cases selected only, never on what else the process
imported (drawn from seeded bytes, properties/search/generation.py): they are aimed at the coverage holes the selected catalog cases
leave first (properties/search/directed.py), then drawn as usual. :func:`selection` fingerprints what was selected, so two reports show at a
glance whether they checked the same cases (``pfa-verify compare`` refuses reports that did not).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from pfa_verify.cases.data import regressions
from pfa_verify.cases.data.catalog import load_catalog
from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels.backends import unsupported_shape
from pfa_verify.properties.rule import ledger
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.rule.coverage import classify
from pfa_verify.properties.search.directed import Aim, directed_cases, draw, plain_draws

__all__ = ["SOURCES", "Item", "generated_cases", "catalog_coverage", "collect_items", "chosen_items", "with_generated",
           "aimed",
           "case_record", "fingerprint", "selection"]

SOURCES = ("regression", "catalog", "generated")


@dataclasses.dataclass(frozen=True)
class Item:
    """One thing to run: a paged-attention :class:`~properties.rule.case.Case`, or a captured regression."""
    name: str
    source: str                    # one of SOURCES
    case: Case | None = None       # for paged cases
    regression: str | None = None  # id, for source == "regression"
    law: str = "acceptance"
    load_error: str | None = None  # why a captured case could not be loaded
    record: regressions.Regression | None = dataclasses.field(default=None, compare=False, repr=False)  # another law's
    aim: Aim | None = dataclasses.field(default=None, compare=False, repr=False)     # what drew a generated case

    @property
    def config(self) -> dict[str, Any] | None:
        cfg = getattr(self.case, "config", None)
        return cfg.to_dict() if cfg is not None and hasattr(cfg, "to_dict") else None

    @property
    def seed(self) -> int | None:
        return getattr(self.case, "seed", None)


def generated_cases(n: int, seed: int, *, supported: dict | None = None,
                    distributions: tuple[str, ...] | None = None) -> list:
    """``n`` distinct cases of the plain strategy (no aiming: the workloads of ``bench`` and
    ``tightness``), the same for the same project version, seed and hypothesis version whatever else the
    process imported (drawn from seeded bytes, properties/search/generation.py). ``supported`` (a backend's
    ``supported_shapes``) narrows them to what its kernel is built for; ``distributions`` to those value
    distributions."""
    if n <= 0:
        return []
    found: list = []
    for case in draw(Aim(None, seed, 0).strategy(supported, distributions), seed, plain_draws(n)):
        if len(found) < n and case not in found:
            found.append(case)
    return found


def catalog_coverage(items: list, supported: dict | None) -> frozenset:
    """The bins and crosses (properties.rule.coverage) the catalog cases among ``items`` hit, counting only
    those the backend's ``supported`` shapes run: what directed generation need not aim at. Captured
    regressions are left out, so a capture never changes what a seed generates."""
    hit: set = set()
    for item in items:
        if item.source == "catalog" and unsupported_shape(item.case.config, supported) is None:
            hit |= classify(item.case.config)
    return frozenset(hit)


def chosen_items(selection: str = "all", *, regressions_dir=None) -> list:
    """The captured and catalog items of ``selection``, in run order, each capture read and verified now.

    ``selection``: ``all`` (regressions + catalog), ``catalog``, ``regressions``, ``generated`` (the generated
    cases alone), or a comma-separated list of catalog names and regression ids. The regressions are the
    shipped captures and those of the user's folder ``regressions_dir`` (regressions.replayed_ids). A run reads them before
    its backend starts: nothing the backend's code does can change what was captured before it ran.
    """
    catalog = load_catalog()
    ids = regressions.replayed_ids(regressions_dir)
    where = f"{regressions.directory(regressions_dir)} or the shipped captures ({regressions.SHIPPED})"
    ledger.check(regression_ids=ids, where=where)   # a known failure must exist
    if selection == "generated":
        want_regs, want_cat = [], []
    elif selection in ("all", "catalog", "regressions"):
        want_regs = ids if selection in ("all", "regressions") else []
        want_cat = list(catalog) if selection in ("all", "catalog") else []
    else:
        names = [n.strip() for n in selection.split(",") if n.strip()]
        unknown = [n for n in names if n not in catalog and n not in ids]
        if unknown or not names:
            raise UsageError(f"--cases {selection!r}: unknown name(s) {unknown}; expected all, catalog, "
                             f"regressions, generated, or names from `pfa-verify cases list` and the catalog "
                             f"({', '.join(list(catalog)[:3])}, ...)")
        want_regs = [n for n in names if n in ids]
        want_cat = [n for n in names if n in catalog]
    items = []
    for rid in want_regs:
        try:
            reg = regressions.load(rid, directory=regressions_dir)
        except UsageError as exc:
            items.append(Item(rid, "regression", regression=rid, law="unknown", load_error=str(exc)))
            continue
        case = reg.to_case() if reg.case.get("kind") == "paged" else None
        # A capture its kernel was seen to answer differently: one passing replay proves little, so it is
        # replayed as often as prune asks before a pass counts (each replay its own row, rid#2 ...).
        repeats = regressions.PASSING_REPLAYS if reg.nondeterministic else 1
        items += [Item(rid if k == 0 else f"{rid}#{k + 1}", "regression", case, rid, reg.law,
                       record=None if reg.law == "acceptance" else reg) for k in range(repeats)]
    return items + [Item(name, "catalog", catalog[name]) for name in want_cat]


def with_generated(items: list, *, examples: int = 0, seed: int = 0, supported: dict | None = None,
                   distributions: tuple[str, ...] | None = None) -> list:
    """``items`` (:func:`chosen_items`) and ``examples`` generated cases after them, aimed first at the
    coverage holes the catalog items leave for the backend's ``supported`` shapes."""
    drawn = directed_cases(examples, seed, supported=supported, distributions=distributions,
                           covered=catalog_coverage(items, supported))
    return items + [Item(f"generated_{k:02d}", "generated", case, aim=aim) for k, (case, aim) in enumerate(drawn)]


def collect_items(selection: str = "all", *, examples: int = 0, seed: int = 0, supported: dict | None = None,
                  regressions_dir=None, distributions: tuple[str, ...] | None = None) -> list:
    """Items in run order: regressions, then catalog cases, then generated ones (:func:`chosen_items`,
    then :func:`with_generated`)."""
    return with_generated(chosen_items(selection, regressions_dir=regressions_dir), examples=examples, seed=seed,
                          supported=supported, distributions=distributions)


def aimed(items: list) -> dict:
    """{name: hole} of the generated cases kept for a coverage hole (properties/search/directed.py), in run order."""
    return {item.name: item.aim.kept_for for item in items if item.aim is not None and item.aim.kept_for}


def case_record(item: Item) -> dict:
    """What identifies one selected case: name, source, law, golden config and make_inputs seed."""
    return {"name": item.name, "source": item.source, "law": item.law, "config": item.config, "seed": item.seed}


def fingerprint(records: list) -> str:
    """``sha256:<hex>`` of the canonical JSON (sorted keys, no spaces) of ``records`` in the given order."""
    text = json.dumps(records, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def selection(items: list, *, cases: str, examples: int, seed: int, supported: dict | None,
              distributions: tuple[str, ...] | None = None) -> dict:
    """The run's selection as the report records it: the fingerprint of every selected case's record
    (:func:`case_record`, in run order; skipped and failed cases included, so two kernels' runs of the
    same selection match), one per source, and the options that made it."""
    records = [case_record(item) for item in items]
    by_source = {s: [r for r in records if r["source"] == s] for s in SOURCES}
    return {"fingerprint": fingerprint(records), "cases": len(records),
            "by_source": {s: {"cases": len(rs), "fingerprint": fingerprint(rs)} for s, rs in by_source.items()},
            "aimed": aimed(items),
            "options": {"cases": cases, "examples": examples, "seed": seed,
                        "supported_shapes": {k: list(v) for k, v in supported.items()} if supported else None,
                        "distributions": list(distributions) if distributions else None}}


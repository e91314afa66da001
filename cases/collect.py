"""What ``pfa-verify run`` checks, in order: captured regressions, catalog cases, generated cases.

The first stage of the cases/ pipeline (collect -> run -> report -> html_report -> cli). A captured
case that cannot be loaded (malformed, over the memory limit) becomes an item that carries its load
error: the run reports it as an ``error`` verdict instead of stopping, since a case file is data.
"""
from __future__ import annotations

import dataclasses

__all__ = ["SOURCES", "Item", "generated_strategy", "generation_draws", "generated_cases", "collect_items"]

SOURCES = ("regression", "catalog", "generated")


@dataclasses.dataclass(frozen=True)
class Item:
    """One thing to run: a paged-attention :class:`~properties.case.Case`, or a captured regression."""
    name: str
    source: str                    # one of SOURCES
    case: object = None            # properties.case.Case for paged cases
    regression: str | None = None  # id, for source == "regression"
    law: str = "acceptance"
    load_error: str | None = None  # why a captured case could not be loaded

    @property
    def config(self) -> dict | None:
        cfg = getattr(self.case, "config", None)
        return cfg.to_dict() if hasattr(cfg, "to_dict") else None

    @property
    def seed(self) -> int | None:
        return getattr(self.case, "seed", None)


def generated_strategy(supported: dict | None = None, distributions: tuple[str, ...] | None = None):
    """The strategy of the generated cases (kernel-sized for a backend's ``supported_shapes``), drawing
    the value ``distributions`` given (default: all of golden.DISTRIBUTIONS)."""
    from properties import strategies as ps
    kwargs = {} if distributions is None else {"distribution": tuple(distributions)}
    return ps.cases(ps.kernel_configs(supported, **kwargs) if supported else ps.configs(**kwargs))


def generation_draws(n: int) -> int:
    """Draws that give ``n`` distinct generated cases (replaying them, cases/shrink.py, draws as many)."""
    return 3 * n


def generated_cases(n: int, seed: int, *, supported: dict | None = None,
                    distributions: tuple[str, ...] | None = None) -> list:
    """``n`` distinct cases from :mod:`properties.strategies`, the same for the same seed and
    hypothesis version (generation phase only, no database). ``supported`` (a backend's
    ``supported_shapes``) narrows them to what its kernel is built for; ``distributions`` to those
    value distributions."""
    if n <= 0:
        return []
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed

    found: list = []

    @fixed_seed(seed)
    @settings(max_examples=generation_draws(n), phases=[Phase.generate], database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(generated_strategy(supported, distributions))
    def collect(case):
        if len(found) < n and case not in found:
            found.append(case)

    collect()
    return found


def collect_items(selection: str = "all", *, examples: int = 0, seed: int = 0, supported: dict | None = None,
                  regressions_dir=None, distributions: tuple[str, ...] | None = None) -> list:
    """Items in run order: regressions, then catalog cases, then generated ones.

    ``selection``: ``all`` (regressions + catalog), ``catalog``, ``regressions``, or a comma-separated
    list of catalog names and regression ids.
    """
    from cases import regressions
    from cases.catalog import load_catalog
    catalog = load_catalog()
    ids = regressions.list_ids(directory=regressions_dir)
    if selection in ("all", "catalog", "regressions"):
        want_regs = ids if selection in ("all", "regressions") else []
        want_cat = list(catalog) if selection in ("all", "catalog") else []
    else:
        names = [n.strip() for n in selection.split(",") if n.strip()]
        unknown = [n for n in names if n not in catalog and n not in ids]
        if unknown or not names:
            raise ValueError(f"--cases {selection!r}: unknown name(s) {unknown}; expected all, catalog, "
                             f"regressions, or names from `pfa-verify cases list` and the catalog "
                             f"({', '.join(list(catalog)[:3])}, ...)")
        want_regs = [n for n in names if n in ids]
        want_cat = [n for n in names if n in catalog]
    items = []
    for rid in want_regs:
        try:
            reg = regressions.load(rid, directory=regressions_dir)
        except ValueError as exc:
            items.append(Item(rid, "regression", regression=rid, law="unknown", load_error=str(exc)))
            continue
        case = reg.to_case() if reg.case.get("kind") == "paged" else None
        items.append(Item(rid, "regression", case, rid, reg.law))
    items += [Item(name, "catalog", catalog[name]) for name in want_cat]
    items += [Item(f"generated_{k:02d}", "generated", c)
              for k, c in enumerate(generated_cases(examples, seed, supported=supported, distributions=distributions))]
    return items

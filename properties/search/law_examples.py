"""The examples each law of the backend is checked on: its domain, where it can fail.

``examples(law, backend)`` is a strategy of ``(case, params)`` for :func:`properties.search.laws.run`: cases the
backend runs (:func:`properties.search.strategies.cases_for`), narrowed to the law's domain (GQA needs a group
of at least 2, causal positions S1 >= 2, batch independence two batches, ...), with the law's own
parameters drawn where they can make it fail (the other tiles differ from the case's; the batch sees a
token); half the draws aimed at one coverage bin (:func:`aims`, the narrowings of
properties/search/directed.py, as a run's generated cases are aimed), which reaches bins the plain draws never
do (three KV heads or more, an ``s2_tile`` of 8 blocks). :func:`properties.search.laws.vacuous` filters what
the narrowing leaves (a backstop: the share is held at zero by tests/properties/test_vacuity.py). No example a domain finding of the ledger
(properties/rule/ledger.py) matches for the backend is drawn: a known failure is held by ``pfa-verify run``
as a strict xfail (or never launched), not found again by every search. The pytest law tests,
``pfa-verify mutants`` and ``pfa-verify run``'s shrinking all draw from here, so every search checks the
same thing.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from hypothesis import strategies as st

from pfa_verify.properties.rule import ledger
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.rule.coverage import BINS
from pfa_verify.properties.search import laws
from pfa_verify.properties.search import strategies as ps
from pfa_verify.properties.search.directed import narrowing

__all__ = ["PAGED_LAWS", "AT12_LAWS", "BACKEND_LAWS", "aims", "examples", "operator_of"]

PAGED_LAWS = ("acceptance", "outputs_finite", "block_permutation", "garbage_unread", "gqa_repetition",
              "tile_invariance", "batch_independence", "causal_prefix")
#: The laws of AT-12 QK^T MatMul Scale (SPEC §6) on the backend.
AT12_LAWS = ("at12_acceptance", "at12_fp8_vs_bf16", "at12_default_scale")
#: Every law that checks the backend (the quantizers' laws check the golden's SPEC §3 alone).
BACKEND_LAWS = PAGED_LAWS + AT12_LAWS


def operator_of(law: str) -> str | None:
    """The kernel law ``law`` calls (kernels.backends.contract.OPERATORS), or None for a law of the golden alone."""
    return "paged_attention_fp8" if law in PAGED_LAWS else "qk_matmul_scale" if law in AT12_LAWS else None

_GROUPS = st.sampled_from((2, 4, 3))
_SPARE = st.integers(1, 3)       # at least one block nothing reads

#: One example of a law: the case (a paged-attention Case, or an AT-12 call) and the law's own parameters.
Example: TypeAlias = tuple[Case | ps.At12Case, dict[str, Any]]
#: A law's parameters: strategies by name, or a function of the case giving them.
_Params: TypeAlias = Mapping[str, st.SearchStrategy[Any]] | Callable[[Case], Mapping[str, st.SearchStrategy[Any]]]


def _with(params: _Params) -> Callable[[Case], st.SearchStrategy[Example]]:
    """Pair each case with ``params`` (a dict of strategies, or a function of the case giving one)."""
    def pair(case: Case) -> st.SearchStrategy[Example]:
        chosen = params(case) if callable(params) else params
        return st.fixed_dictionaries(chosen).map(lambda p: (case, p))
    return pair


def _other_tiles(case: Case) -> st.SearchStrategy[dict[str, Any]]:
    c = case.config
    group = c.nq // c.nkv
    choices: list[tuple[int, int | None]] = [(c.block_size * k, g) for k in (1, 2, 4) for g in [None] + [g for g in range(1, group) if group % g == 0]]
    other = [t for t in choices if not laws.same_tiles(c, s2_tile=t[0], g_tile=t[1])]
    return st.sampled_from(other).map(lambda t: {"s2_tile": t[0], "g_tile": t[1]})


def _seen_batch(case: Case) -> dict[str, st.SearchStrategy[int]]:
    return {"batch_index": st.sampled_from([b for b, n in enumerate(case.config.lengths) if n > 0])}


def aims(backend: object = None, **domain: Any) -> tuple[dict[str, Any], ...]:
    """The :func:`properties.search.strategies.cases_for` keywords that aim a draw at a coverage bin, one set per
    bin that has a narrowing (:func:`properties.search.directed.narrowing`, as a run's generated cases are
    aimed): common bins (S1 = 1, a group of 1) and those the plain draws rarely or never reach (three KV
    heads or more, an ``s2_tile`` of 8 blocks, one distribution or garbage fill among eight). Left out:
    those that set a keyword the law's ``domain`` already narrows (a GQA law keeps its own groups), and for
    a backend with declared ``supported_shapes`` every ``s2_tile`` narrowing (its draws keep to the 1 or 2
    blocks the kernel is built for)."""
    kernel_sized = isinstance(backend, dict) or bool(getattr(backend, "supported_shapes", None))
    found: list[dict[str, Any]] = []
    for b in BINS:
        kwargs = narrowing(b.name)
        if not kwargs or kwargs.keys() & domain.keys() or (kernel_sized and "s2_tile_blocks" in kwargs):
            continue
        found.append(kwargs)
    return tuple(found)


def examples(law: str, backend: object = None) -> st.SearchStrategy[Example]:
    """``(case, params)`` for ``law`` on ``backend`` (its supported shapes; None: any), never vacuous:
    half of them plain draws of the law's domain, half aimed at one coverage bin (:func:`aims`)."""
    def cases(**domain: Any) -> st.SearchStrategy[Case]:
        aimed = st.sampled_from(aims(backend, **domain)).flatmap(lambda kwargs: ps.cases_for(backend, **kwargs, **domain))
        return st.one_of(ps.cases_for(backend, **domain), aimed)     # shrinks towards the plain draws

    domains: dict[str, st.SearchStrategy[Example]] = {
        "acceptance": cases().flatmap(_with({})),
        "outputs_finite": cases().flatmap(_with({})),
        "block_permutation": cases(spare_blocks=_SPARE).flatmap(_with({"perm_seed": st.integers(0, 2**16)})),
        "garbage_unread": cases(spare_blocks=_SPARE).flatmap(_with({"fill": st.sampled_from(("nan", "huge", "plausible"))})),
        "gqa_repetition": cases(group=_GROUPS).flatmap(_with({})),
        "tile_invariance": cases().flatmap(lambda case: _other_tiles(case).map(lambda p: (case, p))),
        "batch_independence": cases(batch=st.integers(2, 4)).flatmap(_with(_seen_batch)),
        "causal_prefix": cases(s1=st.integers(2, 3)).flatmap(_with({})),
    }
    if law in AT12_LAWS:                # AT-12 calls of any shape: the stage has no supported_shapes
        params = {"fp8": st.booleans()} if law == "at12_acceptance" else {}
        return ps.at12_cases().flatmap(lambda case: st.fixed_dictionaries(params).map(lambda p: (case, p)))
    if law not in domains:
        raise ValueError(f"law={law!r} is not a law of the backend; expected one of {BACKEND_LAWS}")
    name = getattr(backend, "name", "")

    def drawn(example: Example) -> bool:
        case, params = example
        assert isinstance(case, Case)           # the paged laws' domains draw paged cases
        return laws.vacuous(law, case, **params) is None and ledger.lookup(None, name, config=case.config) is None
    return domains[law].filter(drawn)

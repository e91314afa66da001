"""A law that does not hold, as data: :class:`LawFailure`, what the rule found, for the boundary to report.

A law (properties/search/laws.py) raises a LawFailure: the rule's message, the law's name and example, and each
call the rule failed (:class:`Failed`: its Judgement and inputs). The laws never diagnose: the boundary
that reports a failure (cases/data/diagnosed.py, for ``run``, ``laws``, replay and the pytest plugin)
applies the diagnosis once, to the calls listed here.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from pfa_verify.properties.rule.acceptance import Judgement, Scalars, Tensors, split_bundle
from pfa_verify.properties.rule.case import Case

__all__ = ["Failed", "LawFailure"]


@dataclasses.dataclass(frozen=True)
class Failed:
    """One call the rule failed: its judgement, and the inputs it was judged on (``tensors`` and ``scalars``,
    or ``case`` alone when the call is the whole case: a diagnosis may then run the kernel on its
    neighbours); ``call``: which of a law's calls it is ("" for the law's own case)."""
    judgement: Judgement = dataclasses.field(repr=False)
    case: Case | None = None
    tensors: Tensors | None = dataclasses.field(default=None, repr=False)
    scalars: Scalars | None = dataclasses.field(default=None, repr=False)
    call: str = ""

    def __post_init__(self) -> None:
        if self.case is None and (self.tensors is None or self.scalars is None):
            raise ValueError("Failed needs the case, or the call's tensors and scalars")

    def inputs(self) -> tuple[Tensors, Scalars]:
        """The call's inputs: those given, else the case's, built here (a law raising a failure that nobody
        diagnoses, while Hypothesis shrinks, does not pay for them)."""
        if self.tensors is not None and self.scalars is not None:
            return self.tensors, self.scalars
        assert self.case is not None            # __post_init__
        return split_bundle(self.case.inputs())


class LawFailure(AssertionError):
    """A law that does not hold: ``message`` (the rule's, no diagnosis), the ``law``, the example it failed on
    (``case``, ``params``) and the calls the rule failed (``failed``: none when the law compares without the
    rule, e.g. quantization, or when they were not judged one by one)."""

    def __init__(self, message: str, *, failed: tuple[Failed, ...] = (), law: str = "", case: Any = None,
                 params: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.failed = failed
        self.law = law
        self.case = case
        self.params = dict(params or {})

    def of(self, law: str, case: Any, params: dict[str, Any]) -> LawFailure:
        """This failure named by the law that raised it and its example."""
        return LawFailure(self.message, failed=self.failed, law=law, case=case, params=params)

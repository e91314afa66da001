"""The record of one case of a run, and of the run: :class:`CaseVerdict` and :class:`RunResult`.

A case's record starts as the acceptance rule's (properties.rule.acceptance.Judgement: what was compared,
each comparison's outcome, worst element, envelope figures and attribution), or as how the case ended
without a comparison (a skip, an error). The runner then adds what it learnt, each as a field of a new
copy (``dataclasses.replace``): the capture (:class:`Capture`), the diagnosis, the ledger's word, the
retry of a worker that died, the node that ran it. Nobody edits a record or a message; the reports
(cases/reporting/) render the record, and derive the run's exit status from it, once.
"""
from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Capture", "CaseError", "LawReplay", "Exemplar", "FailureGroup", "CaseVerdict", "RunResult", "ERROR_KINDS"]

#: Why a case ended in an error: the kernel raised; its worker process ended, timed out or broke the
#: protocol; the backend could not start in a worker; the captured case file could not be loaded.
ERROR_KINDS = ("kernel", "worker", "backend", "case file")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Capture:
    """Where a counted failure was kept (cases.data.regressions): ``replay``, the command that replays
    it (None when nothing was written), and ``line``, the last line of its failure text ("Replay: ..."
    or why it was not captured); for a group's capture the ``group`` of cases that fail alike (captured
    once) and ``how`` the captured case was reached (the smallest, shrunk, or why not)."""
    replay: str | None
    line: str
    group: tuple[str, ...] = ()
    how: str = ""
    regression: str | None = None     # the id written (None when nothing was)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Exemplar:
    """A case a failure group may capture: the case (properties.rule.case.Case), its failure text, how it was
    reached (as it ran, or shrunk by Hypothesis) and how its kernel answered alike cases differently."""
    case: Any
    message: str
    how: str
    nondeterministic: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class FailureGroup:
    """Cases that fail alike (cases/running/groups.py): its number in the run, the key in words, its
    members in run order, the member shown for all (the one its capture came from), how its capture was chosen
    and the command that replays it (None: nothing captured)."""
    number: int
    alike: str
    members: tuple[str, ...]
    shown: str
    how: str = ""
    replay: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class CaseError:
    """A case that ended without a comparison: ``kind`` (one of :data:`ERROR_KINDS`) and what happened."""
    kind: str
    message: str

    def __post_init__(self) -> None:
        if self.kind not in ERROR_KINDS:
            raise ValueError(f"kind={self.kind!r} must be one of {ERROR_KINDS}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LawReplay:
    """A captured case of a law other than acceptance, replayed: whether the law held, and its text."""
    law: str
    passed: bool
    message: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class CaseVerdict:
    """One case of a run (see the module docstring). Exactly one of ``judgement`` (the acceptance rule's
    record, properties.rule.acceptance.Judgement), ``law``, ``inputs_modified`` (the call changed an input:
    the rule's message), ``skip`` (a kernels.Skip) and ``error`` says how it ended."""
    name: str
    source: str
    config: dict | None
    seed: int | None
    backend: str
    judgement: Any = None
    law: LawReplay | None = None
    inputs_modified: str | None = None
    skip: Any = None
    error: CaseError | None = None
    seconds: float = 0.0
    node: str | None = None
    attempts: int = 1
    retry_cause: str | None = None        # why its first run gave nothing (its worker process ended)
    capture: Capture | None = None
    diagnosis: Any = None                 # properties.diagnosis.diagnosis.Diagnosis of its first counted failure
    diagnosis_note: str = ""              # which case the models ran on, when not this one
    ledger: str | None = None             # a tolerated known failure's reason: its failures do not count
    ledger_broken: str | None = None      # a tolerated entry whose case no longer fails (remove it)
    signature: tuple | None = dataclasses.field(default=None, compare=False)   # a generated failure's group
    group: FailureGroup | None = None     # the cases that fail alike: a counted failure's or an error's
    exemplar: Exemplar | None = dataclasses.field(default=None, compare=False, repr=False)  # its shrunk case, until grouped

    def __post_init__(self) -> None:
        ends = [f for f in ("judgement", "law", "inputs_modified", "skip", "error") if getattr(self, f) is not None]
        if len(ends) != 1:
            raise ValueError(f"case {self.name!r}: a verdict ends one way, got {ends or 'none'}")

    @property
    def checked(self) -> bool:
        """Whether its comparisons ran (not skipped, no error)."""
        return self.skip is None and self.error is None

    @property
    def failed(self) -> bool:
        """A counted failure: a comparison that counts failed, an input changed, the law failed, or a
        tolerated entry no longer fails."""
        if self.ledger_broken is not None or self.inputs_modified is not None:
            return True
        if self.law is not None:
            return not self.law.passed
        if self.judgement is not None and self.ledger is None:
            return not self.judgement.passed
        return False


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunResult:
    """A whole run: the backend as chosen, one :class:`CaseVerdict` per case run (in selection order),
    and what the reports need to say what was and was not checked."""
    backend: str
    backend_note: str
    codec: str | None
    seed: int
    results: tuple[CaseVerdict, ...]
    seconds: float
    command: str = ""
    fallback: bool = False            # auto fell back to the golden: no kernel checked
    allow_fallback: bool = False
    allowed_skips: tuple = ()         # skip kinds that do not fail the run
    selection: dict | None = None     # cases.data.collect.selection(): what was selected, fingerprinted
    provenance: dict | None = None    # cases.data.provenance.run_provenance(): which kernel, project, inputs
    execution: dict | None = None     # where the cases ran: executor, workers, cluster, nodes, isolation
    coverage: dict | None = None      # properties.rule.coverage.Coverage.to_dict() of the checked cases
    coverage_required: tuple = ()     # --coverage: bins (or "all") a hole of which fails the run
    interrupted: str | None = None    # the signal that stopped the run (SIGINT, SIGTERM), or None
    not_run: tuple[str, ...] = ()     # cases selected but never run (the run was interrupted)
    write_failures: tuple[str, ...] = ()   # evidence the run could not write (one line each)
    shared: tuple[dict, ...] = ()     # properties.diagnosis.separation.Separation.to_dict(): what the failures, the errors share

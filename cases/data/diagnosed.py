"""The diagnosis, applied where a failure is reported: :func:`diagnosis_of` and :func:`explain`.

The rule decides and the laws raise what it found (properties.rule.failure.LawFailure); neither diagnoses. Every
place that reports a failure diagnoses it here, once: ``pfa-verify run`` (a catalog or generated case's
judgement), and a law's failure wherever it is reported (cases.data.regressions.check and replay, so the
pytest plugin and run's captured laws; the ``laws`` and ``search`` commands). A diagnosis is never a
verdict, and a diagnosis that breaks never hides the failure it was to explain.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pfa_verify.properties.diagnosis.diagnosis import Diagnosis, diagnose_verdict
from pfa_verify.properties.diagnosis.probes import probe
from pfa_verify.properties.rule.acceptance import JudgedBackend, Judgement, Scalars, Tensors
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.rule.failure import LawFailure

__all__ = ["Explained", "diagnosis_of", "explain"]


def diagnosis_of(judgement: Judgement, tensors: Tensors, scalars: Scalars, *, case: Case | None = None,
                 backend: JudgedBackend | None = None, stop: Callable[[], object] | None = None) -> Diagnosis | None:
    """The fault model that explains a failed judgement (properties/diagnosis/diagnosis.py), None when none applies;
    with ``case`` and ``backend``, the probes of properties/diagnosis/probes.py run on the case's neighbours too
    (unless ``stop()`` says the run is ending)."""
    found = diagnose_verdict(judgement, tensors, scalars)
    if found is None or case is None or backend is None or (stop is not None and stop()):
        return found
    return probe(found, case, backend, stop=stop)


@dataclasses.dataclass(frozen=True)
class Explained:
    """A law's failure as reported: its ``message`` with a diagnosis line per failed call, and the
    ``diagnosis`` of the first (None: none applies, or nothing to diagnose)."""
    message: str
    diagnosis: Diagnosis | None = None

    @property
    def named(self) -> str | None:
        """What the diagnosis names, in a few words: the model identified and its stage, or that none was."""
        d = self.diagnosis
        if d is None:
            return None
        if d.identified is not None:
            return f"Diagnosis: {d.identified.model} [{d.identified.stage}]"
        return "Diagnosis: not identified" if d.candidates else "Diagnosis: no fault model applies"


def explain(failure: BaseException, backend: JudgedBackend) -> Explained:
    """``failure`` (what a law raised) with the diagnosis of each call the rule failed: for a call that is
    a whole case with its probes on ``backend``, for one of a law's two calls on that call alone. Anything
    but a LawFailure is its text alone."""
    message = str(failure)
    if not isinstance(failure, LawFailure):
        return Explained(message)
    lines: list[str] = []
    first: Diagnosis | None = None
    for failed in failure.failed:
        note = f", on the call {failed.call}" if failed.call else ""
        try:
            found = diagnosis_of(failed.judgement, *failed.inputs(), case=failed.case, backend=backend)
        except Exception as exc:  # noqa: BLE001 - a diagnosis must never hide the failure it explains
            lines.append(f"Diagnosis{note}: unavailable ({type(exc).__name__}: {exc})")
            continue
        if found is not None:
            lines.append(found.render(note=note))
            first = first or found
    return Explained("\n".join([message, *lines]), first)

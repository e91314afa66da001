"""A captured case replayed several times, its kernel's answers compared: ``cases replay --times N`` and
``cases prune`` (cases/cli/captured.py) read one :class:`Replays` each.

A capture of a kernel that answers the same inputs differently (a race on a device) passes on some
replays and fails on others; one passing replay says nothing about it. :func:`replay_times` replays the
case's law through a :class:`cases.running.answers.Recorded` backend, so that besides each replay's
verdict it knows whether any kernel call answered the same inputs with other bits than before.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pfa_verify.cases.data import regressions
from pfa_verify.cases.running.answers import Answers, Recorded
from pfa_verify.kernels import BackendUnavailable

__all__ = ["Replays", "replay_times", "PASS", "FAIL", "ERROR"]

PASS, FAIL, ERROR = "pass", "fail", "error"


@dataclasses.dataclass
class Replays:
    """What the replays of one capture saw: each replay's outcome (PASS, FAIL or ERROR: the kernel raised,
    or its worker ended or timed out), the first failure's text, the first error, and the first kernel
    call that answered the same inputs differently (cases/running/answers.py), in words."""
    outcomes: list[str] = dataclasses.field(default_factory=list)
    failure: str | None = None
    error: BaseException | None = None
    differences: str | None = None

    def count(self, outcome: str) -> int:
        return self.outcomes.count(outcome)

    def nondeterministic(self) -> str | None:
        """How the kernel was seen to answer the same case differently (None: it was not): a pass and a
        failure among the replays, or other bits for the same inputs."""
        seen = []
        if self.count(PASS) and self.count(FAIL):
            seen.append(f"{self.count(FAIL)} of {len(self.outcomes)} replays failed and {self.count(PASS)} passed")
        if self.differences:
            seen.append(f"the kernel answered {self.differences}")
        return "; ".join(seen) or None


def replay_times(reg, backend, times: int, *, directory=None, until_not_passing: bool = False,
                 stop: Callable[[], object] | None = None,
                 each: Callable[[int, str], None] | None = None) -> Replays:
    """Replay capture ``reg`` on ``backend`` ``times`` times (fewer: ``until_not_passing`` stops at the first
    replay that does not pass or answers differently; ``stop()`` true stops after a replay); ``each(k, outcome)``
    hears each. kernels.BackendUnavailable and interrupts propagate; any other exception of a replay is
    its ERROR (the replay's AssertionError its FAIL)."""
    if times < 1:
        raise ValueError(f"times={times} must be at least 1")
    seen, answers = Replays(), Answers()
    recorded = Recorded(backend, answers)
    for k in range(times):
        recorded.where = f"replay {k + 1}"
        try:
            regressions.replay(reg, recorded, directory=directory)
            outcome = PASS
        except AssertionError as exc:
            outcome = FAIL
            seen.failure = seen.failure or str(exc)
        except BackendUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - the kernel raised or its worker ended: an error, never a pass
            outcome = ERROR
            seen.error = seen.error or exc
        seen.outcomes.append(outcome)
        seen.differences = answers.seen()
        if each is not None:
            each(k, outcome)
        if (stop is not None and stop()) or (until_not_passing and (outcome != PASS or seen.differences)):
            break
    return seen

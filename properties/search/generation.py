"""Seeded generation that depends on the project, Hypothesis' version and the seed only: :func:`seeded_examples`.

Why not Hypothesis' own generation. Hypothesis mixes "local constants" into its draws: literals it harvests
from the source of every local module in ``sys.modules`` (not the standard library, not site-packages,
not a test file). What a seed generates then depends on what else the process has imported (a backend
module, a user's kernel file, the mutants), even derandomized. Hypothesis offers no setting for this, and
the suite changes nothing in Hypothesis for other code in the process.

What is done instead, by public API only: ``pfa-verify run``'s generated cases are drawn by a ``@given``
test's ``.hypothesis.fuzz_one_input``, fed byte strings from :func:`seeded_buffers` (a ``random.Random``
of the seed). Driven by bytes, Hypothesis maps them to the same choices whatever is imported, through
the same strategies (properties/search/strategies.py) as every other search. A failure found this way is saved
in the test's database and replayed by Hypothesis' reuse phase to shrink it (cases/running/shrink.py).

The law searches (``pfa-verify laws``, the pytest laws) keep Hypothesis' own generation: there a
derandomized profile gives the same examples for the same project, Hypothesis version, profile and
local modules loaded.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis.control import current_build_context, currently_in_test_context
from hypothesis.database import ExampleDatabase
from hypothesis.strategies import SearchStrategy

from pfa_verify.golden.paging import positive_int

__all__ = ["BUFFER_BYTES", "seeded_buffers", "seeded_test", "seeded_examples", "reported_example"]

_T = TypeVar("_T")

#: Bytes offered per drawn example: a kernel-sized case takes under a hundred at the default max_len (its
#: block tables are drawn); a draw that needs more than this is invalid and the next buffer is tried.
BUFFER_BYTES = 1 << 16
# Buffers offered per example asked for, before giving up on a strategy that rejects most of them.
_TRIES_PER_EXAMPLE = 10


def seeded_buffers(seed: int, count: int) -> Iterator[bytes]:
    """The byte strings that drive the draws of ``seed`` for ``count`` examples, in order (ten per example
    at most: a caller stops once it has its examples): the one source of randomness of seeded generation,
    the same in every process and Python version."""
    positive_int(seed, "seed", minimum=0)
    positive_int(count, "count", minimum=0)
    rng = random.Random(seed)
    for _ in range(_TRIES_PER_EXAMPLE * count):
        yield rng.randbytes(BUFFER_BYTES)


def seeded_test(strategy: SearchStrategy[_T], body: Callable[[_T], None], *,
                database: ExampleDatabase | None = None) -> Any:
    """``body`` as a ``@given(strategy)`` test, to be driven by ``.hypothesis.fuzz_one_input`` (whose
    failures go to ``database``) or run by Hypothesis under other settings (same body: same database key)."""
    return settings(database=database, deadline=None, suppress_health_check=list(HealthCheck))(given(strategy)(body))


def seeded_examples(strategy: SearchStrategy[_T], seed: int, count: int) -> list[_T]:
    """Up to ``count`` examples of ``strategy`` drawn from :func:`seeded_buffers` of ``seed`` (draws the
    strategy rejects are skipped, within ten buffers per example): the same list for the same strategy,
    seed and Hypothesis version, whatever else the process imported."""
    found: list[_T] = []

    def collect(example: _T) -> None:
        found.append(example)
    fuzz = seeded_test(strategy, collect).hypothesis.fuzz_one_input
    for buffer in seeded_buffers(seed, count):
        if len(found) >= count:
            break
        fuzz(buffer)
    return found


def reported_example() -> bool:
    """Whether this call is the example Hypothesis reports (its final replay of the failure it found), or
    runs outside Hypothesis: where a failure is captured, diagnosed, and an expensive backend's shrink budget
    no longer applies. While Hypothesis generates or shrinks, False."""
    return not currently_in_test_context() or bool(getattr(current_build_context(), "is_final", True))

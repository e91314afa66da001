"""Generation that depends on the project, Hypothesis' version and the seed only: :func:`pin_local_constants`.

Why it is needed. Hypothesis (6.170 here) mixes "local constants" into its draws: with probability
0.05 per integer, float, bytes or string choice, ``HypothesisProvider._maybe_draw_constant``
(hypothesis/internal/conjecture/providers.py) returns a constant instead of a random value, picked
from Hypothesis' own global pool or from a pool of literals it harvests from the source of every
*local* module in ``sys.modules`` (``_get_local_constants``; hypothesis/internal/constants_ast.py
decides what is local: not the standard library, not site-packages, not a test file). That pool is
rebuilt whenever ``sys.modules`` grows, so what a seed generates depends on what else the process has
imported: a backend module (kernels/backends/upstream.py), a user's kernel file, the mutants. The
pool also changes how much randomness a draw consumes (one ``random.choice`` between one pool or two),
so every later draw shifts. Measured before this pin (2026-11-30): ``cases.data.collect.generated_cases(12,
0, supported=KERNEL_SHAPES)`` gave make_inputs seeds ``[53676, 1997, 2139095040, 101, 20123, 2328,
10564, 208573, 65976, 575, 575, 108]`` in a plain process and ``[53676, 1997, 32683, 101, 20123, 2328,
10564, 208573, 17713194, 2147483647, 0, 0]`` after importing kernels.backends.upstream, cases.measuring.mutants
and kernels.mutants.golden_level.

What it does. Hypothesis 6.170 offers no setting for this, so the narrowest switch is used: the one
function that builds the pool, ``providers._get_local_constants``, is replaced in the running process
(the installed package is not edited) by one that returns an empty pool, and the pool cache built
from it is cleared. Draws then take constants from Hypothesis' global pool only, which is fixed for a
Hypothesis version. Hypothesis' own tests replace the same function to control the pool
(hypothesis-python/tests/conjecture/test_local_constants.py). Our strategies reach their boundary
values on purpose (properties/search/strategies.py: special lengths, block boundaries, garbage), so the
literals of our modules add nothing the search relies on.

Where it applies: every process that generates cases, through :mod:`properties.search.strategies` (which
pins on import, before any of its strategies can draw) and tests/conftest.py (before the Hypothesis
profiles are loaded). tests/properties/test_generation.py generates in several import contexts in fresh
processes and compares; it fails if a Hypothesis upgrade brings the dependence back.
"""
from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from hypothesis.control import current_build_context, currently_in_test_context

providers: ModuleType | None
try:       # the internals pinned here (constraints.txt pins the Hypothesis release)
    from hypothesis.internal.conjecture import providers
    from hypothesis.internal.constants_ast import Constants
except ImportError:      # pragma: no cover - a Hypothesis without the provider module
    providers = None

__all__ = ["pin_local_constants", "local_constants_pinned", "reported_example"]

_PINNED: Callable[[], Constants] | None = None     # the replacement, once installed


def pin_local_constants() -> bool:
    """Make Hypothesis' local-constant pool empty in this process (module docstring); idempotent.

    Returns True when the pool is pinned, False when this Hypothesis has no such pool (versions before
    it harvested local constants: their generation never depended on imports)."""
    global _PINNED
    if providers is None or not hasattr(providers, "_get_local_constants"):
        return False
    if providers._get_local_constants is not _PINNED:
        empty = Constants()

        def no_local_constants() -> Constants:
            return empty
        providers._get_local_constants = no_local_constants  # type: ignore[attr-defined]  # a module: typeshed has no setter
        _PINNED = no_local_constants
        cache = getattr(providers, "CONSTANTS_CACHE", None)
        if cache is not None:                     # constants already chosen from the old pool
            cache.cache.clear()
    return True


def local_constants_pinned() -> bool:
    """Whether :func:`pin_local_constants` is in force in this process."""
    if providers is None:      # pragma: no cover
        return False
    return _PINNED is not None and getattr(providers, "_get_local_constants", None) is _PINNED


def reported_example() -> bool:
    """Whether this call is the example Hypothesis reports (its final replay of the failure it found), or
    runs outside Hypothesis: where a failure is captured, diagnosed, and an expensive backend's shrink budget
    no longer applies. While Hypothesis generates or shrinks, False."""
    return not currently_in_test_context() or bool(getattr(current_build_context(), "is_final", True))

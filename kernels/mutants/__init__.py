"""A catalog of realistic defects of FP8 paged attention, to measure what the suite catches.

Each mutant is a backend, selected by name (``kernels.get_backend("mutant:NAME")``), whose docstring
names the bug. Two levels:

- ``golden``: a stage of kernels/mutants/staged.StagedGolden (SPEC §2, one method per stage, the
  golden's bits when unmutated) overridden in kernels/mutants/golden_level.py. Fast: every CI run.
- ``sim``: a textual change of our PyPTO kernel (kernels/pfa_fp8.py) written to a copy in the cache
  and executed by the sim backend (kernels/mutants/kernel_level.py). Slow: the nightly-style run.

The unmutated code is never edited on disk. A mutant with ``equivalent`` set cannot be killed (its
proof is the text); it is listed, never counted in the kill ratio.
"""
from __future__ import annotations

import dataclasses

from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels.backends.sim import SimBackend
from pfa_verify.kernels.mutants.golden_level import GOLDEN_MUTANTS
from pfa_verify.kernels.mutants.kernel_level import KERNEL_MUTANTS, make_kernel_mutant
from pfa_verify.kernels.mutants.staged import StagedGolden

__all__ = ["Mutant", "MUTANTS", "LEVELS", "get_mutant", "reference", "level_backend_class"]

LEVELS = ("golden", "sim")


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    level: str
    bug: str                      # the docstring: what a kernel engineer wrote
    equivalent: str | None        # the proof, for a mutant that cannot be killed


def _catalog() -> dict[str, Mutant]:
    out = {}
    for name, cls in GOLDEN_MUTANTS.items():
        if not cls.__doc__:
            raise TypeError(f"golden mutant {name!r} has no docstring: the docstring names its bug")
        out[name] = Mutant(name, "golden", " ".join(cls.__doc__.split()), cls.equivalent)
    for name, m in KERNEL_MUTANTS.items():
        out[f"sim/{name}"] = Mutant(f"sim/{name}", "sim", m.bug, m.equivalent)
    return out


MUTANTS: dict[str, Mutant] = _catalog()


def get_mutant(name: str, **options):
    """The backend of mutant ``name`` (``none``: the unmutated reference of the golden level;
    ``sim/none``: our kernel on the sim backend)."""
    if name == "none":
        return StagedGolden(**options)
    if name in GOLDEN_MUTANTS:
        backend = GOLDEN_MUTANTS[name](**options)
        backend.name = f"mutant:{name}"
        return backend
    if name.startswith("sim/"):
        return make_kernel_mutant(name.removeprefix("sim/"), **options)
    raise UsageError(f"mutant {name!r} is not in the catalog; expected none, sim/none or one of {sorted(MUTANTS)}")


def level_backend_class(level: str) -> type:
    """The backend class the mutants of ``level`` are built on (StagedGolden, or the sim backend): what a
    matrix reads the level's backend properties from before it starts any (``kernel_errors_spoil_process``)."""
    if level not in LEVELS:
        raise UsageError(f"level={level!r} must be one of {LEVELS}")
    if level == "golden":
        return StagedGolden
    return SimBackend


def reference(level: str, **options):
    """The unmutated backend of ``level``: the staged golden, or our kernel on the sim backend."""
    if level not in LEVELS:
        raise UsageError(f"level={level!r} must be one of {LEVELS}")
    return get_mutant("none" if level == "golden" else "sim/none", **options)

"""What produced a report or a captured case: package versions (pypto read from its metadata, never
imported here: importing it would stop kernels.pypto_workarounds from loading its 950 overlay), and the
project's own version and git commit (:func:`project`)."""
from __future__ import annotations

import functools
import platform
import subprocess
import tomllib
from importlib.metadata import PackageNotFoundError, version

import torch

from pfa_verify.cases.data import FOLDER

__all__ = ["versions", "project"]

_ROOT = FOLDER.parent


def _dist_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def versions() -> dict:
    """Versions of pfa-verify, torch, pypto (null when not installed), torch_npu, hypothesis, python
    and the platform."""
    own = _dist_version("pfa-verify")
    if own is None:  # running from a source tree that is not installed
        try:
            own = tomllib.loads((_ROOT / "pyproject.toml").read_text())["project"]["version"]
        except Exception:  # noqa: BLE001 - best effort
            own = None
    return {"pfa-verify": own, "torch": torch.__version__, "pypto": _dist_version("pypto"),
            "torch_npu": _dist_version("torch_npu"), "hypothesis": _dist_version("hypothesis"),
            "python": platform.python_version(), "platform": platform.platform()}


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(_ROOT), *args], capture_output=True, text=True, timeout=10,
                              check=False)
    except (OSError, subprocess.SubprocessError):   # no git here
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def project() -> dict:
    """``{"version", "commit", "dirty"}`` of the pfa-verify that is running: ``commit`` is the git
    commit of the source tree (null outside a git checkout, e.g. an installed copy), ``dirty`` whether
    tracked files differ from it (null when unknown). Read once per process."""
    commit = _git("rev-parse", "HEAD") if (_ROOT / ".git").exists() else None
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"version": versions()["pfa-verify"], "commit": commit, "dirty": None if status is None else bool(status)}

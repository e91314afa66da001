"""What every workaround shares: the supported version, the cache folder, the process's pypto state."""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from importlib import metadata, util
from pathlib import Path
from typing import Any

__all__ = ["SUPPORTED_PYPTO_VERSION", "PyptoUnavailable", "CACHE_ENV", "cache_root", "installed_pypto_dir", "ensure_dir",
           "LOCK", "STATE", "mark_patched", "is_patched"]

SUPPORTED_PYPTO_VERSION = "0.2.0"
CACHE_ENV = "PFA_VERIFY_CACHE"
LOCK = threading.RLock()
STATE: dict[str, Any] = {}   # "pypto" (the module, once loaded), "calculator" (its library's path), "trace" (W9)
#: The attribute that marks a function of pypto's we replaced, so that a second load patches nothing twice.
_PATCH_MARK = "_pfa_verify_patched"


def mark_patched(function: Callable[..., Any]) -> None:
    """Mark ``function`` (our replacement of one of pypto's) as ours."""
    setattr(function, _PATCH_MARK, True)


def is_patched(function: object) -> bool:
    """Whether ``function`` is a replacement :func:`mark_patched` marked."""
    return bool(getattr(function, _PATCH_MARK, False))


class PyptoUnavailable(RuntimeError):
    """pypto cannot be used here; the message says why (not installed, wrong version, no cmake...)."""


def cache_root() -> Path:
    """Folder for the overlay and the calculator build: $PFA_VERIFY_CACHE, else ~/.cache/pfa-verify."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pfa-verify"


def installed_pypto_dir() -> Path:
    """The installed package folder, found without importing it (importing would bind the 910B ini)."""
    try:
        version = metadata.version("pypto")
    except metadata.PackageNotFoundError:
        raise PyptoUnavailable("pypto is not installed (pip install 'pfa-verify[sim]')") from None
    if version != SUPPORTED_PYPTO_VERSION:
        raise PyptoUnavailable(
            f"pypto {version} is installed; the sim backend is written for pypto {SUPPORTED_PYPTO_VERSION}")
    spec = util.find_spec("pypto")
    if spec is None or spec.origin is None:
        raise PyptoUnavailable("pypto is installed but its package folder cannot be found")
    origin = Path(spec.origin).resolve().parent
    if origin.parent.name == "overlay" or "pypto-overlay" in str(origin):
        # Already pointing at an overlay (sys.path was changed earlier): use the real package behind it.
        origin = Path(os.path.realpath(origin / "__init__.py")).parent
    return origin


def ensure_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path

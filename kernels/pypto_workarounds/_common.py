"""What every workaround shares: the supported version, the cache folder, the process's pypto state."""
from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["SUPPORTED_PYPTO_VERSION", "PyptoUnavailable", "CACHE_ENV", "cache_root", "installed_pypto_dir", "ensure_dir",
           "LOCK", "STATE"]

SUPPORTED_PYPTO_VERSION = "0.2.0"
CACHE_ENV = "PFA_VERIFY_CACHE"
LOCK = threading.RLock()
STATE: dict = {}     # "pypto" (the module, once loaded), "calculator" (its library's path), "trace" (W9)


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
    from importlib import metadata, util

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

"""What produced a report or a captured case: package versions (pypto read from its metadata, never
imported here: importing it would stop kernels.pypto_workarounds from loading its 950 overlay)."""
from __future__ import annotations

import platform
from pathlib import Path

__all__ = ["versions"]


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def versions() -> dict:
    """Versions of pfa-verify, torch, pypto (null when not installed), torch_npu, hypothesis, python
    and the platform."""
    import torch
    own = _dist_version("pfa-verify")
    if own is None:  # running from a source tree that is not installed
        try:
            import tomllib
            own = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]["version"]
        except Exception:  # noqa: BLE001 - best effort
            own = None
    return {"pfa-verify": own, "torch": torch.__version__, "pypto": _dist_version("pypto"),
            "torch_npu": _dist_version("torch_npu"), "hypothesis": _dist_version("hypothesis"),
            "python": platform.python_version(), "platform": platform.platform()}

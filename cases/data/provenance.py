"""What a report checked, named by content: the backend's codec, model and kernel file, the project's
version and commit, the catalog's and the captured regressions' fingerprints.

A path says where a kernel was; only its bytes say which kernel it was. So a report of
``pfa-verify run`` carries (cases/report.schema.json, README "Report schema"):

- ``backend.model``: the golden.model.ConformanceModel that judged the run (``properties.rule.acceptance.backend_model``:
  the one the backend declares, or SPEC §4.1 as written), as ``to_dict()`` plus ``describe()`` and ``declared``;
- ``backend.kernel``: the kernels.backends.KernelSource of a kernel loaded from a file or module (our
  kernels/pfa_fp8.py for sim and npu, a ``pypto-gym:`` file or module, a ``path.py:factory`` or
  ``module:factory`` backend): the source as named, the resolved path, the sha256 of the file's bytes
  and the function; null otherwise (the golden, the mutants);
- ``backend.spec_codec_not_applicable``: why the run made no comparison under the spec codec (the
  backend's codec is its platform's and cannot be the spec's), or null;
- ``project``: cases.data.versions.project() (version, git commit, whether tracked files differ from it);
- ``inputs.catalog``: the sha256 of cases/catalog.json; ``inputs.regressions``: the captured cases the
  run started with, as one fingerprint over every file's name and sha256.
"""
from __future__ import annotations

import hashlib
from collections.abc import Collection
from pathlib import Path

from pfa_verify.cases.data import capture_files, regressions
from pfa_verify.cases.data.catalog import CATALOG_PATH
from pfa_verify.cases.data.versions import project
from pfa_verify.golden.errors import UsageError
from pfa_verify.properties.rule.acceptance import backend_model

__all__ = ["backend_provenance", "catalog_fingerprint", "capture_digests", "regressions_fingerprint", "lost_captures",
           "run_provenance"]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def backend_provenance(backend) -> dict:
    """``{"model", "kernel", ...}`` of ``backend`` (module docstring): the model that judges it (``declared``
    says whether the backend declared it; else it is SPEC §4.1 as written), the kernel file (null when none)."""
    model = backend_model(backend)
    source = getattr(backend, "kernel_source", None)
    return {"model": {**model.to_dict(), "describe": model.describe(), "declared": getattr(backend, "model", None) is not None},
            "kernel": None if source is None else dict(source) if isinstance(source, dict) else source.to_dict(),
            "spec_codec_not_applicable": getattr(backend, "spec_codec_not_applicable", None)}


def catalog_fingerprint() -> dict:
    """``{"path", "sha256"}`` of cases/catalog.json."""
    return {"path": "cases/catalog.json", "sha256": _sha256(CATALOG_PATH)}


#: How the shipped captures' files are named among :func:`capture_digests`' keys.
SHIPPED_PREFIX = "shipped/"


def capture_digests(directory=None) -> dict[str, str]:
    """{name: sha256 or "unreadable"} of every .json and .npz file of the user's captured-regressions folder
    and, named ``shipped/NAME``, of the shipped captures (both are replayed), read as the captures are
    (cases/data/capture_files.py): only regular files, within their size limits, so a FIFO or a link to
    /dev/zero can neither hang the run's start nor go unnoticed."""
    folder = regressions.directory(directory)
    digests = _digests(folder, "")
    return digests if regressions.is_shipped(folder) else {**digests, **_digests(regressions.SHIPPED, SHIPPED_PREFIX)}


def _digests(folder: Path, prefix: str) -> dict[str, str]:
    names = sorted(p.name for p in folder.iterdir() if p.suffix in (".json", ".npz")
                   and capture_files.is_plain_name(p.name)) if folder.is_dir() else []
    digests = {}
    for name in names:
        limit = regressions.MAX_FILE_BYTES if name.endswith(".json") else regressions.MAX_NPZ_BYTES
        try:
            digests[prefix + name] = hashlib.sha256(capture_files.read_regular(folder / name, limit)).hexdigest()
        except UsageError:
            digests[prefix + name] = "unreadable"
    return digests


def regressions_fingerprint(directory=None, digests: dict[str, str] | None = None) -> dict:
    """``{"directory", "cases", "fingerprint"}`` of the user's captured-regressions folder and the shipped
    captures (``directory`` names the user's): ``fingerprint`` is
    ``sha256:`` of one line ``name sha256`` per .json and .npz file (:func:`capture_digests`, or ``digests``
    read before), sorted by name (an empty or missing folder has the fingerprint of nothing)."""
    digests = capture_digests(directory) if digests is None else digests
    lines = "".join(f"{name} {digest}\n" for name, digest in sorted(digests.items()))
    return {"directory": str(regressions.directory(directory)), "cases": sum(n.endswith(".json") for n in digests),
            "fingerprint": "sha256:" + hashlib.sha256(lines.encode("utf-8")).hexdigest()}


def lost_captures(before: dict[str, str], directory=None, *, rewritten: Collection[str] = ()) -> list[str]:
    """The files of ``before`` (:func:`capture_digests` when the run started) that are gone from the folder
    or hold other bytes now, but for ``rewritten`` (records and their tensors this run captured again)."""
    now = capture_digests(directory)

    def recaptured(name: str) -> bool:
        return any(name in (f"{rid}.json", f"{rid}.npz") or name.startswith(f"{rid}-") for rid in rewritten)
    return [name for name, digest in sorted(before.items()) if not recaptured(name) and now.get(name) != digest]


def run_provenance(backend, *, regressions_dir=None, digests: dict[str, str] | None = None) -> dict:
    """Everything above for one run; ``digests``: the captures as read when it started (before its backend)."""
    return {"backend": backend_provenance(backend), "project": project(),
            "inputs": {"catalog": catalog_fingerprint(),
                       "regressions": regressions_fingerprint(regressions_dir, digests)}}

"""A captured failure's record (``<id>.json``) as an object: :class:`Regression`, built from a failure by
:meth:`Regression.from_failure` (its id by cases/data/capture_identity.py's rule, its tensors' .npz fields
by cases/data/capture_tensors.py) and written and read by cases/data/regressions.py, the one writer.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib

import numpy as np
import torch

from pfa_verify import golden
from pfa_verify.cases.data import capture_identity, capture_tensors
from pfa_verify.cases.data.versions import versions
from pfa_verify.golden.errors import UsageError
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.search.strategies import At12Case

__all__ = ["FORMAT_VERSION", "TENSOR_BUDGET", "Regression", "case_to_dict", "case_from_dict", "stored", "mark"]

# Format 2: make_inputs' "tiny" distribution shrinks Q and K only. A
# format-1 case is still read; one that must be rebuilt from (config, seed) with "tiny" is refused.
# Format 3: the .npz is named by its content and the record carries its sha256 and arrays. Formats 1
# and 2 are still read, their .npz checked for names, dtypes and shapes (they carry no sha256).
# Format 4: the id covers the tolerance and the tensors' sha256 too (cases/data/capture_identity.py).
FORMAT_VERSION = 4
TENSOR_BUDGET = 16 * 2**20  # bytes; larger inputs are replayed from config + seed only


def case_to_dict(case) -> dict:
    """The record's ``case`` of a paged Case, an At12Case or an array."""
    if isinstance(case, Case):
        return {"kind": "paged", "config": case.config.to_dict(), "seed": case.seed, "name": case.name}
    if isinstance(case, At12Case):
        return {"kind": "at12", **dataclasses.asdict(case)}
    arr = np.asarray(case, dtype=np.float32)
    return {"kind": "array", "shape": list(arr.shape), "values": [float(v) for v in arr.reshape(-1)]}


def case_from_dict(d: dict, explicit: dict | None):
    """The case a record's ``case`` stands for (a paged case with its ``explicit`` tensors); a config the
    golden refuses raises its ValueError, allocating nothing."""
    kind = d.get("kind")
    if kind == "paged":
        return Case(golden.PagedAttentionConfig.from_dict(d["config"]), d["seed"], d.get("name"), explicit)
    if kind == "at12":
        return At12Case(**{k: v for k, v in d.items() if k != "kind"})
    if kind == "array":
        return np.array(d["values"], dtype=np.float32).reshape(d["shape"])
    raise UsageError(f"case.kind={kind!r} must be 'paged', 'at12' or 'array'")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def mark(seen: str) -> dict:
    """The record's ``nondeterministic`` field: how the kernel was seen to answer the same inputs
    differently, and when."""
    return {"seen": seen, "at": now()}


@dataclasses.dataclass(frozen=True)
class Regression:
    """One captured failure (the JSON file's fields; ``format`` is the file's, FORMAT_VERSION for a new one)."""
    id: str
    law: str
    backend: str
    case: dict
    params: dict
    tolerance: dict
    message: str
    versions: dict
    created: str
    tensors: str | None = None   # name of the .npz next to the JSON, when inputs were stored
    explicit: dict | None = dataclasses.field(default=None, compare=False, repr=False)
    tensors_sha256: str | None = None   # of the .npz file; None for a record of format 1 or 2
    arrays: list | None = None          # each stored tensor's name, dtype, stored_as and shape
    nondeterministic: dict | None = None   # {"seen", "at"}: the kernel answered the same inputs differently
    format: int = dataclasses.field(default=FORMAT_VERSION, compare=False, repr=False)

    @classmethod
    def from_failure(cls, law: str, backend: str, case, params: dict, message: str, *,
                     nondeterministic: str | None = None) -> Regression:
        """The record of a failure of ``law`` on ``case`` (format 4: its id covers the tensors' sha256);
        ``nondeterministic``, when given, says how the kernel was seen to answer the same inputs differently."""
        case_d, tolerance = case_to_dict(case), capture_identity.law_tolerance(law)
        explicit, digest = None, None
        if case_d["kind"] == "paged":
            tensors = {k: v for k, v in case.inputs().kwargs().items() if isinstance(v, torch.Tensor)}
            if sum(t.numel() * t.element_size() for t in tensors.values()) <= TENSOR_BUDGET:
                explicit, digest = tensors, hashlib.sha256(capture_tensors.npz_bytes(tensors)).hexdigest()
        rid = capture_identity.content_id({"law": law, "backend": backend, "case": case_d, "params": dict(params),
                                           "tolerance": tolerance, "tensors_sha256": digest}, FORMAT_VERSION)
        fields = stored(rid, explicit)[1] if explicit else {}
        return cls(rid, law, backend, case_d, dict(params), tolerance, message, versions(), now(),
                   explicit=explicit, nondeterministic=mark(nondeterministic) if nondeterministic else None, **fields)

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("explicit", "format")}
        return {"format": self.format, **d}

    def to_case(self):
        return case_from_dict(self.case, self.explicit)

    def summary(self, *, shipped: bool = False) -> str:
        """One line for ``cases list``: id, law, backend, marks (``shipped``: one of the package's), message."""
        first = self.message.splitlines()[0] if self.message else ""
        said = ("[shipped] " if shipped else "") + ("[nondeterministic] " if self.nondeterministic else "")
        return f"{self.id}  {self.law:<22} {self.backend:<12} {said}{first}"


def stored(rid: str, tensors: dict) -> tuple[bytes, dict]:
    """The .npz bytes of ``tensors`` and the record's fields for them: the content-named file, its
    sha256 and its arrays (cases/data/capture_tensors.py)."""
    blob = capture_tensors.npz_bytes(tensors)
    digest = hashlib.sha256(blob).hexdigest()
    return blob, {"tensors": capture_identity.tensors_name(FORMAT_VERSION, rid, digest), "tensors_sha256": digest,
                  "arrays": capture_tensors.describe(tensors)}

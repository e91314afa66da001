"""Captured failures: cases/regressions/<id>.json (+ <id>.npz), written before a failure is reported.

A regression file records everything needed to replay one failed law in a fresh process: the law's
name and parameters, the case (a golden config and seed, or an AT-12 case, or a quantizer input),
the backend, the tolerance in force, the failure message and the package versions. Tensors the case
was run on are stored next to it in an .npz (fp8 as uint8 codes; never pickle, loaded with
allow_pickle=False), so a replay does not depend on ``golden.make_inputs`` staying the same.

The id is a hash of (law, backend, case, parameters): capturing the same failure twice rewrites the
same file. Hypothesis's database is a cache; this folder is the record. The folder is
cases/regressions/ unless ``PFA_VERIFY_REGRESSIONS`` names another (tests use a temporary one).
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

__all__ = ["Regression", "directory", "save", "load", "list_ids", "should_capture", "replay",
           "FORMAT_VERSION"]

FORMAT_VERSION = 1
_FIELDS = {"format", "id", "law", "backend", "case", "params", "tolerance", "message", "versions",
           "created", "tensors"}
_TENSOR_BUDGET = 16 * 2**20  # bytes; larger inputs are replayed from config + seed only


def directory(path=None) -> Path:
    if path is not None:
        return Path(path)
    env = os.environ.get("PFA_VERIFY_REGRESSIONS")
    return Path(env) if env else Path(__file__).resolve().parent / "regressions"


def versions() -> dict:
    """Package versions for a capture: the run report's (pypto read from metadata, never imported,
    since importing it here would stop kernels.pypto_workarounds from loading its 950 overlay)."""
    from cases.report import versions as report_versions

    return report_versions()


def _case_to_dict(case) -> dict:
    from properties.case import Case
    from properties.strategies import At12Case
    if isinstance(case, Case):
        return {"kind": "paged", "config": case.config.to_dict(), "seed": case.seed, "name": case.name}
    if isinstance(case, At12Case):
        return {"kind": "at12", **dataclasses.asdict(case)}
    arr = np.asarray(case, dtype=np.float32)
    return {"kind": "array", "shape": list(arr.shape), "values": [float(v) for v in arr.reshape(-1)]}


def _case_from_dict(d: dict, explicit: dict | None):
    from properties.case import Case
    from properties.strategies import At12Case
    kind = d.get("kind")
    if kind == "paged":
        import golden
        return Case(golden.PagedAttentionConfig.from_dict(d["config"]), d["seed"], d.get("name"), explicit)
    if kind == "at12":
        return At12Case(**{k: v for k, v in d.items() if k != "kind"})
    if kind == "array":
        return np.array(d["values"], dtype=np.float32).reshape(d["shape"])
    raise ValueError(f"case.kind={kind!r} must be 'paged', 'at12' or 'array'")


def _tolerance(law: str) -> dict:
    from properties.compare import TOLERANCES
    from properties.laws import LAWS
    kind = getattr(LAWS.get(law), "tolerance", "attention")
    t = TOLERANCES[kind]
    return {"kind": kind, "rtol": t.rtol, "atol": t.atol}


@dataclasses.dataclass(frozen=True)
class Regression:
    """One captured failure (the JSON file's fields)."""
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

    @classmethod
    def from_failure(cls, law: str, backend: str, case, params: dict, message: str) -> "Regression":
        case_d = _case_to_dict(case)
        key = json.dumps([law, backend, case_d, params], sort_keys=True, default=str)
        rid = hashlib.sha256(key.encode()).hexdigest()[:10]
        explicit = None
        if case_d["kind"] == "paged":
            tensors = {k: v for k, v in case.inputs().kwargs().items() if isinstance(v, torch.Tensor)}
            if sum(t.numel() * t.element_size() for t in tensors.values()) <= _TENSOR_BUDGET:
                explicit = tensors
        return cls(rid, law, backend, case_d, dict(params), _tolerance(law), message, versions(),
                   datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   f"{rid}.npz" if explicit else None, explicit)

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "explicit"}
        return {"format": FORMAT_VERSION, **d}

    def to_case(self):
        return _case_from_dict(self.case, self.explicit)

    def summary(self) -> str:
        first = self.message.splitlines()[0] if self.message else ""
        return f"{self.id}  {self.law:<22} {self.backend:<12} {first}"


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8).numpy()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy()
    return t.numpy()


_DTYPES = {"float8_e4m3fn": torch.float8_e4m3fn, "bfloat16": torch.bfloat16}


def save(reg: Regression, *, directory=None) -> Path:
    """Write ``<id>.json`` (and ``<id>.npz``) into the regressions folder; return the JSON path."""
    folder = globals()["directory"](directory)
    folder.mkdir(parents=True, exist_ok=True)
    if reg.explicit:
        arrays = {k: _to_numpy(v) for k, v in reg.explicit.items()}
        arrays.update({f"__dtype__{k}": np.array(str(v.dtype).removeprefix("torch.")) for k, v in reg.explicit.items()})
        np.savez(folder / f"{reg.id}.npz", **arrays)
    path = folder / f"{reg.id}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(reg.to_json(), indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
    return path


def _load_npz(path: Path) -> dict:
    out = {}
    with np.load(path, allow_pickle=False) as z:
        for key in z.files:
            if key.startswith("__dtype__"):
                continue
            dtype = str(z[f"__dtype__{key}"]) if f"__dtype__{key}" in z.files else None
            t = torch.from_numpy(np.array(z[key]))
            out[key] = t.view(_DTYPES[dtype]) if dtype in _DTYPES else t
    return out


def load(id_or_path, *, directory=None) -> Regression:
    """Read a regression by id (in the folder) or by path; unknown fields are a ValueError."""
    p = Path(id_or_path)
    if p.suffix != ".json":
        p = globals()["directory"](directory) / f"{id_or_path}.json"
    if not p.is_file():
        raise ValueError(f"regression {id_or_path!r}: no file {p}")
    data = json.loads(p.read_text())
    unknown = set(data) - _FIELDS
    if unknown:
        raise ValueError(f"{p.name}: unknown field(s) {sorted(unknown)}; expected {sorted(_FIELDS)}")
    if data.pop("format", None) != FORMAT_VERSION:
        raise ValueError(f"{p.name}: format must be {FORMAT_VERSION}")
    explicit = _load_npz(p.parent / data["tensors"]) if data.get("tensors") else None
    return Regression(**data, explicit=explicit)


def list_ids(*, directory=None) -> list[str]:
    folder = globals()["directory"](directory)
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def should_capture() -> bool:
    """Capture outside hypothesis, and inside it only on the final run of the shrunk example."""
    from hypothesis.control import currently_in_test_context
    if not currently_in_test_context():
        return True
    from hypothesis.control import current_build_context
    return bool(getattr(current_build_context(), "is_final", True))


def replay(reg: Regression, backend=None) -> None:
    """Run the captured law again (raises AssertionError with the replay line when it still fails)."""
    from kernels import get_backend
    from properties.laws import check
    be = get_backend(reg.backend) if backend is None else backend
    check(reg.law, be, reg.to_case(), capture=False, **reg.params)

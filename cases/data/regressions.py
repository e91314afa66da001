"""Captured failures: cases/regressions/<id>.json (+ <id>.npz), written before a failure is reported.

This module is the one writer of regression files. :func:`check` runs a law of
:mod:`properties.laws` by name and, when it fails, captures the case and re-raises with the replay
command as the message's last line; pytest's law tests and ``pfa-verify run`` both capture through it
(:func:`capture`), and :func:`replay` runs a captured law again under the same rule it was captured
under (the ``acceptance`` law is :func:`properties.acceptance.judge`, whatever runs it).

A regression file records everything needed to replay one failed law in a fresh process: the law's
name and parameters, the case (a golden config and seed, or an AT-12 case, or a quantizer input),
the backend, the tolerance in force, the failure message and the package versions. Tensors the case
was run on are stored next to it in an .npz (fp8 as uint8 codes; never pickle, loaded with
allow_pickle=False), so a replay does not depend on ``golden.make_inputs`` staying the same.

A case file is data: its JSON Schema is cases/regression.schema.json, checked where it is written
(:func:`save`) and read (:func:`load`). :func:`load` rejects, with a UsageError (a ValueError) naming
the file, anything malformed, and a case whose tensors would exceed ``golden.memory_limit()`` (checked
from the config and the .npz headers before anything is allocated).

The id is a hash of (law, backend, case, parameters): capturing the same failure twice rewrites the
same file. Hypothesis's database is a cache; this folder is the record. The folder is
cases/regressions/ unless ``PFA_VERIFY_REGRESSIONS`` names another (tests use a temporary one).
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import zipfile
from pathlib import Path

import numpy as np
import torch

from golden.errors import UsageError
from cases.data import FOLDER

__all__ = ["REGRESSIONS_ENV", "Regression", "directory", "save", "load", "list_ids", "should_capture", "capture", "check",
           "replay", "replay_command", "kernel_raised", "FORMAT_VERSION", "MAX_FILE_BYTES"]

# Format 2 (pfa-verify after issue 9): make_inputs' "tiny" distribution shrinks Q and K only. A
# format-1 case is still read; one that must be rebuilt from (config, seed) with "tiny" is refused.
FORMAT_VERSION = 2
REGRESSIONS_ENV = "PFA_VERIFY_REGRESSIONS"   # another regressions folder than cases/regressions/
_TENSOR_BUDGET = 16 * 2**20  # bytes; larger inputs are replayed from config + seed only
MAX_FILE_BYTES = 4 * 2**20   # a case's JSON holds a config and a message: anything bigger is not one


def directory(path=None) -> Path:
    if path is not None:
        return Path(path)
    env = os.environ.get(REGRESSIONS_ENV)
    return Path(env) if env else FOLDER / "regressions"


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
    raise UsageError(f"case.kind={kind!r} must be 'paged', 'at12' or 'array'")


def _tolerance(law: str) -> dict:
    from properties.compare import TOLERANCES
    from properties.laws import LAWS
    kind = LAWS[law].tolerance if law in LAWS else "attention"
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
        from cases.data.versions import versions
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
    from cases.data.schemas import check_written
    data = reg.to_json()
    check_written(data, "regression")
    folder = globals()["directory"](directory)
    folder.mkdir(parents=True, exist_ok=True)
    if reg.explicit:
        arrays = {k: _to_numpy(v) for k, v in reg.explicit.items()}
        arrays.update({f"__dtype__{k}": np.array(str(v.dtype).removeprefix("torch.")) for k, v in reg.explicit.items()})
        np.savez(folder / f"{reg.id}.npz", **arrays)
    path = folder / f"{reg.id}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
    return path


def _check_npz(path: Path, limit: int) -> None:
    """Reject an .npz whose arrays would hold more than ``limit`` bytes, from the .npy headers of its
    members alone (shape and dtype; nothing is allocated), and one that is not a readable zip."""
    total = 0
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                with z.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    read = {(1, 0): np.lib.format.read_array_header_1_0,
                            (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                    if read is None:
                        raise UsageError(f"member {info.filename}: .npy format {version} is not supported")
                    shape, _, dtype = read(member)
                    total += int(np.prod(shape, dtype=object)) * dtype.itemsize
    except (OSError, zipfile.BadZipFile, ValueError, TypeError) as exc:
        raise UsageError(f"{path.name}: not a readable .npz ({exc})") from None
    if total > limit:
        raise UsageError(f"{path.name}: its arrays would hold {total} bytes, over the limit of {limit} "
                         "(--max-bytes or PFA_VERIFY_MAX_BYTES)")


def _load_npz(path: Path) -> dict:
    import golden
    _check_npz(path, golden.memory_limit())
    out = {}
    try:
        with np.load(path, allow_pickle=False) as z:
            for key in z.files:
                if key.startswith("__dtype__"):
                    continue
                dtype = str(z[f"__dtype__{key}"]) if f"__dtype__{key}" in z.files else None
                t = torch.from_numpy(np.array(z[key]))
                out[key] = t.view(_DTYPES[dtype]) if dtype in _DTYPES else t
    except (OSError, ValueError, KeyError, MemoryError) as exc:
        raise UsageError(f"{path.name}: cannot read its tensors ({exc})") from None
    return out


def _check_schema(name: str, data) -> None:
    """The file against cases/regression.schema.json, then what a schema cannot say (an array case's
    values fill its shape)."""
    from cases.data import schemas
    found = schemas.violations(data, "regression")
    if found:
        e = found[0]
        place = f"field {schemas.where(e.absolute_path)!r}: " if e.absolute_path else ""
        raise UsageError(f"{name}: {place}{schemas.describe(e, noun='field')}" + schemas.and_more(found))
    case = data["case"]
    if case["kind"] == "array" and len(case["values"]) != math.prod(case["shape"]):
        raise UsageError(f"{name}: an array case of shape {case['shape']} needs {math.prod(case['shape'])} values, "
                         f"got {len(case['values'])}")


def load(id_or_path, *, directory=None) -> Regression:
    """Read a regression by id (in the folder) or by path. A UsageError naming the file for anything
    that is not a well-formed case: unknown or missing fields, bad JSON, a config the golden rejects,
    a case over the memory limit (golden.check_size), tensors that do not load."""
    p = Path(id_or_path)
    if p.suffix != ".json":
        p = globals()["directory"](directory) / f"{id_or_path}.json"
    if not p.is_file():
        raise UsageError(f"regression {id_or_path!r}: no file {p}")
    if p.stat().st_size > MAX_FILE_BYTES:
        raise UsageError(f"{p.name}: {p.stat().st_size} bytes is too large for a case file (at most {MAX_FILE_BYTES})")
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{p.name}: not valid JSON ({exc})") from None
    _check_schema(p.name, data)
    fmt = data.pop("format")
    case = data["case"]
    if fmt == 1 and not data.get("tensors") and (case.get("config") or {}).get("distribution") == "tiny":
        raise UsageError(f"{p.name}: a format-1 case of distribution 'tiny' without its tensors cannot be rebuilt "
                         "(make_inputs' 'tiny' changed in format 2); capture it again")
    try:
        reg = Regression(**data)
        probe = _case_from_dict(case, None)          # validates the config; allocates nothing
    except (TypeError, ValueError, KeyError) as exc:
        raise UsageError(f"{p.name}: {exc}") from None
    from properties.laws import LAWS
    if reg.law not in LAWS:
        raise UsageError(f"{p.name}: law {reg.law!r} is not a law; expected one of {sorted(LAWS)}")
    import golden
    if case.get("kind") == "paged":
        try:
            golden.check_size(probe.config, name=reg.id)
        except ValueError as exc:
            raise UsageError(f"{p.name}: {exc}") from None
    elif case.get("kind") == "at12":
        need = 4 * probe.q_tile * probe.k_tile + 16 * (probe.q_tile + probe.k_tile) * probe.head_dim
        if need > golden.memory_limit():
            raise UsageError(f"{p.name}: an AT-12 case of {probe.q_tile} x {probe.k_tile} x {probe.head_dim} needs "
                             f"{need} bytes, over the limit of {golden.memory_limit()}")
    if data.get("tensors"):
        reg = dataclasses.replace(reg, explicit=_load_npz(p.parent / Path(data["tensors"]).name))
    return reg


def list_ids(*, directory=None) -> list[str]:
    folder = globals()["directory"](directory)
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def should_capture() -> bool:
    """Capture outside hypothesis, and inside it only on the final run of the shrunk example."""
    from properties.generation import reported_example
    return reported_example()


def replay_command(regression_id: str, directory=None) -> str:
    """The one command that replays a captured case, naming the folder when it is not the default:
    ``directory`` when given, else $PFA_VERIFY_REGRESSIONS when set to another folder (pytest's
    capture), so the line works pasted into a shell without that variable."""
    if directory is None:
        env = os.environ.get(REGRESSIONS_ENV)
        default = FOLDER / "regressions"
        directory = env if env and Path(env).resolve() != default else None
    where = f" --dir {directory}" if directory is not None else ""
    return f"pfa-verify cases{where} replay {regression_id}"


def capture(law: str, backend_name: str, case, params: dict, message: str, *, enabled: bool = True,
            directory=None) -> tuple[str | None, str]:
    """Capture a failure of ``law``: ``(replay command or None, the line that ends its message)``.

    Written when ``enabled`` and :func:`should_capture`; with ``enabled`` False the line says the case
    was not kept, instead of naming an id that does not exist on disk.
    """
    if not enabled:
        return None, "Not captured (--no-capture): run again without it to keep a replayable case"
    reg = Regression.from_failure(law, backend_name, case, params, message)
    if not should_capture():
        return None, "Replay: captured once hypothesis has shrunk this example"
    save(reg, directory=directory)
    command = replay_command(reg.id, directory)
    return command, f"Replay: {command}"


def check(law: str, backend, case, *, backend_name: str | None = None, capture_failures: bool = True,
          directory=None, **params) -> None:
    """Run law ``law`` (properties.laws); on failure capture the case (:func:`capture`) and re-raise
    with the replay command as the message's last line. ``backend_name`` is how a fresh process
    rebuilds the backend (default: ``backend.name``)."""
    __tracebackhide__ = True
    from kernels import KernelRunError
    from properties import laws
    try:
        laws.run(law, backend, case, **params)
    except AssertionError as exc:
        message = str(exc)
        _, line = capture(law, backend_name or getattr(backend, "name", "golden"), case, params, message,
                          enabled=capture_failures, directory=directory)
        raise AssertionError(f"{message}\n{line}") from None
    except KernelRunError as exc:
        # The kernel did not deliver (an out-of-bounds read, a failure inside pypto): a failure of this case
        # like any other, captured and replayable, its message naming the case.
        message = kernel_raised(law, backend, case, exc)
        _, line = capture(law, backend_name or getattr(backend, "name", "golden"), case, params, message,
                          enabled=capture_failures, directory=directory)
        raise AssertionError(f"{message}\n{line}") from exc


def kernel_raised(law: str, backend, case, exc: BaseException) -> str:
    """The failure text of a law whose kernel raised: the law, the case, the backend and the error."""
    text = str(exc).strip()
    return (f"Law {law}: the kernel raised {type(exc).__name__} [case {case.label()}, backend "
            f"{getattr(backend, 'name', '?')}]\n{text}")


def replay(reg: Regression, backend=None, *, directory=None) -> None:
    """Run the captured law again, under the rule it was captured under (raises AssertionError ending
    with the replay line, naming ``directory`` when given, when it still fails)."""
    __tracebackhide__ = True
    from kernels import get_backend
    from properties import laws
    be = get_backend(reg.backend) if backend is None else backend
    try:
        laws.run(reg.law, be, reg.to_case(), **reg.params)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nReplay: {replay_command(reg.id, directory)}") from None

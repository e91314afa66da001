"""Captured failures: <folder>/<id>.json (+ <id>-<sha12>.npz), written before a failure is reported.

This module is the one writer of regression files. :func:`check` runs a law of
:mod:`properties.search.laws` by name and, when it fails, captures the case and re-raises with the replay
command as the message's last line; pytest's law tests and ``pfa-verify run`` both capture through it
(:func:`capture`), and :func:`replay` runs a captured law again under the same rule it was captured
under (the ``acceptance`` law is :func:`properties.rule.acceptance.judge`, whatever runs it).

A regression file records everything needed to replay one failed law in a fresh process: the law's
name and parameters, the case (a golden config and seed, or an AT-12 case, or a quantizer input),
the backend, the tolerance in force, the failure message and the package versions. Tensors the case
was run on are stored next to it in an .npz named by its content (cases/data/capture_tensors.py: fp8 as
uint8 codes; never pickle), whose sha256 and arrays the record lists, so a replay does not depend on
``golden.make_inputs`` staying the same.

Evidence that survives (cases/data/capture_files.py): :func:`save` writes the .npz, then the record,
each through a unique temporary file, fsynced and renamed into place, holding the folder's lock; a
re-capture never destroys the capture it replaces, and a write that fails leaves nothing behind and
raises :class:`CaptureWriteError` (one line naming the path and the OS error). :func:`leftovers` and
:func:`remove_leftovers` find and remove what killed writers leave (``cases prune``).

A case file is data: its JSON Schema is cases/regression.schema.json, checked where it is written
(:func:`save`) and read (:func:`load`). :func:`load` rejects, with a UsageError (a ValueError) naming
the file, anything malformed: a record or .npz that is not a regular file in the folder, over its size
limit, a record nested deeper than ``MAX_JSON_DEPTH``, an .npz whose sha256 is not the record's, or
whose arrays are not those the case's config implies (names, dtypes, shapes: checked for every format),
and a case over ``golden.memory_limit()`` (from the config, before anything is allocated).

A case file is what its id says (cases/data/capture_identity.py): the id is a hash of everything a
replay uses (law, backend, case, parameters, tolerance, the tensors' sha256), re-derived by :func:`load`,
which also holds the tolerance to the law's of this version and the config to the stored arrays
(capture_tensors.check_agreement); capturing the same failure twice rewrites the same file. A capture
whose kernel answered the same inputs differently is marked ``nondeterministic`` (:func:`mark_nondeterministic`,
a field the id does not cover; a re-capture keeps it), and ``cases prune`` never removes it.
Hypothesis's database is a cache; this folder is the record.

Two folders, two roles. The user's (:func:`directory`: ``--regressions DIR``, else ``$PFA_VERIFY_REGRESSIONS``,
else ``./pfa-verify-regressions`` of the working directory, created by the first capture) is the one
written, marked and pruned. The package's own (:data:`SHIPPED`, cases/regressions/) is read-only data
that every run replays beside the user's (:func:`replayed_ids`); :func:`save`, :func:`mark_nondeterministic`,
:func:`remove` and :func:`remove_leftovers` refuse it (:func:`refuse_shipped`), so nothing is ever written
into an installed package. :func:`load` finds an id in the user's folder, else among the shipped captures
(cases/data/capture_folders.py says which folder is which).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import time
from pathlib import Path

from pfa_verify import golden
from pfa_verify.cases.data import capture_files, capture_identity, capture_tensors, schemas
from pfa_verify.cases.data.capture_files import MAX_JSON_DEPTH, STALE_TEMPORARY_SECONDS, CaptureWriteError, Leftover
from pfa_verify.cases.data.capture_folders import (
    DEFAULT_FOLDER,
    REGRESSIONS_ENV,
    SHIPPED,
    directory,
    holding,
    is_shipped,
    list_ids,
    refuse_shipped,
    replayed_ids,
    shipped_ids,
)
from pfa_verify.cases.data.capture_record import FORMAT_VERSION, TENSOR_BUDGET, Regression, case_from_dict, mark, stored
from pfa_verify.cases.data.diagnosed import explain
from pfa_verify.cases.data.schemas import check_written
from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels import KernelRunError, get_backend
from pfa_verify.kernels.backends.faults import KernelRaised, describe_failure
from pfa_verify.properties.search import laws
from pfa_verify.properties.search.generation import reported_example
from pfa_verify.properties.search.laws import LAWS

__all__ = ["REGRESSIONS_ENV", "DEFAULT_FOLDER", "SHIPPED", "Regression", "directory", "is_shipped", "refuse_shipped",
           "shipped_ids", "replayed_ids", "save", "load", "list_ids", "should_capture", "capture", "check",
           "replay", "replay_command", "kernel_raised", "remove", "leftovers", "remove_leftovers", "mark_nondeterministic",
           "CaptureWriteError", "Leftover", "FORMAT_VERSION", "MAX_FILE_BYTES", "MAX_NPZ_BYTES", "MAX_JSON_DEPTH",
           "STALE_TEMPORARY_SECONDS", "PASSING_REPLAYS"]

MAX_FILE_BYTES = 4 * 2**20   # a case's JSON holds a config and a message: anything bigger is not one
MAX_NPZ_BYTES = TENSOR_BUDGET + 2**20   # the stored tensors plus their .npy headers, markers and zip directory


#: How many replays must all pass before a capture counts as passing where one replay would not do:
#: ``cases prune`` removes a capture only then, and ``run`` replays a capture marked nondeterministic that
#: many times. A failure that shows on a fraction p of a kernel's calls (a race) survives N passing replays
#: with probability (1 - p)^N: for N = 10, 1/1024 at p = 1/2 and 5.6% at p = 1/4.
PASSING_REPLAYS = 10


def save(reg: Regression, *, directory=None) -> Path:
    """Write ``<id>.json`` (and its ``<id>-<sha12>.npz``) into the regressions folder; return the JSON path.

    The .npz first, the record last, each fsynced and renamed into place (cases/data/capture_files.py),
    under the folder's lock; then the .npz the replaced record named, if another, is removed. The
    record's ``tensors``, ``tensors_sha256`` and ``arrays`` are those of ``reg.explicit`` as written.
    A failure of the disk or the folder is a :class:`CaptureWriteError`, with nothing of this capture
    left behind and an earlier capture of ``reg.id`` intact; so is an interrupt before the record is
    renamed (after it, the capture is made, and the old .npz may stay, an orphan for ``cases prune``).
    A record whose id is not its content's (an edited Regression: a bug of ours) is a RuntimeError, before
    anything is written; a ``nondeterministic`` mark of the record it replaces is kept.
    """
    blob, fields = (stored(reg.id, reg.explicit) if reg.explicit
                    else (None, dict.fromkeys(("tensors", "tensors_sha256", "arrays"))))
    data = {**reg.to_json(), "format": FORMAT_VERSION, **fields}
    check_written(data, "regression")
    derived = capture_identity.content_id(data, FORMAT_VERSION)
    if derived != reg.id:
        raise RuntimeError(f"regression {reg.id}: its content hashes to id {derived}: a Regression is made by "
                           "Regression.from_failure, never edited (a bug of ours)")
    folder = globals()["directory"](directory)
    refuse_shipped(folder)
    path = folder / f"{reg.id}.json"

    def text(replaced: bytes | None) -> bytes:
        # A re-capture of a case marked nondeterministic keeps the mark: the new failure does not unsee it.
        kept = data["nondeterministic"] or _mark_in(replaced, reg.id)
        return _encoded({**data, "nondeterministic": kept})
    try:
        capture_files.commit(folder, path.name, text, fields["tensors"], blob, record_limit=MAX_FILE_BYTES)
    except CaptureWriteError:
        raise
    except OSError as exc:
        raise CaptureWriteError(path, exc) from None
    return path


def _encoded(data: dict) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=False) + "\n").encode()


def _mark_in(record: bytes | None, rid: str) -> dict | None:
    """The ``nondeterministic`` mark of the record bytes ``record`` when it is a record of ``rid`` with a
    well-formed mark; else None."""
    try:
        data = capture_files.parse_json(record, f"{rid}.json") if record is not None else None
    except UsageError:
        return None
    mark = data.get("nondeterministic") if isinstance(data, dict) and data.get("id") == rid else None
    well_formed = isinstance(mark, dict) and set(mark) == {"seen", "at"} and all(isinstance(v, str) for v in mark.values())
    return mark if well_formed else None


def mark_nondeterministic(regression_id: str, seen: str, *, directory=None) -> bool:
    """Mark the capture ``regression_id`` nondeterministic (``seen``: how its kernel was seen to answer the
    same inputs differently), durably, through the one writer: its record is rewritten under the folder's
    lock, its id and tensors unchanged (the id does not cover the mark). A record that does not load is a
    UsageError (:func:`load`); False when it was marked already (the first sighting is kept) or is gone."""
    load(regression_id, directory=directory)          # only a case file that is what its id says is marked
    folder = holding(regression_id, directory)
    refuse_shipped(folder, shown=f"capture {regression_id}")

    def update(current: bytes) -> bytes | None:
        data = capture_files.parse_json(current, f"{regression_id}.json")
        if not isinstance(data, dict) or data.get("id") != regression_id or data.get("nondeterministic"):
            return None
        data["nondeterministic"] = mark(seen)
        check_written(data, "regression")
        return _encoded(data)
    try:
        return capture_files.rewrite(folder, f"{regression_id}.json", update, record_limit=MAX_FILE_BYTES)
    except CaptureWriteError:
        raise
    except OSError as exc:
        raise CaptureWriteError(folder / f"{regression_id}.json", exc) from None


def remove(regression_id: str, *, directory=None) -> list[str]:
    """Delete a capture (its record first, then the .npz it names), under the folder's lock; the names
    removed. A missing capture removes nothing."""
    folder = globals()["directory"](directory)
    refuse_shipped(folder)
    if not capture_files.is_plain_name(regression_id) or not folder.is_dir():
        return []
    return capture_files.discard(folder, f"{regression_id}.json", record_limit=MAX_FILE_BYTES)


def leftovers(directory=None, *, min_age: float = STALE_TEMPORARY_SECONDS) -> tuple[list[Leftover], list[Leftover]]:
    """``(to remove, kept)``: files of the folder that are no part of a capture (capture_files.leftovers):
    temporary files older than ``min_age`` seconds and .npz files no record names; younger temporary
    files and the .npz files of an unreadable record are kept."""
    return capture_files.leftovers(globals()["directory"](directory), MAX_FILE_BYTES, min_age=min_age)


def remove_leftovers(directory=None, *, dry_run: bool = False,
                     min_age: float = STALE_TEMPORARY_SECONDS) -> tuple[list[Leftover], list[Leftover]]:
    """Remove :func:`leftovers` (unless ``dry_run``), under the folder's lock so that no capture is
    writing meanwhile; ``(removed or to remove, kept)``."""
    refuse_shipped(globals()["directory"](directory))
    return capture_files.sweep(globals()["directory"](directory), MAX_FILE_BYTES, dry_run=dry_run, min_age=min_age)


def _load_tensors(folder: Path, record: str, data: dict, config) -> dict:
    """The stored tensors of a paged case's record ``data``: the .npz against the record's sha256 (format
    3), then every array against what ``config`` implies (every format)."""
    name = data["tensors"]
    if not capture_files.is_plain_name(name):
        raise UsageError(f"{record}: names tensors {name!r}, not a file of its folder")
    want = capture_tensors.expected(config)
    if data.get("arrays") is not None and data["arrays"] != want:
        differ = next((f"{a}" for a, w in zip(data["arrays"], want, strict=False) if a != w), f"{len(data['arrays'])} arrays")
        raise UsageError(f"{record}: its arrays are not those its config implies (first: {differ})")
    try:
        blob = capture_files.read_regular(folder / name, MAX_NPZ_BYTES,
                                          missing=f"{record}: its tensors file {name} is missing")
    except UsageError:
        if capture_files.pointer(folder / record, MAX_FILE_BYTES)[1] != name:
            raise _Recaptured(record) from None   # re-captured since the record was read: read it again
        raise
    if data.get("tensors_sha256") is not None:
        digest = hashlib.sha256(blob).hexdigest()
        if digest != data["tensors_sha256"]:
            raise UsageError(f"{name}: sha256 {digest[:12]}... is not {data['tensors_sha256'][:12]}... that {record} "
                             "records: the file was damaged or replaced")
    tensors = capture_tensors.read_npz(blob, name, want)
    capture_tensors.check_agreement(record, config, tensors)
    return tensors


def _check_schema(name: str, data) -> None:
    """The file against cases/regression.schema.json, then what a schema cannot say (an array case's
    values fill its shape)."""
    found = schemas.violations(data, "regression")
    if found:
        e = found[0]
        place = f"field {schemas.where(e.absolute_path)!r}: " if e.absolute_path else ""
        raise UsageError(f"{name}: {place}{schemas.describe(e, noun='field')}" + schemas.and_more(found))
    case = data["case"]
    if case["kind"] == "array" and len(case["values"]) != math.prod(case["shape"]):
        raise UsageError(f"{name}: an array case of shape {case['shape']} needs {math.prod(case['shape'])} values, "
                         f"got {len(case['values'])}")


RECAPTURE_WAIT_S = 5.0     # how long load() reads again while a case is being re-captured


class _Recaptured(Exception):
    """The record named an .npz that a re-capture has since replaced."""


def load(id_or_path, *, directory=None) -> Regression:
    """Read a regression by id (in the user's folder, else among the shipped captures) or by path. A
    UsageError naming the file for anything
    that is not a well-formed case: unknown or missing fields, bad JSON, a config the golden rejects,
    a case over the memory limit (golden.check_size), tensors that do not load (the module docstring)."""
    p = Path(id_or_path)
    if p.suffix != ".json":
        if not capture_files.is_plain_name(str(id_or_path)):
            raise UsageError(f"regression {id_or_path!r}: not an id (the name of a case file in the folder, "
                             "as `pfa-verify cases list` shows it) nor a path to a .json file")
        p = holding(str(id_or_path), directory) / f"{id_or_path}.json"
    # A capture swaps the record and its tensors in two renames: a read between them finds the tensors
    # the record names gone and reads again. Writers in a tight loop can win a few times in a row (seen
    # with three under load), so the reads back off, for at most RECAPTURE_WAIT_S in all.
    deadline, attempt = time.monotonic() + RECAPTURE_WAIT_S, 0
    while True:
        attempt += 1
        with contextlib.suppress(_Recaptured):
            return _load_record(p, id_or_path)
        if time.monotonic() >= deadline:
            raise UsageError(f"{p.name}: re-captured {attempt} times while it was read ({RECAPTURE_WAIT_S:g} s); "
                             "read it again")
        time.sleep(min(0.2, 0.005 * 2 ** attempt))


def _load_record(p: Path, id_or_path) -> Regression:
    """One reading of the record ``p`` and its tensors (:func:`load` reads again after a re-capture)."""
    blob = capture_files.read_regular(p, MAX_FILE_BYTES, missing=f"regression {id_or_path!r}: no file {p}")
    data = capture_files.parse_json(blob, p.name)
    _check_schema(p.name, data)
    fmt = data.pop("format")
    case = data["case"]
    if fmt == 1 and not data.get("tensors") and (case.get("config") or {}).get("distribution") == "tiny":
        raise UsageError(f"{p.name}: a format-1 case of distribution 'tiny' without its tensors cannot be rebuilt "
                         "(make_inputs' 'tiny' changed in format 2); capture it again")
    try:
        reg = Regression(**data, format=fmt)
        probe = case_from_dict(case, None)          # validates the config; allocates nothing
    except (TypeError, ValueError, KeyError) as exc:
        raise UsageError(f"{p.name}: {exc}") from None
    if reg.law not in LAWS:
        raise UsageError(f"{p.name}: law {reg.law!r} is not a law; expected one of {sorted(LAWS)}")
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
    capture_identity.check_tolerance(p.name, reg.law, reg.tolerance)
    if data.get("tensors"):
        if case.get("kind") != "paged":
            raise UsageError(f"{p.name}: a case of kind {case.get('kind')!r} stores no tensors, "
                             f"yet names {data['tensors']}")
        reg = dataclasses.replace(reg, explicit=_load_tensors(p.parent, p.name, data, probe.config))
    capture_identity.check_identity(p.name, data, fmt, p.stem)
    return reg


def should_capture() -> bool:
    """Capture outside hypothesis, and inside it only on the final run of the shrunk example."""
    return reported_example()


def replay_command(regression_id: str, directory=None) -> str:
    """The one command that replays a captured case, naming the folder when it is not the default:
    ``directory`` when given, else $PFA_VERIFY_REGRESSIONS when set (pytest's capture), so the line works
    pasted into a shell without that variable, from another working directory too."""
    if directory is None:
        directory = os.environ.get(REGRESSIONS_ENV) or None
    where = f" --regressions {directory}" if directory is not None else ""
    return f"pfa-verify cases{where} replay {regression_id}"


def capture(law: str, backend_name: str, case, params: dict, message: str, *, enabled: bool = True,
            directory=None, nondeterministic: str | None = None) -> tuple[str | None, str]:
    """Capture a failure of ``law``: ``(replay command or None, the line that ends its message)``.

    Written when ``enabled`` and :func:`should_capture`; with ``enabled`` False the line says the case
    was not kept, instead of naming an id that does not exist on disk. ``nondeterministic`` (how the
    kernel was seen to answer the same inputs differently) marks the capture so. A capture the disk or
    the folder refuses raises :class:`CaptureWriteError` (one line; nothing left behind).
    """
    if not enabled:
        return None, "Not captured (--no-capture): run again without it to keep a replayable case"
    if not should_capture():
        return None, "Replay: captured once hypothesis has shrunk this example"
    reg = Regression.from_failure(law, backend_name, case, params, message, nondeterministic=nondeterministic)
    save(reg, directory=directory)
    command = replay_command(reg.id, directory)
    return command, f"Replay: {command}"


def check(law: str, backend, case, *, backend_name: str | None = None, capture_failures: bool = True,
          directory=None, **params) -> None:
    """Run law ``law`` (properties.search.laws); on failure diagnose it (cases/data/diagnosed.py), capture the case
    (:func:`capture`) and re-raise with the replay command as the message's last line (or, when the capture could not be written,
    a line saying so: the law's failure is the news, not the disk's). ``backend_name`` is how a fresh
    process rebuilds the backend (default: ``backend.name``)."""
    __tracebackhide__ = True
    name = backend_name or getattr(backend, "name", "golden")
    try:
        laws.run(law, backend, case, **params)
    except AssertionError as exc:
        # diagnosed where it is reported: on the example Hypothesis reports, not while it shrinks
        message = explain(exc, backend).message if should_capture() else str(exc)
        line = _capture_line(law, name, case, params, message, capture_failures, directory)
        raise AssertionError(f"{message}\n{line}") from None
    except (KernelRunError, KernelRaised) as exc:
        # The kernel did not deliver (an out-of-bounds read, a failure inside pypto) or raised (under a
        # supervisor, or guarded in process): a failure of this case like any other, captured and
        # replayable, its message naming the case and the kernel's own exception.
        message = kernel_raised(law, backend, case, exc)
        line = _capture_line(law, name, case, params, message, capture_failures, directory)
        raise AssertionError(f"{message}\n{line}") from exc


def _capture_line(law, backend_name, case, params, message, enabled, directory) -> str:
    try:
        return capture(law, backend_name, case, params, message, enabled=enabled, directory=directory)[1]
    except CaptureWriteError as exc:
        return f"Not captured: {exc}"


def kernel_raised(law: str, backend, case, exc: BaseException) -> str:
    """The failure text of a law whose kernel raised: the law, the case, the backend and the error."""
    name, _, text = describe_failure(exc).partition(": ")       # the kernel's own exception type, not ours
    label = case.label() if hasattr(case, "label") else repr(case)
    return (f"Law {law}: the kernel raised {name} [case {label}, backend "
            f"{getattr(backend, 'name', '?')}]\n{text}")


def replay(reg: Regression, backend=None, *, directory=None) -> None:
    """Run the captured law again, under the rule it was captured under (raises AssertionError, diagnosed
    (cases/data/diagnosed.py) and ending with the replay line, naming ``directory`` when given, when it still fails)."""
    __tracebackhide__ = True
    be = get_backend(reg.backend) if backend is None else backend
    try:
        laws.run(reg.law, be, reg.to_case(), **reg.params)
    except AssertionError as exc:
        raise AssertionError(f"{explain(exc, be).message}\nReplay: {replay_command(reg.id, directory)}") from None

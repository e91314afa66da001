"""A captured case is what its id says: the id is a hash of the content a replay uses, re-derived on every read.

The id of a record of format 4 is the first 10 hex digits of the sha256 of the canonical JSON (sorted keys,
no spaces) of ``{"format": 4, "law", "backend", "case", "params", "tolerance", "tensors_sha256"}``:
everything a replay reads from the record (the law and its parameters, the backend it rebuilds, the case:
kind, config, seed and name, or an AT-12 or array case, the tolerance it is judged under) and, through
the sha256 of the .npz, every stored tensor. ``message``, ``versions``, ``created`` and the
``nondeterministic`` mark describe the capture and are not covered (marking a case keeps its id). A record
of format 1 to 3 keeps its own rule: the sha256 of ``json.dumps([law, backend, case, params],
sort_keys=True)``; its tensors are held by the checks below and, in format 3, by their sha256 alone.

On reading (:func:`check_identity`), for every format: the record's ``id`` is its file's name and the id
its content hashes to, and its ``tensors`` is the name its format gives the .npz (``<id>.npz`` in formats
1 and 2, ``<id>-<sha12>.npz`` after). The tolerance must be the one the law holds in this version
(:func:`check_tolerance`): a case captured under another is refused, not replayed under a rule it was not
captured under. Each refusal is a :class:`golden.errors.UsageError` of one line naming the file.
"""
from __future__ import annotations

import hashlib
import json

from pfa_verify.golden.errors import UsageError
from pfa_verify.properties.rule.compare import TOLERANCES
from pfa_verify.properties.search.laws import LAWS

__all__ = ["ID_DIGITS", "COVERED", "content_id", "tensors_name", "law_tolerance", "check_identity",
           "check_tolerance"]

ID_DIGITS = 10
#: The fields each format's id covers, in the words of a refusal.
COVERED = {4: ("law", "backend", "case", "params", "tolerance", "tensors_sha256"),
           3: ("law", "backend", "case", "params"), 2: ("law", "backend", "case", "params"),
           1: ("law", "backend", "case", "params")}


def content_id(data: dict, fmt: int) -> str:
    """The id of a record whose fields are ``data`` under format ``fmt``'s rule (the module docstring)."""
    if fmt >= 4:
        key = json.dumps({"format": 4, **{f: data.get(f) for f in COVERED[4]}}, sort_keys=True,
                         separators=(",", ":"))
    else:
        key = json.dumps([data.get("law"), data.get("backend"), data.get("case"), data.get("params")],
                         sort_keys=True, default=str)
    return hashlib.sha256(key.encode()).hexdigest()[:ID_DIGITS]


def tensors_name(fmt: int, rid: str, tensors_sha256: str | None) -> str:
    """The name of the .npz of capture ``rid`` in format ``fmt``: named by its content from format 3 on."""
    return f"{rid}-{tensors_sha256[:12]}.npz" if fmt >= 3 and tensors_sha256 else f"{rid}.npz"


def law_tolerance(law: str) -> dict:
    """The tolerance law ``law`` holds in this version, as a record stores it."""
    kind = LAWS[law].tolerance if law in LAWS else "attention"
    t = TOLERANCES[kind]
    return {"kind": kind, "rtol": t.rtol, "atol": t.atol}


def check_tolerance(name: str, law: str, tolerance: dict) -> None:
    """A UsageError unless ``tolerance`` is the one ``law`` holds in this version."""
    now = law_tolerance(law)
    if tolerance != now:
        raise UsageError(f"{name}: captured under tolerance {_words(tolerance)}, but law {law} holds "
                         f"{_words(now)} in this version: replaying it would judge it by another rule; capture it again")


def _words(tolerance: dict) -> str:
    return f"{tolerance.get('kind')!r} (rtol {tolerance.get('rtol')}, atol {tolerance.get('atol')})"


def check_identity(name: str, data: dict, fmt: int, stem: str) -> None:
    """A UsageError unless record ``data`` (of format ``fmt``, read from file ``name`` whose stem is
    ``stem``) is what its id says: the id is the file's name and its content's, and ``tensors`` is the name
    its format gives the .npz."""
    rid = data.get("id")
    if rid != stem:
        raise UsageError(f"{name}: records id {rid!r}, not its file's name {stem!r}")
    derived = content_id(data, fmt)
    if derived != rid:
        raise UsageError(f"{name}: its content hashes to id {derived}, not {rid}: a field the id covers "
                         f"({', '.join(COVERED[min(fmt, 4)])}) was changed since it was captured; capture it again")
    if data.get("tensors"):
        want = tensors_name(fmt, rid, data.get("tensors_sha256"))
        if data["tensors"] != want:
            raise UsageError(f"{name}: names tensors {data['tensors']}, but a capture of format {fmt} names them {want}")

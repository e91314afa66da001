"""The JSON Schemas of the project's data files, beside this module, checked with ``jsonschema``.

=========================  =======================================================  ===================
schema file                what it describes                                        read / written by
=========================  =======================================================  ===================
catalog.schema.json        cases/catalog.json (SPEC §5 names, defaults, edge cases)  cases/data/catalog.py
regression.schema.json     a captured case, <folder>/<id>.json                       cases/data/regressions.py
mutants.schema.json        the kill matrix of ``pfa-verify mutants --json``          cases/measuring/mutants.py
report.schema.json         the report of ``pfa-verify run --json``                   cases/reporting/report.py
=========================  =======================================================  ===================

A file read from disk that breaks its schema is a :class:`golden.errors.UsageError` naming the file
and the first offending place (the reader says which); a document our own code is about to write that
breaks its schema is a bug of ours (:func:`check_written` raises RuntimeError). What a schema cannot
say (duplicate JSON keys, a key required in an entry or in the defaults, an array whose length is a
product of its shape) the readers check in code, beside the schema.
"""
from __future__ import annotations

import functools
import json

import jsonschema

from pfa_verify.cases.data import FOLDER

__all__ = ["SCHEMA_DIR", "schema", "violations", "errors", "describe", "where", "and_more", "check_written"]

SCHEMA_DIR = FOLDER


@functools.cache
def schema(name: str) -> dict:
    """The schema ``<name>.schema.json`` beside this module (checked against its metaschema once)."""
    data = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(data)
    return data


def violations(instance, name: str) -> list:
    """The ``jsonschema.ValidationError`` s of ``instance`` against ``<name>.schema.json`` (draft 2020-12),
    ordered by their paths."""
    found = jsonschema.Draft202012Validator(schema(name)).iter_errors(instance)
    return sorted(found, key=lambda e: [str(p) for p in e.absolute_path])


def errors(instance, name: str) -> list[str]:
    """``"$.path: message"`` for each violation; [] when ``instance`` is valid."""
    return [f"{e.json_path}: {e.message}" for e in violations(instance, name)]


def describe(error, *, noun: str = "key") -> str:
    """One violation in words: unknown and missing keys by name, the schema's message otherwise."""
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = sorted(error.schema.get("properties", {}))
        return f"unknown {noun}(s) {sorted(set(error.instance) - set(known))}; expected some of {known}"
    if error.validator == "required" and isinstance(error.instance, dict):
        return f"missing {noun}(s) {[k for k in error.validator_value if k not in error.instance]}"
    return error.message


def where(path) -> str:
    """A path into a document as people write it: ``case.config['nq']`` style, ``$`` for the top."""
    text = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if k else str(p)) for k, p in enumerate(path))
    return text or "$"


def and_more(found: list) -> str:
    """`` (and N more)`` after the first of ``found`` problems, or nothing for one."""
    return f" (and {len(found) - 1} more)" if len(found) > 1 else ""


def check_written(instance, name: str) -> None:
    """Raise RuntimeError (a bug of ours, not a usage error) when a document we write breaks its schema."""
    found = errors(instance, name)
    if found:
        raise RuntimeError(f"pfa-verify wrote a {name} document that breaks cases/{name}.schema.json: {found[0]}"
                           + and_more(found))

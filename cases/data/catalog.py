"""The case catalog (cases/catalog.json): SPEC §5's six upstream cases by name, plus named edge cases.

The file holds ``defaults`` (the SPEC §5 defaults, as data) and two sections, ``upstream`` and
``edge``, mapping a case name to only what differs from the defaults; its JSON Schema is
cases/catalog.schema.json (section and key names, types, ranges, name spelling). :func:`load_catalog`
returns :class:`~properties.rule.case.Case` values by name. It rejects, with a UsageError (golden.errors,
a ValueError) naming the case and key: anything the schema rejects, then what a schema cannot say:
duplicate keys anywhere in the file, a key an entry needs from itself or the defaults, a name in both
sections, and anything the golden's config rejects.
"""
from __future__ import annotations

import json
from pathlib import Path

from pfa_verify import golden
from pfa_verify.cases.data import FOLDER, schemas
from pfa_verify.golden.errors import UsageError
from pfa_verify.properties.rule.case import Case

__all__ = ["CATALOG_PATH", "SPEC_CASE_NAMES", "load_catalog", "parse_catalog", "entry_config"]

CATALOG_PATH = FOLDER / "catalog.json"
SPEC_CASE_NAMES = (
    "pfa_fp8_b1_s1_2_s2_2048_nkv_8", "pfa_fp8_b16_s1_1_s2_8195_nkv_2", "pfa_fp8_b16_s1_1_s2_8k_nkv_1",
    "pfa_fp8_b16_s1_1_s2_8k_nkv_2", "pfa_fp8_b2_s1_1_s2_1k", "pfa_fp8_b16_s1_1_s2_256_nkv_4",
)
_SECTIONS = ("upstream", "edge")
_REQUIRED = ("batch", "s1", "s2", "nq", "nkv")


def _no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise UsageError(f"duplicate key {key!r} in the catalog")
        seen[key] = value
    return seen


def _schema_error(error) -> str:
    """A catalog schema violation as the case and key it concerns, then what is wrong."""
    path = list(error.absolute_path)
    if "propertyNames" in error.relative_schema_path:
        return f"case name {error.instance!r} must be lower-case letters, digits and underscores"
    if not path and error.validator == "additionalProperties":
        return (f"unknown catalog section(s) {sorted(set(error.instance) - set(error.schema['properties']))}; "
                f"expected {sorted(error.schema['properties'])}")
    if not path:
        return f"catalog: {error.message}"
    head, rest = (f"case {path[1]!r}", path[2:]) if path[0] in _SECTIONS and len(path) > 1 else (str(path[0]), path[1:])
    key = f", key {rest[0]!r}" + "".join(f"[{p}]" for p in rest[1:]) if rest else ""
    return f"{head}{key}: {schemas.describe(error)}"


def entry_config(name: str, entry: dict, defaults: dict):
    """(golden.PagedAttentionConfig, seed) of one catalog entry (already valid by the schema) laid
    over ``defaults``."""
    missing = [k for k in _REQUIRED if k not in entry and k not in defaults]
    if missing:
        raise UsageError(f"case {name!r}: missing key(s) {missing}")
    merged = {**defaults, **entry}
    merged.pop("comment", None)
    seed = merged.pop("seed", 0)
    try:
        config = golden.PagedAttentionConfig.from_dict(merged)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"case {name!r}: {exc}") from None
    return config, seed


def parse_catalog(text: str) -> dict:
    """Cases by name from the catalog's JSON text (see the module docstring for what is rejected)."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise UsageError(f"catalog is not valid JSON: {exc}") from None
    found = schemas.violations(data, "catalog")
    if found:
        raise UsageError(_schema_error(found[0]) + schemas.and_more(found))
    defaults = data.get("defaults", {})
    out: dict = {}
    for section in _SECTIONS:
        for name, entry in data.get(section, {}).items():
            if name in out:
                raise UsageError(f"case {name!r} appears in more than one section")
            config, seed = entry_config(name, entry, defaults)
            out[name] = Case(config, seed, name)
    return out


def load_catalog(path=None) -> dict:
    """Cases by name from cases/catalog.json (or ``path``): upstream first, then edge cases."""
    return parse_catalog(Path(path or CATALOG_PATH).read_text())

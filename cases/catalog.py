"""The case catalog (cases/catalog.json): SPEC §5's six upstream cases by name, plus named edge cases.

The file holds ``defaults`` (the SPEC §5 defaults, as data) and two sections, ``upstream`` and
``edge``, mapping a case name to only what differs from the defaults. :func:`load_catalog` returns
:class:`~properties.case.Case` values by name. It rejects, with a UsageError (golden.errors, a ValueError) naming the key:
duplicate keys anywhere in the file, unknown sections or keys, values of the wrong type, names
that are not identifiers, a name in both sections, and anything the golden's config rejects.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from golden.errors import UsageError

__all__ = ["CATALOG_PATH", "SPEC_CASE_NAMES", "load_catalog", "parse_catalog", "entry_config"]

CATALOG_PATH = Path(__file__).resolve().parent / "catalog.json"
SPEC_CASE_NAMES = (
    "pfa_fp8_b1_s1_2_s2_2048_nkv_8", "pfa_fp8_b16_s1_1_s2_8195_nkv_2", "pfa_fp8_b16_s1_1_s2_8k_nkv_1",
    "pfa_fp8_b16_s1_1_s2_8k_nkv_2", "pfa_fp8_b2_s1_1_s2_1k", "pfa_fp8_b16_s1_1_s2_256_nkv_4",
)
_SECTIONS = ("comment", "defaults", "upstream", "edge")
_INT_KEYS = ("batch", "s1", "s2", "nq", "nkv", "head_dim", "block_size", "s2_tile", "g_tile", "max_blocks",
             "num_blocks", "seed")
_NULLABLE = ("g_tile", "max_blocks", "num_blocks", "garbage", "kv_act_seqs", "softmax_scale")
_KEYS = set(_INT_KEYS) | {"kv_act_seqs", "distribution", "garbage", "softmax_scale", "comment"}
_REQUIRED = ("batch", "s1", "s2", "nq", "nkv")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def _no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise UsageError(f"duplicate key {key!r} in the catalog")
        seen[key] = value
    return seen


def _check_value(name: str, key: str, value) -> None:
    where = f"case {name!r}, key {key!r}"
    if value is None:
        if key not in _NULLABLE:
            raise UsageError(f"{where}: null is not allowed here")
        return
    if key in _INT_KEYS:
        if not isinstance(value, int) or isinstance(value, bool):
            raise UsageError(f"{where}: {value!r} must be an integer")
        if value < (0 if key == "seed" else 1):
            raise UsageError(f"{where}: {value!r} must be >= {0 if key == 'seed' else 1}")
    elif key == "kv_act_seqs":
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                   for v in value):
            raise UsageError(f"{where}: {value!r} must be a list of integers >= 0")
    elif key in ("distribution", "garbage", "comment"):
        if not isinstance(value, str):
            raise UsageError(f"{where}: {value!r} must be a string")
    elif key == "softmax_scale":
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            raise UsageError(f"{where}: {value!r} must be a positive number")


def entry_config(name: str, entry: dict, defaults: dict):
    """(golden.PagedAttentionConfig, seed) of one catalog entry laid over ``defaults``."""
    import golden
    if not isinstance(entry, dict):
        raise UsageError(f"case {name!r}: entry must be an object, got {type(entry).__name__}")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise UsageError(f"case {name!r}: unknown key(s) {unknown}; expected some of {sorted(_KEYS)}")
    missing = [k for k in _REQUIRED if k not in entry and k not in defaults]
    if missing:
        raise UsageError(f"case {name!r}: missing key(s) {missing}")
    merged = {**defaults, **entry}
    merged.pop("comment", None)
    for key, value in merged.items():
        _check_value(name, key, value)
    seed = merged.pop("seed", 0)
    try:
        config = golden.PagedAttentionConfig.from_dict(merged)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"case {name!r}: {exc}") from None
    return config, seed


def parse_catalog(text: str) -> dict:
    """Cases by name from the catalog's JSON text (see the module docstring for what is rejected)."""
    from properties.case import Case
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise UsageError(f"catalog is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError("catalog must be a JSON object")
    unknown = sorted(set(data) - set(_SECTIONS))
    if unknown:
        raise UsageError(f"unknown catalog section(s) {unknown}; expected {list(_SECTIONS)}")
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise UsageError("'defaults' must be an object")
    bad = sorted(set(defaults) - _KEYS)
    if bad:
        raise UsageError(f"defaults: unknown key(s) {bad}")
    for key, value in defaults.items():
        _check_value("defaults", key, value)
    out: dict = {}
    for section in ("upstream", "edge"):
        entries = data.get(section, {})
        if not isinstance(entries, dict):
            raise UsageError(f"section {section!r} must be an object")
        for name, entry in entries.items():
            if not _NAME.match(name):
                raise UsageError(f"case name {name!r} must be lower-case letters, digits and underscores")
            if name in out:
                raise UsageError(f"case {name!r} appears in more than one section")
            config, seed = entry_config(name, entry, defaults)
            out[name] = Case(config, seed, name)
    return out


def load_catalog(path=None) -> dict:
    """Cases by name from cases/catalog.json (or ``path``): upstream first, then edge cases."""
    return parse_catalog(Path(path or CATALOG_PATH).read_text())

"""Records as an older writer made them, for the tests that read old formats (test_capture_files.py,
test_case_identity.py)."""
from __future__ import annotations

import json

from pfa_verify.cases.data import capture_identity


def as_old_record(folder, data: dict, fmt: int) -> str:
    """Rewrite the saved capture ``data`` as a record of format ``fmt`` (1 or 2: no sha256, ``<id>.npz``;
    3: ``<id>-<sha12>.npz`` with its sha256 and arrays) under that format's id, as an older writer made it;
    its new id."""
    old_id = capture_identity.content_id(data, fmt)
    kept = {} if fmt == 3 else {"tensors_sha256": None, "arrays": None}
    name = capture_identity.tensors_name(fmt, old_id, data["tensors_sha256"] if fmt == 3 else None)
    (folder / data["tensors"]).rename(folder / name)
    (folder / f"{data['id']}.json").unlink()
    data = dict(data, format=fmt, id=old_id, tensors=name, **kept)
    data.pop("nondeterministic")
    (folder / f"{old_id}.json").write_text(json.dumps(data))
    return old_id

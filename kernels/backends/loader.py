"""The one loader of Python code named by the user or written by the suite: a file (a backend's
``path/file.py:factory``, a PyPTO-Gym kernel file, a kernel mutant's copy in the cache) or an
importable module (``package.module:factory``, ``pypto-gym:package.module``).

Rules, the same for every caller:
- a file is resolved first and loaded once per resolved path and content (a module name derived from
  both; a file edited since gives a new module);
- a module whose code raises while it is imported is removed from ``sys.modules`` again (Python's
  own import does that for modules; ``exec_module`` on a file does not), so a second load runs it
  again and fails the same way instead of finding a half-executed module;
- every failure is one golden.errors.UsageError (a ValueError) naming the file or module and the
  error, on one line: what the command line prints (exit 2), never a traceback;
- a file imports the modules beside it (``import helper`` for a helper.py in its folder) from whatever
  folder the command runs in: its folder is put first on ``sys.path``, as ``python file.py`` does;
- a file's bytes may be *pinned* (:func:`pin_source`): the supervisor reads a backend's file, hashes
  it for the report and hands its worker those bytes, so that what runs is what was hashed, whatever
  happens to the file meanwhile. :func:`locate_module` finds a module's file without running any code.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from types import CodeType, ModuleType

from pfa_verify.golden.errors import UsageError

__all__ = ["load_file_module", "import_named_module", "pin_source", "locate_module"]

#: Resolved path -> the bytes to execute for it (:func:`pin_source`).
_PINNED: dict[str, bytes] = {}


def pin_source(path: str | Path, source: bytes) -> None:
    """Make :func:`load_file_module` execute ``source`` for the file at ``path`` (resolved), not what
    the file holds when it is loaded."""
    _PINNED[str(Path(path).resolve())] = bytes(source)


def locate_module(name: str, search: Sequence[str] | None = None) -> Path | None:
    """The file of module ``name`` (dotted) as an import would find it along ``search`` (default: the
    working directory, then sys.path), found without executing any package's code; None when there is
    none (not found, a namespace package, a built-in)."""
    path: list[str] | None = list(search) if search is not None else [os.getcwd(), *sys.path]
    spec = None
    parts = name.split(".")
    for k in range(len(parts)):
        if path is None:
            return None
        try:
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:k + 1]), path)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        path = list(spec.submodule_search_locations) if spec.submodule_search_locations is not None else None
    if spec is None or not spec.has_location or not spec.origin:
        return None
    origin = Path(spec.origin)
    return origin if origin.is_file() else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class _HashedSourceLoader(importlib.machinery.SourceFileLoader):
    """A file's loader that executes the bytes it was given (those whose sha256 names the module), never
    a bytecode cache: the cache's stamp (mtime in seconds and size) survives an edit within the same
    second, and the old code would run under the new content's name."""

    def __init__(self, fullname: str, path: str, source: bytes) -> None:
        super().__init__(fullname, path)
        self._source = source

    def get_code(self, fullname: str) -> CodeType:
        return compile(self._source, self.path, "exec", dont_inherit=True)


def load_file_module(path: str | Path, *, prefix: str = "_pfa_file_") -> ModuleType:
    """The module of the Python file at ``path``, executed once per resolved path and content.

    golden.errors.UsageError (a ValueError) when there is no such file or when executing it raises (the
    exception's type and first line quoted; the failed module is not kept in ``sys.modules``)."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"{str(path)!r}: no such file")
    file = file.resolve()
    source = _PINNED.get(str(file)) or file.read_bytes()
    name = prefix + re.sub(r"\W", "_", str(file)) + "_" + hashlib.sha256(source).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    loader = _HashedSourceLoader(name, str(file), source)
    spec = importlib.util.spec_from_file_location(name, file, loader=loader)
    assert spec is not None            # None only when no loader is given and none fits the suffix
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module         # as Python's import does: the module may import itself
    # As a script's folder: first, and kept, so that an import inside one of its functions finds it too.
    if str(file.parent) not in sys.path:
        sys.path.insert(0, str(file.parent))
    try:
        loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(name, None)
        if not isinstance(exc, Exception):
            raise
        raise UsageError(f"{str(path)!r} failed to import: {_first_line(exc)}") from None
    return module


def import_named_module(name: str) -> ModuleType:
    """``importlib.import_module(name)``; ValueError naming the module when it cannot be found or its
    code raises while it is imported (Python removes such a module from ``sys.modules`` itself)."""
    try:
        return importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any error of the module's own code, not only ImportError
        raise UsageError(f"cannot import module {name!r}: {_first_line(exc)}") from None

"""The files of a captured case, written so that they survive and read as the untrusted data they are.

A capture is ``<id>.json`` (the record) and, when its tensors are stored, an .npz named by its content,
``<id>-<first 12 hex digits of its sha256>.npz``, which the record names and whose sha256 it carries
(cases/data/regressions.py decides what they hold; this module how they reach the disk and come back).

Writing (:func:`locked_folder`, :func:`write_durably`): every file goes through a unique temporary name in
the same folder (``.<name>.<12 random hex digits>.tmp``, created exclusively: hidden, and neither ``*.json`` nor ``*.npz``, so no reader
mistakes it for a capture), is fsynced, then moved into place with ``os.replace``: the .npz first, the
record last. A record therefore only ever names an .npz that is complete on disk; a re-capture writes
its .npz under its own content name beside the old one, renames the new record over the old (the one
instant the capture changes, atomically) and only then removes the old .npz. The content name is why a
crash at any step leaves the old capture or the new one, never a record beside the wrong tensors, as an
in-place ``<id>.npz`` would. One capture at a time holds an exclusive ``flock`` on the folder itself (no
lock file is left behind): two processes re-capturing one id, or ``cases prune`` sweeping leftovers,
never remove an .npz that the other's record is about to name; a record rewritten alone (:func:`rewrite`:
the ``nondeterministic`` mark) goes the same way, under the lock. Where ``fcntl`` is missing (Windows)
there is no lock, and the temporary names alone keep concurrent captures of different ids apart.

Reading (:func:`read_regular`, :func:`parse_json`): a file is read only when it is a regular file (not
a symlink, FIFO, device or folder), under a size limit checked before it is opened and again while it
is read, and a JSON text only when its nesting is shallower than :data:`MAX_JSON_DEPTH`, checked before
``json.loads`` recurses. Each refusal is a :class:`golden.errors.UsageError` of one line naming the file.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np

from pfa_verify.golden.errors import UsageError

__all__ = ["CaptureWriteError", "MAX_JSON_DEPTH", "STALE_TEMPORARY_SECONDS", "LOCK_TIMEOUT_SECONDS",
           "TEMPORARY_SUFFIX", "Leftover", "locked_folder", "write_durably", "fsync_folder", "read_regular",
           "parse_json", "is_plain_name", "pointer", "commit", "rewrite", "discard", "leftovers", "sweep"]

#: Deeper than any record (the block table sits 5 levels down): deeper is not a record, and is refused
#: before ``json.loads`` recurses into it.
MAX_JSON_DEPTH = 64
#: A temporary file older than this (by its mtime) belongs to no running writer: a capture writes its
#: files in well under a second, and holds the folder's lock while it does.
STALE_TEMPORARY_SECONDS = 3600
#: How long a capture waits for another capture (or a prune) holding the folder.
LOCK_TIMEOUT_SECONDS = 30.0
TEMPORARY_SUFFIX = ".tmp"


class CaptureWriteError(OSError):
    """A capture that could not be written (a full disk, a read-only or unwritable folder, a folder that
    is a file, a folder another capture held too long). Nothing of it is left behind, and an earlier
    capture of the same id is intact. ``str()`` is one line naming the path and the OS error; ``errno``
    and ``filename`` are the OS error's."""

    def __init__(self, path: Path | str, cause: BaseException | str):
        code = getattr(cause, "errno", None)
        reason = os.strerror(code) + f" ({errno.errorcode.get(code, code)})" if code else str(cause)
        super().__init__(code, reason, str(path))

    def __str__(self) -> str:
        return f"cannot write the captured case {self.filename}: {self.strerror}"


@dataclasses.dataclass(frozen=True)
class Leftover:
    """A file in a regressions folder that is no part of any capture: ``name`` and ``why`` in words."""
    name: str
    why: str


_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def is_plain_name(name: str) -> bool:
    """A name of a file directly in the folder: no separator, not hidden, not ``.``/``..``."""
    return bool(name) and not name.startswith(".") and "/" not in name and "\\" not in name and "\0" not in name


def read_regular(path: Path, limit: int, *, missing: str | None = None) -> bytes:
    """The bytes of ``path`` when it is a regular file of at most ``limit`` bytes; a UsageError naming
    it otherwise (``missing``, when given, is the whole message for a file that does not exist). The
    file is opened without following a link and without blocking, checked again once open and read no
    further than ``limit``, so a FIFO, a link or a growing file swapped in after the first look is
    refused too."""
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        raise UsageError(missing or f"{path.name}: no such file") from None
    except OSError as exc:
        raise UsageError(f"{path.name}: cannot read it ({exc.strerror})") from None
    if not stat.S_ISREG(before.st_mode):
        raise UsageError(f"{path.name}: {_kind(before.st_mode)}, not a regular file")
    if before.st_size > limit:
        raise UsageError(f"{path.name}: {before.st_size} bytes, over the limit of {limit} for this file")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise UsageError(f"{path.name}: cannot open it ({exc.strerror})") from None
    try:
        now = os.fstat(fd)     # another inode is fine (a capture renamed over it), another kind is not
        if not stat.S_ISREG(now.st_mode):
            raise UsageError(f"{path.name}: {_kind(now.st_mode)}, not a regular file")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise UsageError(f"{path.name}: cannot read it ({exc.strerror})") from None
    finally:
        os.close(fd)
    if size > limit:
        raise UsageError(f"{path.name}: grew past the limit of {limit} bytes while it was read")
    return b"".join(chunks)


# A JSON string token (escapes included): removed before counting brackets, so that brackets inside
# strings do not count. On a valid prefix this is the tokenization json.loads makes.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def json_depth(text: str) -> int:
    """How deep ``text``'s arrays and objects nest, counted without recursion (numpy over the bytes)."""
    codes = np.frombuffer(_JSON_STRING.sub("", text).encode("utf-8", "surrogatepass"), dtype=np.uint8)
    step = np.isin(codes, (ord("["), ord("{"))).astype(np.int64) - np.isin(codes, (ord("]"), ord("}")))
    return int(np.cumsum(step).max(initial=0))


def parse_json(blob: bytes, name: str, *, max_depth: int = MAX_JSON_DEPTH):
    """``json.loads`` of a UTF-8 file's bytes, refused (UsageError naming ``name``) when it is not UTF-8,
    nests deeper than ``max_depth`` (before parsing), or is not JSON."""
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{name}: not valid JSON (not UTF-8 text: {exc.reason} at byte {exc.start})") from None
    depth = json_depth(text)
    if depth > max_depth:
        raise UsageError(f"{name}: nested {depth} levels deep, over the limit of {max_depth}: not a case file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{name}: not valid JSON ({exc})") from None
    except RecursionError:     # cannot happen under the depth check; if it does, a refusal all the same
        raise UsageError(f"{name}: nested too deep to parse: not a case file") from None


def pointer(record: Path, limit: int) -> tuple[bool, str | None]:
    """``(readable, name)``: whether a record reads as :func:`read_regular` and :func:`parse_json` read
    (nothing more is checked), and the .npz its ``tensors`` names (None: none, or not a plain name)."""
    return _pointer_of(record, _bytes_or_none(record, limit))


def _bytes_or_none(record: Path, limit: int) -> bytes | None:
    try:
        return read_regular(record, limit)
    except UsageError:
        return None


def _pointer_of(record: Path, blob: bytes | None) -> tuple[bool, str | None]:
    try:
        data = parse_json(blob, record.name) if blob is not None else None
    except UsageError:
        return False, None
    name = data.get("tensors") if isinstance(data, dict) else None
    return isinstance(data, dict), name if isinstance(name, str) and is_plain_name(name) else None


@contextlib.contextmanager
def locked_folder(folder: Path, *, create: bool = False, timeout: float = LOCK_TIMEOUT_SECONDS):
    """Hold ``folder`` exclusively (an ``flock`` on the folder itself) and yield its descriptor, for
    :func:`fsync_folder`. ``create`` makes the folder first. OSError as the OS raises it; waiting past
    ``timeout`` for another holder is a :class:`CaptureWriteError`."""
    if create:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except FileExistsError:      # a file where the folder should be: say what is wrong with it
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder)) from None
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        locking: ModuleType | None        # fcntl, where there is one
        try:
            import fcntl  # noqa: PLC0415 - POSIX only; the except below is the other platforms
            locking = fcntl
        except ImportError:      # Windows: no flock; unique temporary names still keep captures apart
            locking = None
        deadline = time.monotonic() + timeout
        while locking is not None:
            try:
                locking.flock(fd, locking.LOCK_EX | locking.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CaptureWriteError(folder, f"another capture or prune held the folder for over "
                                                    f"{timeout:g} s") from None
                time.sleep(0.01)
        yield fd
    finally:
        os.close(fd)             # closing the descriptor releases the lock


def write_durably(folder: Path, name: str, data: bytes) -> None:
    """Write ``folder/name``: a new file of a unique random name in ``folder`` (``O_EXCL``), its bytes
    fsynced, then moved over ``name`` with ``os.replace`` (atomic on POSIX). On any failure, an
    interrupt included, the temporary file is removed and ``name`` is untouched."""
    # Named before it exists (not tempfile.mkstemp), so that an interrupt landing anywhere, even as the
    # file is created, still knows what to remove.
    temporary = folder / f".{name}.{secrets.token_hex(6)}{TEMPORARY_SUFFIX}"
    try:
        # 0o666 less the user's umask, as any file the user writes (the OS applies the umask)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, folder / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def fsync_folder(fd: int) -> None:
    """Make the folder's renames durable (its entries flushed), where the filesystem can."""
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise


def commit(folder: Path, record: str, text: bytes | Callable[[bytes | None], bytes], npz: str | None,
           blob: bytes | None, *, record_limit: int) -> None:
    """Write one capture: the .npz ``npz`` (``blob``, when given) then the record ``record`` (``text``, or
    ``text(the record it replaces, None if none reads)``: what a re-capture keeps of it is decided under
    the lock), under the folder's lock (made if missing); then remove the .npz the replaced record named,
    if another. On any failure, the .npz written here is removed unless a record on disk names it, and the
    exception propagates (OSError as the OS raised it; an interrupt as it came)."""
    with locked_folder(folder, create=True) as fd:
        replaced = _bytes_or_none(folder / record, record_limit)
        _, old = _pointer_of(folder / record, replaced)
        try:
            if blob is not None:
                assert npz is not None     # the caller names the .npz of the bytes it gives
                write_durably(folder, npz, blob)
                fsync_folder(fd)       # the .npz is on disk before a record names it
            write_durably(folder, record, text(replaced) if callable(text) else text)
        except BaseException:
            # Ours and named by no record: never left behind. The record on disk decides (an interrupt
            # can land after its rename, and the capture is then made).
            if npz is not None and npz != old and pointer(folder / record, record_limit)[1] != npz:
                with contextlib.suppress(OSError):
                    os.unlink(folder / npz)
            raise
        with contextlib.suppress(OSError):         # committed: the rest is housekeeping
            fsync_folder(fd)
            if old is not None and old != npz:
                os.unlink(folder / old)            # should this fail, it is an orphan that prune removes


def rewrite(folder: Path, record: str, update: Callable[[bytes], bytes | None], *, record_limit: int) -> bool:
    """Rewrite the record ``record`` alone (its .npz untouched), durably, under the folder's lock:
    ``update(its bytes)`` gives the new bytes, or None to leave it as it is. False when nothing was
    written (no record reads, or ``update`` said None); OSError as the OS raised it."""
    with locked_folder(folder) as fd:
        current = _bytes_or_none(folder / record, record_limit)
        new = update(current) if current is not None else None
        if new is None:
            return False
        write_durably(folder, record, new)
        fsync_folder(fd)
    return True


def discard(folder: Path, record: str, *, record_limit: int) -> list[str]:
    """Remove a capture under the folder's lock: the record first (no instant when a record names a
    missing .npz), then its .npz; the names removed."""
    with locked_folder(folder) as fd:
        _, npz = pointer(folder / record, record_limit)
        gone = []
        for name in (record, npz):
            if name is not None and os.path.lexists(folder / name):
                os.unlink(folder / name)
                gone.append(name)
        fsync_folder(fd)
    return gone


def sweep(folder: Path, record_limit: int, *, dry_run: bool = False,
          min_age: float = STALE_TEMPORARY_SECONDS) -> tuple[list[Leftover], list[Leftover]]:
    """Remove :func:`leftovers` (none when ``dry_run``) under the folder's lock, so that no capture
    writes meanwhile; ``(removed or to remove, kept)``."""
    if not folder.is_dir():
        return [], []
    with locked_folder(folder):
        remove, kept = leftovers(folder, record_limit, min_age=min_age)
        if not dry_run:
            for item in remove:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(folder / item.name)
    return remove, kept


def leftovers(folder: Path, record_limit: int, *, min_age: float = STALE_TEMPORARY_SECONDS,
              now: float | None = None) -> tuple[list[Leftover], list[Leftover]]:
    """``(to remove, kept)``: the files in ``folder`` that are no part of a capture. To remove: temporary
    files (``*.tmp``, this writer's and older writers' ``<id>.json.tmp``) older than ``min_age`` seconds,
    and .npz files no record names. Kept, and said: a younger temporary file (a writer may be running),
    and the .npz files of a record that cannot be read (``<id>.npz``, ``<id>-*.npz``: they may be its
    evidence). Only regular files are ever listed; call under :func:`locked_folder`."""
    if not folder.is_dir():
        return [], []
    now = time.time() if now is None else now
    entries = {e.name: e for e in os.scandir(folder)}
    named, unreadable = set(), []
    for name in entries:
        if name.endswith(".json") and is_plain_name(name):
            readable, target = pointer(folder / name, record_limit)
            named.add(target)
            if not readable:
                unreadable.append(name.removesuffix(".json"))
    remove, kept = [], []
    for name, entry in sorted(entries.items()):
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        if name.endswith(TEMPORARY_SUFFIX):
            age = now - info.st_mtime
            if age >= min_age:
                remove.append(Leftover(name, f"a temporary file {_age(age)} old: its writer is gone"))
            else:
                kept.append(Leftover(name, f"a temporary file {_age(age)} old: a capture may be writing it"))
        elif name.endswith(".npz") and name not in named:
            owner = next((rid for rid in unreadable if name == f"{rid}.npz" or name.startswith(f"{rid}-")), None)
            if owner is not None:
                kept.append(Leftover(name, f"may belong to {owner}.json, which cannot be read"))
            else:
                remove.append(Leftover(name, "an .npz no case file names"))
    return remove, kept


def _age(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 \
        else f"{seconds / 3600:.1f} h"

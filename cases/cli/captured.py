"""``pfa-verify cases list | show | replay | prune``: the captured regressions (cases/data/regressions.py)
from the command line. cases/cli/__init__.py adds this subcommand with :func:`add_arguments`; the exit status
follows its rule (0 passed, 1 a replayed case still fails, 2 could not run).
"""
from __future__ import annotations

import argparse
import json

from cases.cli import preflight
from cases.cli.arguments import byte_count

__all__ = ["add_arguments"]


def _cmd_list(args) -> int:
    preflight.check_command(args)
    from cases.data import regressions
    from golden.errors import UsageError
    ids = regressions.list_ids(directory=args.dir)
    if not ids:
        print(f"no captured regressions in {regressions.directory(args.dir)}")
    for rid in ids:
        try:
            print(regressions.load(rid, directory=args.dir).summary())
        except UsageError as exc:   # damaged, half-written by an older writer, or not a case file at all
            print(f"{rid}  unreadable: {exc}")
    stale, young = regressions.leftovers(args.dir)
    for item in stale:
        print(f"leftover {item.name}: {item.why} (`pfa-verify cases prune` removes it)")
    for item in young:
        print(f"leftover {item.name}: {item.why}")
    return 0


def _cmd_show(args) -> int:
    preflight.check_command(args)
    from cases.data import regressions
    reg = regressions.load(args.id, directory=args.dir)
    data = reg.to_json()
    message = data.pop("message")
    print(json.dumps(data, indent=2))
    if reg.tensors:
        checked = ("its sha256 matches the record" if reg.tensors_sha256 else
                   "an older record without a sha256")
        print(f"\ntensors: {reg.tensors} ({checked}; names, dtypes and shapes are those the config implies)")
    print("\nmessage:\n" + message)
    return 0


def _cmd_replay(args) -> int:
    preflight.check_command(args)
    from cases.data import regressions
    from kernels import BackendUnavailable, get_backend
    from kernels.backends import use_backend_threads
    reg = regressions.load(args.id, directory=args.dir)
    name = args.backend or reg.backend
    backend = get_backend(name)
    use_backend_threads(backend)
    print(f"replaying {reg.id}: law {reg.law} on backend {name} (captured on {reg.backend})")
    if name != reg.backend:
        print(f"note: this checks {name}, not {reg.backend}, on the captured case")
    if reg.case.get("kind") == "paged":           # the coverage of a replay is the replayed case's
        from properties.coverage import BINS, classify
        hit = classify(reg.to_case().config)
        singles = [b.name for b in BINS if b.name in hit]
        print(f"covers {len(singles)} bins and {len(hit) - len(singles)} crosses (properties/coverage.py): "
              + ", ".join(sorted(hit)))
    try:
        regressions.replay(reg, backend, directory=args.dir)
    except AssertionError as exc:
        print(f"FAIL\n{exc}")
        return 1
    except BackendUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - the backend crashed on the case: an error, reported as one
        print(f"ERROR: the {name} backend raised on this case: {type(exc).__name__}: {exc}")
        return 1
    print("PASS: the captured failure no longer reproduces")
    return 0


def _cmd_prune(args) -> int:
    preflight.check_command(args)
    from properties import ledger
    from cases.data import regressions
    from golden.errors import UsageError
    from kernels import BackendUnavailable, get_backend
    from kernels.backends import use_backend_threads
    folder = regressions.directory(args.dir)
    removed = 0
    backends: dict = {}
    for rid in regressions.list_ids(directory=args.dir):
        try:
            reg = regressions.load(rid, directory=args.dir)
        except UsageError as exc:
            print(f"kept {rid}: unreadable ({exc})")
            continue
        if args.backend and args.backend != reg.backend:
            # A case passes or fails on the backend it was captured on; another backend's pass says
            # nothing about it (a sim failure passes on the golden).
            print(f"kept {rid}: captured on {reg.backend}, not {args.backend}")
            continue
        config = reg.to_case().config if reg.case.get("kind") == "paged" else None
        if ledger.lookup(rid, reg.backend, config=config):
            print(f"kept {rid}: in the ledger")
            continue
        try:
            backend = backends.get(reg.backend) or backends.setdefault(reg.backend, get_backend(reg.backend))
            use_backend_threads(backend)
        except BackendUnavailable as exc:
            print(f"kept {rid}: backend {reg.backend} cannot run here ({exc.reason})")
            continue
        try:
            regressions.replay(reg, backend)
        except AssertionError:
            continue
        except Exception as exc:  # noqa: BLE001 - a case the backend crashes on is kept, and said so
            print(f"kept {rid}: the {reg.backend} backend raised ({type(exc).__name__}: {exc})")
            continue
        if not args.dry_run:
            _changing(folder, regressions.remove, rid, directory=args.dir)
        print(f"{'would remove' if args.dry_run else 'removed'} {rid} (passes on {reg.backend})")
        removed += 1
    stale, young = _changing(folder, regressions.remove_leftovers, args.dir, dry_run=args.dry_run)
    for item in stale:
        print(f"{'would remove' if args.dry_run else 'removed'} leftover {item.name} ({item.why})")
    for item in young:
        print(f"kept {item.name} ({item.why})")
    print(f"{removed} passing case(s) and {len(stale)} leftover file(s) {'to remove' if args.dry_run else 'removed'} "
          f"in {folder}")
    return 0


def _changing(folder, action, *args, **kwargs):
    """``action`` on the folder's files: one the OS refuses (a read-only folder) is one line and exit 2."""
    from golden.errors import UsageError
    try:
        return action(*args, **kwargs)
    except OSError as exc:
        raise UsageError(f"cases prune: cannot remove files in {folder}: {exc.strerror or exc}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``cases`` subcommand's options and its four actions (set as each action's ``func``)."""
    parser.add_argument("--dir", default=None, help="regressions folder (default: cases/regressions, "
                                                    "or $PFA_VERIFY_REGRESSIONS)")
    parser.add_argument("--max-bytes", type=byte_count, default=None, metavar="BYTES",
                        help="largest case to load (default: $PFA_VERIFY_MAX_BYTES, else half the machine's memory)")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="one line per captured case").set_defaults(func=_cmd_list)
    show = sub.add_parser("show", help="the record of one captured case")
    show.add_argument("id")
    show.set_defaults(func=_cmd_show)
    replay = sub.add_parser("replay", help="run a captured case again under its rule (exit 1 if it fails)")
    replay.add_argument("id")
    replay.add_argument("--backend", default=None, help="backend to replay on (default: the captured one)")
    replay.set_defaults(func=_cmd_replay)
    prune = sub.add_parser("prune", help="delete captured cases that pass now on the backend they were captured "
                                         "on (ledger entries are kept), and leftovers: temporary files older than "
                                         "an hour and .npz files no case names")
    prune.add_argument("--backend", default=None, help="only cases captured on this backend")
    prune.add_argument("--dry-run", action="store_true")
    prune.set_defaults(func=_cmd_prune)

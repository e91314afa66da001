"""``pfa-verify cases list | show | replay | prune``: the captured regressions (cases/data/regressions.py)
from the command line. cases/cli/__init__.py adds this subcommand with :func:`add_arguments`; the exit status
follows its rule (0 passed, 1 a replayed case still fails or `list` found an unreadable case file,
2 could not run).
"""
from __future__ import annotations

import argparse
import json

from cases.cli import preflight
from cases.cli.arguments import byte_count, count
from cases.data import regressions
from cases.running.run import open_backend
from golden.errors import UsageError
from kernels import BackendUnavailable
from kernels.backends.supervisor import KernelFault, describe_failure
from properties import ledger
from properties.coverage import BINS, classify

__all__ = ["add_arguments"]


def _cmd_list(args) -> int:
    preflight.check_command(args)
    ids = regressions.list_ids(directory=args.dir)
    if not ids:
        print(f"no captured regressions in {regressions.directory(args.dir)}")
    unreadable = 0
    for rid in ids:
        try:
            print(regressions.load(rid, directory=args.dir).summary())
        except UsageError as exc:   # damaged, half-written by an older writer, or not a case file at all
            unreadable += 1
            print(f"{rid}  unreadable: {exc}")
    stale, young = regressions.leftovers(args.dir)
    for item in stale:
        print(f"leftover {item.name}: {item.why} (`pfa-verify cases prune` removes it)")
    for item in young:
        print(f"leftover {item.name}: {item.why}")
    if unreadable:
        # Damaged evidence is a finding, not a listing detail: a script that checks the folder must see it.
        print(f"{unreadable} of {len(ids)} case files unreadable")
        return 1
    return 0


def _cmd_show(args) -> int:
    preflight.check_command(args)
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
    reg = regressions.load(args.id, directory=args.dir)
    name = args.backend or reg.backend
    # The kernel runs under a supervisor (kernels/backends/supervisor.py): whatever it does, this process decides.
    backend, supervisor, _, _ = open_backend(name, in_process=args.in_process, case_timeout=args.case_timeout or None)
    try:
        return _replayed(args, reg, name, backend)
    finally:
        if supervisor is not None:
            supervisor.close()


def _replayed(args, reg, name: str, backend) -> int:
    print(f"replaying {reg.id}: law {reg.law} on backend {name} (captured on {reg.backend})")
    if name != reg.backend:
        print(f"note: this checks {name}, not {reg.backend}, on the captured case")
    if reg.case.get("kind") == "paged":           # the coverage of a replay is the replayed case's
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
    except KernelFault as exc:        # the kernel's worker process ended or timed out: never a pass
        print(f"ERROR: the {name} backend did not return on this case: {exc}")
        return 1
    except Exception as exc:  # noqa: BLE001 - the backend crashed on the case: an error, reported as one
        print(f"ERROR: the {name} backend raised on this case: {describe_failure(exc)}")
        return 1
    if args.interruption.signal:      # a KeyboardInterrupt lost in a garbage-collection callback
        return args.interruption.exit_status
    print("PASS: the captured failure no longer reproduces")
    return 0


def _cmd_prune(args) -> int:
    preflight.check_command(args)
    folder = regressions.directory(args.dir)
    backends: dict = {}
    try:
        return _pruned(args, folder, backends)
    finally:
        for _, supervisor in backends.values():
            if supervisor is not None:
                supervisor.close()


def _pruned(args, folder, backends: dict) -> int:
    removed = 0
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
            if reg.backend not in backends:      # supervised: a case the kernel exits on is kept, not removed
                opened = open_backend(reg.backend)
                backends[reg.backend] = (opened[0], opened[1])
            backend = backends[reg.backend][0]
        except BackendUnavailable as exc:
            print(f"kept {rid}: backend {reg.backend} cannot run here ({exc.reason})")
            continue
        try:
            regressions.replay(reg, backend)
        except AssertionError:
            continue
        except Exception as exc:  # noqa: BLE001 - a case the backend crashes on is kept, and said so
            print(f"kept {rid}: the {reg.backend} backend raised ({describe_failure(exc)})")
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
    listed = sub.add_parser("list", help="one line per captured case")
    listed.set_defaults(func=_cmd_list)
    show = sub.add_parser("show", help="the record of one captured case")
    show.add_argument("id")
    show.set_defaults(func=_cmd_show)
    replay = sub.add_parser("replay", help="run a captured case again under its rule (exit 1 if it fails)")
    replay.add_argument("id")
    replay.add_argument("--backend", default=None, help="backend to replay on (default: the captured one)")
    replay.add_argument("--case-timeout", type=count(at_most=86_400), default=None, metavar="SECONDS",
                        help="end the replay when a kernel call has not returned after SECONDS (its worker process is "
                             "killed; an error, exit 1; default: no limit)")
    replay.add_argument("--in-process", action="store_true",
                        help="run the kernel in this process, not in a supervised worker process (for a debugger)")
    replay.set_defaults(func=_cmd_replay)
    prune = sub.add_parser("prune", help="delete captured cases that pass now on the backend they were captured "
                                         "on (ledger entries are kept), and leftovers: temporary files older than "
                                         "an hour and .npz files no case names")
    prune.add_argument("--backend", default=None, help="only cases captured on this backend")
    prune.add_argument("--dry-run", action="store_true")
    prune.set_defaults(func=_cmd_prune)
    for action in (listed, show, replay, prune):    # --dir before or after the action: the same folder
        action.add_argument("--dir", default=argparse.SUPPRESS, help="regressions folder (as before the action)")

"""``pfa-verify cases list | show | replay | prune``: the captured regressions (cases/data/regressions.py)
from the command line. cases/cli/__init__.py adds this subcommand with :func:`add_arguments`; the exit status
follows its rule (0 passed, 1 a replayed case still fails, errs or is nondeterministic, or `list` found an
unreadable case file, 2 could not run, a case file refused included).
"""
from __future__ import annotations

import argparse
import json

from pfa_verify.cases.cli import preflight
from pfa_verify.cases.cli.arguments import REGRESSIONS_HELP, byte_count, count
from pfa_verify.cases.data import capture_identity, regressions
from pfa_verify.cases.running.replays import replay_times
from pfa_verify.cases.running.run import open_backend
from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels import BackendUnavailable
from pfa_verify.kernels.backends.faults import KernelFault, describe_failure
from pfa_verify.kernels.backends.text import printable
from pfa_verify.properties.rule import ledger
from pfa_verify.properties.rule.coverage import BINS, classify

__all__ = ["add_arguments"]


def _cmd_list(args) -> int:
    preflight.check_command(args)
    folder = regressions.directory(args.regressions)
    ids = [] if regressions.is_shipped(folder) else regressions.list_ids(directory=args.regressions)
    shipped = regressions.shipped_ids()
    unreadable = 0
    # The shipped captures first, marked: every run replays them, and nothing here writes or prunes them.
    for rid, mark in [(r, True) for r in shipped] + [(r, False) for r in ids if r not in shipped]:
        try:
            print(printable(regressions.load(rid, directory=args.regressions).summary(shipped=mark), one_line=True))
        except UsageError as exc:   # damaged, half-written by an older writer, or not a case file at all
            unreadable += 1
            print(printable(f"{rid}  unreadable{' [shipped]' if mark else ''}: {exc}", one_line=True))
    if not ids:
        print(f"no captured regressions in {printable(folder, one_line=True)}"
              + (f" (the {len(shipped)} above are shipped with pfa-verify)" if shipped else ""))
    stale, young = ([], []) if regressions.is_shipped(folder) else regressions.leftovers(args.regressions)
    for item in stale:
        print(f"leftover {printable(item.name, one_line=True)}: {item.why} (`pfa-verify cases prune` removes it)")
    for item in young:
        print(f"leftover {printable(item.name, one_line=True)}: {item.why}")
    if unreadable:
        # Damaged evidence is a finding, not a listing detail: a script that checks the folder must see it.
        print(f"{unreadable} of {len(set(ids) | set(shipped))} case files unreadable")
        return 1
    return 0


def _cmd_show(args) -> int:
    preflight.check_command(args)
    reg = regressions.load(args.id, directory=args.regressions)
    data = reg.to_json()
    message = data.pop("message")
    print(json.dumps(data, indent=2))
    covered = ", ".join(capture_identity.COVERED[min(reg.format, 4)])
    print(f"\nid: {reg.id} is what its content hashes to (format {reg.format}: {covered})")
    if reg.tensors:
        checked = ("its sha256 matches the record" if reg.tensors_sha256 else
                   "an older record without a sha256")
        print(f"tensors: {reg.tensors} ({checked}; names, dtypes and shapes are those the config implies, "
              "kv_act_seqs and block_table those it states)")
    print("\nmessage:\n" + printable(message))
    return 0


def _cmd_replay(args) -> int:
    preflight.check_command(args)
    if args.times < 1:
        raise UsageError(f"--times {args.times} must be at least 1")
    reg = regressions.load(args.id, directory=args.regressions)
    name = args.backend or reg.backend
    # The kernel runs under a supervisor (kernels/backends/supervisor.py): whatever it does, this process decides.
    backend, supervisor, _, _ = open_backend(name, in_process=args.in_process, case_timeout=args.case_timeout or None)
    try:
        return _replayed(args, reg, name, backend)
    finally:
        if supervisor is not None:
            supervisor.close()


def _replayed(args, reg, name: str, backend) -> int:
    times = args.times
    print(f"replaying {reg.id}: law {reg.law} on backend {printable(name)} (captured on {printable(reg.backend)})"
          + (f", {times} times" if times > 1 else ""))
    if name != reg.backend:
        print(f"note: this checks {printable(name)}, not {printable(reg.backend)}, on the captured case")
    if reg.nondeterministic:
        print(f"note: {reg.id} is marked nondeterministic (seen {_seen(reg)}): a passing replay proves little")
    if reg.case.get("kind") == "paged":           # the coverage of a replay is the replayed case's
        hit = classify(reg.to_case().config)
        singles = [b.name for b in BINS if b.name in hit]
        print(f"covers {len(singles)} bins and {len(hit) - len(singles)} crosses (properties/rule/coverage.py): "
              + ", ".join(sorted(hit)))
    each = (lambda k, outcome: print(f"replay {k + 1} of {times}: {outcome.upper()}")) if times > 1 else None
    seen = replay_times(reg, backend, times, directory=args.regressions, stop=lambda: args.interruption.signal, each=each)
    if args.interruption.signal:      # a KeyboardInterrupt lost in a garbage-collection callback
        return args.interruption.exit_status
    if seen.error is not None:
        print(f"ERROR: the {printable(name)} backend {_error_words(seen.error)}")
    if seen.failure is not None:
        print(f"FAIL\n{printable(seen.failure)}")
    unsteady = seen.nondeterministic()
    if unsteady:
        # Both outcomes, or other bits for the same inputs: never a pass, and the capture is kept for good.
        said = (_marked(args.regressions, reg, f"cases replay --times {times}: {unsteady}") if name == reg.backend else
                f"not marked: replayed on {printable(name)}, captured on {printable(reg.backend)}")
        print(f"NONDETERMINISTIC: {unsteady} ({said})")
        return 1
    if seen.error is not None or seen.failure is not None:
        return 1
    print("PASS: the captured failure no longer reproduces" + (f" ({times} of {times} replays)" if times > 1 else ""))
    return 0


def _error_words(exc: BaseException) -> str:
    """What a replay's error was, after "the NAME backend": a call that never came back, or a raise."""
    if isinstance(exc, KernelFault):      # the kernel's worker process ended or timed out: never a pass
        return f"did not return on this case: {printable(exc)}"
    return f"raised on this case: {printable(describe_failure(exc))}"


def _seen(reg) -> str:
    return printable((reg.nondeterministic or {}).get("seen", ""), one_line=True)


def _marked(directory, reg, seen: str) -> str:
    """Mark ``reg`` nondeterministic (``seen``: how), durably; the words saying what was done."""
    try:
        done = regressions.mark_nondeterministic(reg.id, seen, directory=directory)
    except (UsageError, OSError) as exc:
        return f"could not mark {reg.id}: {printable(exc, one_line=True)}"
    return (f"marked {reg.id} nondeterministic: `cases prune` keeps it" if done else
            f"{reg.id} was marked nondeterministic already")


PRUNE_REPLAYS = regressions.PASSING_REPLAYS


def _cmd_prune(args) -> int:
    preflight.check_command(args)
    if args.replays < 1:
        raise UsageError(f"--replays {args.replays} must be at least 1")
    folder = regressions.directory(args.regressions)
    backends: dict = {}
    try:
        return _pruned(args, folder, backends)
    finally:
        for _, supervisor in backends.values():
            if supervisor is not None:
                supervisor.close()


def _pruned(args, folder, backends: dict) -> int:
    removed, verb = 0, "would remove" if args.dry_run else "removed"
    for rid in regressions.list_ids(directory=args.regressions):
        try:
            reg = regressions.load(rid, directory=args.regressions)
        except UsageError as exc:
            print(printable(f"kept {rid}: unreadable ({exc})", one_line=True))
            continue
        if args.backend and args.backend != reg.backend:
            # A case passes or fails on the backend it was captured on; another backend's pass says
            # nothing about it (a sim failure passes on the golden).
            print(f"kept {rid}: captured on {printable(reg.backend)}, not {printable(args.backend)}")
            continue
        if reg.nondeterministic:          # its kernel answered it both ways: no number of passes removes it
            print(f"kept {rid}: nondeterministic (seen {_seen(reg)})")
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
            print(f"kept {rid}: backend {printable(reg.backend)} cannot run here ({printable(exc.reason)})")
            continue
        seen = replay_times(reg, backend, args.replays, until_not_passing=True)
        unsteady = seen.nondeterministic()
        if unsteady:
            said = "not marked: --dry-run" if args.dry_run else _marked(args.regressions, reg, f"cases prune: {unsteady}")
            print(f"kept {rid}: nondeterministic (seen {unsteady}; {said})")
        elif seen.error is not None:      # a case the backend crashes on is kept, and said so
            print(f"kept {rid}: the {printable(reg.backend)} backend raised ({printable(describe_failure(seen.error))})")
        elif seen.failure is not None:
            print(f"kept {rid}: still fails on {printable(reg.backend)}")
        else:
            if not args.dry_run:
                _changing(folder, regressions.remove, rid, directory=args.regressions)
            print(f"{verb} {rid} (passes {args.replays} of {args.replays} replays on {printable(reg.backend)})")
            removed += 1
    stale, young = _changing(folder, regressions.remove_leftovers, args.regressions, dry_run=args.dry_run)
    for item in stale:
        print(f"{verb} leftover {printable(item.name, one_line=True)} ({item.why})")
    for item in young:
        print(f"kept {printable(item.name, one_line=True)} ({item.why})")
    print(f"{removed} passing case(s) and {len(stale)} leftover file(s) {'to remove' if args.dry_run else 'removed'} "
          f"in {printable(folder, one_line=True)}")
    return 0


def _changing(folder, action, *args, **kwargs):
    """``action`` on the folder's files: one the OS refuses (a read-only folder) is one line and exit 2."""
    try:
        return action(*args, **kwargs)
    except OSError as exc:
        raise UsageError(f"cases prune: cannot remove files in {folder}: {exc.strerror or exc}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``cases`` subcommand's options and its four actions (set as each action's ``func``)."""
    parser.add_argument("--regressions", metavar="DIR", default=None, help=REGRESSIONS_HELP)
    parser.add_argument("--max-bytes", type=byte_count, default=None, metavar="BYTES",
                        help="largest case to load (default: $PFA_VERIFY_MAX_BYTES, else half the machine's memory)")
    sub = parser.add_subparsers(dest="action", required=True)
    listed = sub.add_parser("list", help="one line per captured case: the shipped ones (marked), then yours")
    listed.set_defaults(func=_cmd_list)
    show = sub.add_parser("show", help="the record of one captured case")
    show.add_argument("id")
    show.set_defaults(func=_cmd_show)
    replay = sub.add_parser("replay", help="run a captured case again under its rule (exit 1 if it fails)")
    replay.add_argument("id")
    replay.add_argument("--backend", default=None, help="backend to replay on (default: the captured one)")
    replay.add_argument("--case-timeout", type=count(at_most=86_400), default=None, metavar="SECONDS",
                        help="one kernel call's time, as in run: a call that has not returned after SECONDS is ended "
                             "(its worker process is killed; an error, exit 1; default: no limit)")
    replay.add_argument("--in-process", action="store_true",
                        help="run the kernel in this process, not in a supervised worker process (for a debugger)")
    replay.add_argument("--times", type=count(at_most=10_000), default=1, metavar="N",
                        help="replay N times (default 1): a kernel that passes some and fails others, or answers the "
                             "same inputs with other bits, is NONDETERMINISTIC (exit 1, never a pass; the case file "
                             "is marked so and prune keeps it)")
    replay.set_defaults(func=_cmd_replay)
    prune = sub.add_parser("prune", help=f"delete captured cases of your folder (never a shipped one) that pass now "
                                         f"on the backend they were captured on, "
                                         f"{PRUNE_REPLAYS} replays out of {PRUNE_REPLAYS} by default (cases marked "
                                         "nondeterministic and ledger entries are kept), and leftovers: temporary "
                                         "files older than an hour and .npz files no case names")
    prune.add_argument("--backend", default=None, help="only cases captured on this backend")
    prune.add_argument("--replays", type=count(at_most=10_000), default=PRUNE_REPLAYS, metavar="N",
                       help=f"replays that must all pass before a case is removed (default {PRUNE_REPLAYS}: a failure "
                            "showing on a fraction p of calls survives N passes with probability (1-p)^N, 1/1024 for "
                            "p = 1/2 and 6%% for p = 1/4); a pass and a failure, or other output bits for the same "
                            "inputs, mark the case nondeterministic, and it is never removed")
    prune.add_argument("--dry-run", action="store_true")
    prune.set_defaults(func=_cmd_prune)
    for action in (listed, show, replay, prune):    # --regressions before or after the action: the same folder
        action.add_argument("--regressions", metavar="DIR", default=argparse.SUPPRESS,
                            help="your captures folder (as before the action)")

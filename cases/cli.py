"""``pfa-verify``: the command line. Subcommands live in a registry so others can add theirs.

    pfa-verify cases list                 captured regressions (id, law, backend, first message line)
    pfa-verify cases show ID              the whole record of one
    pfa-verify cases replay ID [--backend NAME]   run it again; exit 1 if it still fails
    pfa-verify cases prune [--backend NAME] [--dry-run]   delete captured cases that now pass

A module adds a top-level subcommand with::

    from cases.cli import register

    @register("run", help="...")
    def add_arguments(parser): ...        # then parser.set_defaults(func=callable(args) -> int)

and is imported from :data:`PLUGIN_MODULES` (missing modules are skipped).
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable

__all__ = ["register", "SUBCOMMANDS", "PLUGIN_MODULES", "build_parser", "main"]

SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {}
PLUGIN_MODULES = ("cases.run", "cases.report", "golden.bench", "kernels.cli")


def register(name: str, *, help: str = ""):  # noqa: A002 - argparse's word
    """Decorator: ``fn(parser)`` configures the ``pfa-verify <name>`` subparser."""
    def add(fn):
        SUBCOMMANDS[name] = (help, fn)
        return fn
    return add


def _load_plugins() -> None:
    for module in PLUGIN_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module and not module.startswith(f"{exc.name}."):
                raise


# --- pfa-verify cases ...  ------------------------------------------------------------------------

def _cmd_list(args) -> int:
    from cases import regressions
    ids = regressions.list_ids(directory=args.dir)
    if not ids:
        print(f"no captured regressions in {regressions.directory(args.dir)}")
        return 0
    for rid in ids:
        try:
            print(regressions.load(rid, directory=args.dir).summary())
        except ValueError as exc:
            print(f"{rid}  unreadable: {exc}")
    return 0


def _cmd_show(args) -> int:
    from cases import regressions
    reg = regressions.load(args.id, directory=args.dir)
    data = reg.to_json()
    message = data.pop("message")
    print(json.dumps(data, indent=2))
    print("\nmessage:\n" + message)
    return 0


def _cmd_replay(args) -> int:
    from cases import regressions
    from kernels import get_backend
    reg = regressions.load(args.id, directory=args.dir)
    name = args.backend or reg.backend
    backend = get_backend(name)
    print(f"replaying {reg.id}: law {reg.law} on backend {name} (captured on {reg.backend})")
    try:
        regressions.replay(reg, backend)
    except AssertionError as exc:
        print(f"FAIL\n{exc}")
        return 1
    print("PASS: the captured failure no longer reproduces")
    return 0


def _cmd_prune(args) -> int:
    from cases import ledger, regressions
    from kernels import get_backend
    folder = regressions.directory(args.dir)
    removed = 0
    for rid in regressions.list_ids(directory=args.dir):
        reg = regressions.load(rid, directory=args.dir)
        name = args.backend or reg.backend
        if ledger.lookup(rid, name):
            continue
        try:
            regressions.replay(reg, get_backend(name))
        except AssertionError:
            continue
        print(f"{'would remove' if args.dry_run else 'removed'} {rid} (passes on {name})")
        removed += 1
        if not args.dry_run:
            for suffix in (".json", ".npz"):
                (folder / f"{rid}{suffix}").unlink(missing_ok=True)
    known = set(regressions.list_ids(directory=args.dir))
    for npz in folder.glob("*.npz") if folder.is_dir() else ():
        if npz.stem not in known:
            print(f"{'would remove' if args.dry_run else 'removed'} orphan {npz.name}")
            if not args.dry_run:
                npz.unlink()
    print(f"{removed} passing case(s) {'to remove' if args.dry_run else 'removed'}")
    return 0


@register("cases", help="list, show, replay and prune captured regression cases")
def _add_cases(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", default=None, help="regressions folder (default: cases/regressions, "
                                                    "or $PFA_VERIFY_REGRESSIONS)")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="one line per captured case").set_defaults(func=_cmd_list)
    show = sub.add_parser("show", help="the record of one captured case")
    show.add_argument("id")
    show.set_defaults(func=_cmd_show)
    replay = sub.add_parser("replay", help="run a captured case again (exit 1 if it fails)")
    replay.add_argument("id")
    replay.add_argument("--backend", default=None, help="backend to replay on (default: the captured one)")
    replay.set_defaults(func=_cmd_replay)
    prune = sub.add_parser("prune", help="delete captured cases that pass now (ledger entries are kept)")
    prune.add_argument("--backend", default=None)
    prune.add_argument("--dry-run", action="store_true")
    prune.set_defaults(func=_cmd_prune)


def build_parser() -> argparse.ArgumentParser:
    _load_plugins()
    parser = argparse.ArgumentParser(prog="pfa-verify", description="Verify the FP8 paged-attention kernel "
                                     "against the golden (SPEC.md).")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_, add) in SUBCOMMANDS.items():
        add(sub.add_parser(name, help=help_))
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValueError as exc:
        print(f"pfa-verify: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

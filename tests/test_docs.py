"""The docs cannot rot silently (issue 28): every "SPEC §" of the project resolves in docs/spec.md, every
relative link of README.md and docs/ reaches its file and heading, every ``pfa-verify`` command and option
they name exists, and the README's recipe (docs/examples/my_backend.py) runs and prints what the README
shows. The checks are plain functions of a tree, so a planted broken reference is shown to be found.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import pytest

from pfa_verify.cases import cli

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("golden", "kernels", "properties", "cases", "tests")
_SPEC_REF = re.compile(r"SPEC ?§ ?(\d+(?:\.\d+)?)(?:-(\d+(?:\.\d+)?))?(?: item (\d+))?")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _docs(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _sources(root: Path) -> list[Path]:
    files = _docs(root)
    for package in PACKAGES:
        files += [p for p in sorted((root / package).rglob("*")) if p.suffix in (".py", ".j2", ".json", ".md")
                  and "regressions" not in p.parts and "__pycache__" not in p.parts]
    return files


def spec_sections(root: Path) -> set[str]:
    """The section numbers docs/spec.md defines: its '§N' and '§N.M' headings, and §2.k for the k-th item of
    §2's numbered list (the code cites the stages of §2 as '§2.3' and as '§2 item 3')."""
    text = (root / "docs" / "spec.md").read_text()
    sections = set(re.findall(r"^#{2,3} §(\d+(?:\.\d+)?) ", text, flags=re.M))
    part = text.split("\n## §2 ", 1)[1].split("\n## ", 1)[0]
    sections |= {f"2.{k}" for k in re.findall(r"^(\d+)\. ", part, flags=re.M)}
    return sections


def broken_spec_references(root: Path) -> list[str]:
    known = spec_sections(root)
    found = []
    for path in _sources(root):
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for first, last, item in _SPEC_REF.findall(line):
                for number in filter(None, (first, last, f"{first}.{item}" if item else "")):
                    if number not in known:
                        found.append(f"{path.relative_to(root)}:{n}: SPEC §{number}")
    return found


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def broken_links(root: Path) -> list[str]:
    found = []
    for path in _docs(root):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for target in _LINK.findall(line):
                if re.match(r"[a-z]+://", target):
                    continue
                file, _, anchor = target.partition("#")
                dest = (path.parent / file).resolve() if file else path
                if not dest.exists():
                    found.append(f"{path.relative_to(root)}:{n}: {target} (no such file)")
                elif anchor and dest.suffix == ".md":
                    anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), flags=re.M)}
                    if anchor not in anchors:
                        found.append(f"{path.relative_to(root)}:{n}: {target} (no such heading)")
    return found


def test_every_spec_reference_resolves_in_docs_spec():
    assert broken_spec_references(ROOT) == []


def test_every_relative_link_of_the_docs_resolves():
    assert broken_links(ROOT) == []


def test_a_planted_broken_reference_and_link_are_found(tmp_path):
    for part in ("docs", *PACKAGES[:-1]):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__", "regressions"))
    (tmp_path / "tests").mkdir()
    planted = "SPEC §" + "2.9"            # (spelled in two parts, so that this file does not cite it)
    (tmp_path / "README.md").write_text(f"See {planted} and [the envelope](docs/envelope.md#no-such-step).\n"
                                        "Run `pfa-verify run --backend sim --no-such-option` or `pfa-verify frobnicate`.\n")
    assert broken_spec_references(tmp_path) == [f"README.md:1: {planted}"]
    assert broken_links(tmp_path) == ["README.md:1: docs/envelope.md#no-such-step (no such heading)"]
    assert undefined_commands(tmp_path) == ["README.md:2: pfa-verify run --no-such-option", "README.md:2: pfa-verify frobnicate"]


def _options() -> dict[str, set[str]]:
    """Every subcommand of ``pfa-verify`` (and ``cases`` sub-subcommand) with the options it takes."""


    def walk(parser: argparse.ArgumentParser, prefix: str, out: dict) -> None:
        out[prefix] = {s for a in parser._actions for s in a.option_strings}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{prefix} {name}".strip(), out)
    out: dict[str, set[str]] = {}
    walk(cli.build_parser(), "", out)
    return out


def _code(text: str) -> list[tuple[int, str]]:
    """(line number, code) of a Markdown text: its `code spans`, and the lines of indented or fenced blocks."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            out.append((n, line))
        else:
            out += [(n, span) for span in re.findall(r"`([^`]+)`", line)]
    return out


def undefined_commands(root: Path) -> list[str]:
    """Every ``pfa-verify COMMAND [--option ...]`` written as code in README.md and docs/ whose command or
    option the parser does not know."""
    options = _options()
    missing = []
    for path in _docs(root):
        for n, code in _code(path.read_text()):
            for match in re.finditer(r"pfa-verify ((?:[a-z][a-z-]*)(?: (?:list|show|replay|prune))?)([^#]*)", code):
                words = match.group(1).split()
                command = words[0]
                if command not in options:
                    missing.append(f"{path.relative_to(root)}:{n}: pfa-verify {command}")
                    continue
                allowed = set(options[command])
                if len(words) > 1 and f"{command} {words[1]}" in options:
                    allowed |= options[f"{command} {words[1]}"]
                rest = re.split(r"pfa-verify ", match.group(2))[0]
                for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
                    if option not in allowed:
                        missing.append(f"{path.relative_to(root)}:{n}: pfa-verify {command} {option}")
    return missing


def test_every_command_and_option_the_docs_name_exists():
    assert undefined_commands(ROOT) == []


def test_the_readme_recipe_runs_and_fails_as_the_readme_shows(tmp_path, capsys):
    """docs/examples/my_backend.py: the correct backend passes; the buggy one fails, and the failure the
    README walks through is what the command prints (all but the replay line, whose folder differs)."""
    example = "docs/examples/my_backend.py"
    report = tmp_path / "ok.json"
    assert cli.main(["run", "--backend", f"{example}:make_backend", "--cases", "pfa_fp8_b2_s1_1_s2_1k",
                     "--examples", "3", "--no-capture", "--json", str(report)]) == 0
    assert json.loads(report.read_text())["summary"]["checked_cases"] == 4
    capsys.readouterr()
    assert cli.main(["run", "--backend", f"{example}:make_buggy_backend", "--cases", "pfa_fp8_b2_s1_1_s2_1k",
                     "--examples", "3", "--regressions", str(tmp_path / "regs")]) == 1
    printed = capsys.readouterr().out
    _head, name, alike, rest = re.split(r"^    FAIL (generated_\d\d) \(spec\)(.*)\n", (ROOT / "README.md").read_text(),
                                       maxsplit=1, flags=re.M)
    shown = rest.split("\n\n", 1)[0]
    lines = [f"FAIL {name} (spec){alike}"] + [line.strip() for line in shown.splitlines() if "Replay:" not in line]
    flat = " ".join(printed.split())          # the terminal wraps long lines at its width
    for printed_line in lines:
        line = printed_line
        if line.startswith("Diagnosis:"):        # all but the seconds it took
            line = line.rsplit(" models in ", 1)[0]
        assert " ".join(line.split()) in flat, line
    # one capture per group of cases that fail alike (cases/running/groups.py), named on the replay line
    replays = set(re.findall(r"replay ([0-9a-f]{10})", printed))
    assert len(replays) == 1 and {p.stem for p in (tmp_path / "regs").glob("*.json")} == replays   # "its one failing case"


@pytest.mark.parametrize("doc", ["spec.md", "envelope.md", "reference.md", "performance.md"])
def test_the_docs_are_in_the_repository(doc):
    assert (ROOT / "docs" / doc).stat().st_size > 1000

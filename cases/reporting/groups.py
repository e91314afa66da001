"""The groups of cases that fail alike (cases/running/groups.py) as the reports say them: the line a
member's failure text carries, a short list of the members' names, and the JSON report's ``groups``."""
from __future__ import annotations

import re

__all__ = ["group_line", "compact_names", "failure_groups"]


def group_line(case) -> str:
    """What a failure shares with the cases that fail alike (cases/running/groups.py), and which case was
    captured for them; "" for a case alone in its group that was captured as it ran."""
    group = case.group
    if group is None:
        return ""
    if len(group.members) > 1:
        return (f"{len(group.members)} cases fail alike ({group.alike})"
                + (f"; captured once: {group.how}" if group.how else ""))
    return f"Captured: {group.how}" if case.source == "generated" and group.how else ""


def compact_names(names, limit: int = 24) -> str:
    """``names`` as one short list: the generated cases' numbers as runs (``generated_{01-04, 07}``), the
    others in full; past ``limit`` entries, how many more (the table and the JSON report list each)."""
    numbers = [m.group(1) for n in names if (m := re.fullmatch(r"generated_(\d+)", n))]
    parts = [n for n in names if not re.fullmatch(r"generated_\d+", n)]
    runs: list[list[str]] = []
    for number in sorted(numbers, key=int):
        if runs and int(number) == int(runs[-1][-1]) + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    spans = [run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]
    if len(parts) >= limit:
        return ", ".join(parts[:limit]) + f" and {len(names) - limit} more"
    cut = spans[:limit - len(parts)]
    more = sum(len(run) for run in runs[len(cut):])
    if cut:
        parts.append(f"generated_{cut[0]}" if len(spans) == 1 else "generated_{" + ", ".join(cut)
                     + (f" and {more} more" if more else "") + "}")
    return ", ".join(parts)


def failure_groups(run) -> list[dict]:
    """The JSON report's ``groups``: each group of cases that fail alike (cases/running/groups.py), in order."""
    found: dict[int, dict] = {}
    for case in run.results:
        if (group := case.group) is not None and group.number not in found:
            found[group.number] = {"group": group.number, "alike": group.alike, "cases": list(group.members),
                                   "shown": group.shown, "captured": group.how or None, "replay": group.replay}
    return list(found.values())

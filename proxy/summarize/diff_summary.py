"""Diffs, `git show` and `git log`: every file, hunk header and commit (hash, author, date, subject) kept
verbatim and numbered; changed lines are context, shown as far as the budget allows."""

from __future__ import annotations

import re

from .common import LINE_W, _clip, _plural, _Sec, joined
from .detect import _Analysis
from .salient import STRONG_RE
from .text_summary import _lines_summary

FILE_RE = re.compile(r"^(?:diff --git |diff -|Index: |new file mode|deleted file mode|rename (?:from|to) "
                     r"|similarity index|Binary files |index [0-9a-f]+\.\.[0-9a-f]+)")
PLAIN_FILE_RE = re.compile(r"^(?:--- |\+\+\+ )\S")
HUNK_RE = re.compile(r"^@@+ ")
COMMIT_RE = re.compile(r"^(?:commit [0-9a-f]{7,64}\b|Merge: |Author: |Date: |[0-9a-f]{7,40} \S)")
DETECT_RE = re.compile(r"^(?:diff --git |commit [0-9a-f]{7,64}\b|@@ -\d+(?:,\d+)? \+\d+)")
# Over many lines at once (common.joined): at most one match a line, none across lines.
_DETECT_M = re.compile("\n" + DETECT_RE.pattern.removeprefix("^"))
_OPENS_M = re.compile(r"\n(?:diff --git |commit )")
SCAN = 2000


def is_diff(lines: list[str]) -> bool:
    head = joined(lines[:SCAN])[0]
    hits = len(_DETECT_M.findall(head))
    return hits >= 1 and (_OPENS_M.search(head) is not None or hits >= 2)


def diff_summary(an: _Analysis, text: str, max_chars: int, cap: int | None,
                 extra: list[_Sec] | None = None) -> str:
    lines, base = an.lines, an.base
    git = any(line.startswith("diff --git ") for line in lines)
    structure: list[int] = []
    changes: list[int] = []
    files = adds = dels = 0
    after_date = False
    for i, line in enumerate(lines):
        if line.startswith("diff --git ") or (not git and line.startswith("--- ")):
            files += 1
        if FILE_RE.match(line) or HUNK_RE.match(line) or COMMIT_RE.match(line) \
                or (not git and PLAIN_FILE_RE.match(line)):
            structure.append(i)
            after_date = line.startswith("Date: ")
        elif after_date and line.strip():
            structure.append(i)  # a commit's subject line
            after_date = False
        elif line[:1] in ("+", "-") and not line.startswith(("+++ ", "--- ")):
            if not STRONG_RE.search(line):  # error lines are kept, critically, by the shared section
                changes.append(i)
            adds += line[0] == "+"
            dels += line[0] == "-"
    commits = sum(line.startswith("commit ") for line in lines)
    label = (f"diff ({_plural(files, 'file')}, +{adds} -{dels}"
             + (f", {_plural(commits, 'commit')})" if commits else ")"))
    front = [_Sec([f"L{base + i + 1}: {_clip(lines[i], LINE_W)}" for i in structure],
                  "files, hunks, commits:", "header lines", 10, critical=True),
             _Sec([f"L{base + i + 1}: {_clip(lines[i], LINE_W)}" for i in changes], "changed lines:",
                  "changed lines", 3)]
    done = set(structure)
    return _lines_summary(an, text, max_chars, cap, label=label, front=front,
                          shown="\n".join(lines[i] for i in structure), context=False, skip=done)

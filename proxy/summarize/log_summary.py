"""Test runs (pytest, unittest/Django runners, cargo, go, jest): the final result line first, then every
failed test; error lines, frames and the rest come from the shared line summary."""

from __future__ import annotations

import re

from .common import ERR_W, _clip, _Sec, joined
from .detect import _Analysis
from .text_summary import _lines_summary

RESULT_RE = re.compile(r"^=+ .*\b(?:passed|failed|error|errors|skipped|xfailed|no tests ran)\b.* =+$"
                       r"|^(?:Ran \d+ tests? in |FAILED \(|OK(?: \(.*\))?$|Tests?: +\d|test result: )"
                       r"|^\d+ (?:passed|failed)\b|^(?:ok|FAIL|PASS)\s+\S+\s+[\d.]+s$")
FAILED_RE = re.compile(r"^(?:FAILED|ERROR) \S+|^(?:FAIL|ERROR): \w+ \(|^_{3,} .+ _{3,}$|^--- FAIL: ")
SESSION_RE = re.compile(r"^=+ test session starts =+$")
# Every line those two match starts so, after blanks (a cheap pass over all the lines at once first).
_RESULT_START_M = re.compile(r"\n\s*+(?:=+ |Ran \d|FAILED \(|OK|Tests?: |test result: |\d+ (?:passed|failed)"
                             r"|(?:ok|FAIL|PASS)\s)")
TAIL_SCAN = 200  # result lines are at the end; failures listed at the top are found by the full scan
CLIP = 500  # result and failure lines are short: matching a clipped line keeps the regexes linear


def is_test_run(lines: list[str]) -> bool:
    ends = lines[:50] + lines[-TAIL_SCAN:]
    if not _RESULT_START_M.search(joined(ends)[0]):
        return False
    return any(SESSION_RE.match(line[:CLIP]) or RESULT_RE.match(line[:CLIP].strip()) for line in ends)


def test_summary(an: _Analysis, text: str, max_chars: int, cap: int | None,
                 extra: list[_Sec] | None = None) -> str:
    lines, base = an.lines, an.base
    results = [i for i, line in enumerate(lines) if RESULT_RE.match(line[:CLIP].strip())]
    done = set(results)
    failed = [i for i, line in enumerate(lines) if FAILED_RE.match(line[:CLIP]) and i not in done]
    # The summary line is what decides the next step: it goes first, before every other section.
    front = [_Sec([f"L{base + i + 1}: {_clip(lines[i], ERR_W)}" for i in reversed(results)], "result:",
                  "result lines", 20, critical=True),
             _Sec([f"L{base + i + 1}: {_clip(lines[i], ERR_W)}" for i in failed], "failed tests:",
                  "failed tests", 10, critical=True)]
    shown = "\n".join(lines[i] for i in results + failed)
    return _lines_summary(an, text, max_chars, cap, label="test run", front=front + (extra or []),
                          shown=shown, skip=done | set(failed))

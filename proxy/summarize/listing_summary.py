"""Listings (`find`, `ls`, `ls -l`, `ls -R`, `tree`-less path lists) and grep output: every path, grouped by
directory; for grep, every file with the line numbers it matched, the matched lines as context."""

from __future__ import annotations

import re

from .common import LINE_W, VALUE_W, _clip, _plural, _Sec, share_at_least
from .detect import _Analysis
from .salient import group_paths
from .text_summary import _lines_summary

# A grep path has a "/" or a "." (a timestamp "10:00:00" must not read as file "10", line 00); lines are
# clipped to CLIP chars before matching, which bounds the backtracking of the two runs.
GREP_RE = re.compile(r"^(?P<path>[^\s:]{0,300}[/.][^\s:]{0,300}):(?P<line>\d+)[:-]")
GREP_FILE_RE = re.compile(r"^(?P<path>[^\s:]{1,300}\.\w{1,8}):(?!\d)")
CLIP = 700
LS_LONG_RE = re.compile(r"^[-dlcbps][rwxsStT-]{9}[.@+]?\s+\d+\s+\S+\s+\S+\s+[\d,]+\s+\S+\s+\S+\s+\S+\s"
                        r"(?P<name>.+)$")
LS_DIR_RE = re.compile(r"^(?P<dir>[^\s:][^:]*):$")  # "./sympy/printing:" headers of ls -R
PATH_LINE_RE = re.compile(r"^(?:\./|/|~/)?[\w.@+-]+(?:/[\w.@+-]*)*$")
SCAN = 2000


def listing_kind(lines: list[str]) -> str | None:
    """'grep', 'listing' or None, from the share of lines of each shape among the first SCAN (at least
    six tenths grep-like, else at least eight tenths path-like)."""
    sample = [line for line in lines[:SCAN] if line.strip()]
    if len(sample) < 5:
        return None
    if share_at_least(sample, _greppy, 6):
        return "grep"
    return "listing" if share_at_least(sample, _pathy, 8) else None


def _greppy(line: str) -> bool:
    # (both shapes have a colon in the clipped line: a path list has none, and is told so at once)
    return line.find(":", 0, CLIP) >= 0 and bool(GREP_RE.match(line[:CLIP])
                                                  or GREP_FILE_RE.match(line[:CLIP]))


def _pathy(line: str) -> bool:
    return bool(LS_LONG_RE.match(line[:CLIP]) or LS_DIR_RE.match(line) or line.startswith("total ")
                or (PATH_LINE_RE.match(line) and ("/" in line or "." in line[1:] or line.isalnum())))


def _listed_paths(lines: list[str]) -> list[str]:
    paths: list[str] = []
    folder = ""
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("total "):
            continue
        if m := LS_DIR_RE.match(stripped):
            folder = m["dir"].rstrip("/") + "/"
            continue
        if m := LS_LONG_RE.match(stripped[:CLIP]):
            name = m["name"].split(" -> ")[0] + ("/" if stripped[0] == "d" else "")
        else:
            name = stripped
        paths.append(name if name.startswith(("/", "./", "~/")) or not folder else folder + name)
    return list(dict.fromkeys(paths))


def listing_summary(an: _Analysis, text: str, max_chars: int, cap: int | None,
                    extra: list[_Sec] | None = None) -> str:
    paths = _listed_paths(an.lines)
    grouped = group_paths(paths)
    folders = len(grouped)
    front = [_Sec(grouped, "paths by directory:", "directories", 10, critical=True)]
    label = f"listing of {_plural(len(paths), 'path')} in {_plural(folders, 'group')}"
    return _lines_summary(an, text, max_chars, cap, label=label, front=front + (extra or []),
                          shown="\n".join(paths), context=False)


def grep_summary(an: _Analysis, text: str, max_chars: int, cap: int | None,
                 extra: list[_Sec] | None = None) -> str:
    lines, base = an.lines, an.base
    by_file: dict[str, list[str]] = {}
    matched: list[int] = []
    for i, line in enumerate(lines):
        if m := GREP_RE.match(line[:CLIP]):
            by_file.setdefault(m["path"], []).append(m["line"])
            matched.append(i)
        elif m := GREP_FILE_RE.match(line[:CLIP]):
            by_file.setdefault(m["path"], [])
            matched.append(i)
    files = [f"{_clip(path, VALUE_W)}" + (f": lines {', '.join(nums)}" if nums else "")
             for path, nums in by_file.items()]
    front = [_Sec(files, "files and matched line numbers:", "files", 10, critical=True),
             _Sec([f"L{base + i + 1}: {_clip(lines[i], LINE_W)}" for i in matched], "matches:", "matches", 3)]
    label = f"search results, {_plural(len(matched), 'match', 'matches')} in {_plural(len(by_file), 'file')}"
    return _lines_summary(an, text, max_chars, cap, label=label, front=front + (extra or []),
                          shown="\n".join(by_file), context=False)

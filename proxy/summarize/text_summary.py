"""Log and plain-text summaries: head, tail, error lines with tracebacks, and the paths mentioned."""

from __future__ import annotations

import re

from .common import (
    ERR_RE,
    ERR_W,
    HEAD_LINES,
    LINE_W,
    MAX_ERR,
    MAX_PATHS,
    TAIL_LINES,
    VALUE_W,
    _clip,
    _distinct,
    _layout,
    _numbered,
    _plural,
    _Sec,
)
from .detect import _Analysis
from .json_summary import _id_secs, _id_value, _is_id_key

FRAME_RE = re.compile(r'^\s*File "[^"]*", line \d+')
TB_RE = re.compile(r"Traceback \(most recent call last\):")
# Every character a path may contain is in the lookbehind, so a match only starts at the beginning of a
# run: the scan stays linear even on a megabyte-long single line.
PATH_RE = re.compile(r"(?<![\w/.@+\\:~-])(?:(?:~|\.\.?)/[\w.@+-]+(?:/[\w.@+-]+)*|/[\w.@+-]+(?:/[\w.@+-]+)+"
                     r"|/[\w@+-][\w.@+-]*\.[A-Za-z]\w{0,7}\b|(?:[\w.@+-]+/)+[\w@+-][\w.@+-]*\.[A-Za-z]\w{0,7}\b"
                     r"|[A-Za-z]:\\[^\s\"'<>|*?]+)")
JSON_ID_RE = re.compile(r'"([A-Za-z_][\w-]{0,40})"\s*:\s*("(?:[^"\\\n]|\\.){0,300}"|-?\d{1,30}\b)')


def _flagged(lines: list[str]) -> list[int]:
    """Error-ish lines, plus traceback frames, their source lines and the exception that ends them."""
    out: list[int] = []
    in_tb = after_frame = False
    for i, line in enumerate(lines):
        frame = bool(FRAME_RE.match(line))
        hit = frame or bool(ERR_RE.search(line)) or (after_frame and line[:1].isspace())
        if TB_RE.search(line):
            in_tb = True
        elif in_tb and line.strip() and not line[0].isspace():
            hit, in_tb = True, False  # the exception line, e.g. "KeyboardInterrupt" which names no error
        after_frame = frame
        if hit:
            out.append(i)
    return out


def _lines_summary(an: _Analysis, text: str, max_chars: int) -> str:
    lines, n = an.lines, len(an.lines)
    flagged = _flagged(lines)
    shown = set(flagged[:MAX_ERR])  # membership only, never iterated
    split = n if n <= HEAD_LINES + TAIL_LINES else HEAD_LINES
    head = _numbered(lines, [i for i in range(split) if i not in shown], LINE_W)
    tail = _numbered(lines, [i for i in range(max(split, n - TAIL_LINES), n) if i not in shown], LINE_W)
    notes = f"; starts like JSON but does not parse ({an.json_error})" if an.json_error else ""
    if len(text) >= 200 and re.fullmatch(r"[A-Za-z0-9+/=_\-\s]+", text[:100_000]):
        notes += "; looks like base64"
    header = (f"{an.kind}, {_plural(n, 'line')}, {_plural(len(flagged), 'error line')}, {len(text)} chars"
              f"{notes}" if text else f"{an.kind}, empty")
    paths = [_clip(p, VALUE_W) for p in _distinct([m.group().rstrip(".,") for m in PATH_RE.finditer(text)])]
    secs = [_Sec([_clip(header, LINE_W)], weight=50),
            _Sec(head, "lines:" if split == n else "first lines:", "lines", 2),
            _Sec(_numbered(lines, flagged[:MAX_ERR], ERR_W), "error/warning lines:",
                 "error lines", 5, extra=max(len(flagged) - MAX_ERR, 0)),
            _Sec(tail, "last lines:", "lines", 2, tail=True),
            _Sec(paths[:MAX_PATHS], "paths: ", "paths", 1, inline=True, extra=max(len(paths) - MAX_PATHS, 0))]
    if an.json_error:  # truncated or broken JSON still carries ids worth keeping
        found: dict[str, dict[str, None]] = {}
        for m in JSON_ID_RE.finditer(text):
            if _is_id_key(m[1]):
                found.setdefault(m[1], {})[_id_value(m[2][1:-1] if m[2][:1] == '"' else m[2])] = None
        secs += _id_secs(found)
    return _layout(secs, max_chars)


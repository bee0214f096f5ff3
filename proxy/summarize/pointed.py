"""The lines a call's arguments point at (a line range, a line number, a search pattern), kept verbatim.

`arguments` is the call's JSON arguments string as the model wrote it: it may be None, invalid JSON or of
any shape, so every lookup is defensive. A file read often prints the file's own line numbers in a gutter
("  12\\tcode", "12:code"): a range then means those numbers, else the output's own lines.
"""

from __future__ import annotations

import re

from proxy import shallow_json

from .common import LINE_W, _clip, _Sec

GUTTER_RE = re.compile(r"^\s*(\d{1,9})(?:\t|→|│|\||:)")
START_KEYS = ("start_line", "line_start", "start", "from_line", "offset", "begin", "first_line")
END_KEYS = ("end_line", "line_end", "end", "to_line", "last_line")
LINE_KEYS = ("line_number", "line", "lineno", "line_no")
RANGE_KEYS = ("view_range", "line_range", "lines", "range")
PATTERN_KEYS = ("pattern", "query", "search", "search_term", "regex", "grep", "needle", "symbol",
                "search_string", "old_str")
AROUND = 3  # lines either side of a single pointed line
MAX_POINTED = 200


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _targets(args: dict) -> tuple[tuple[int, int] | None, list[str]]:
    start = next((v for k in START_KEYS if (v := _int(args.get(k))) is not None), None)
    end = next((v for k in END_KEYS if (v := _int(args.get(k))) is not None), None)
    limit = _int(args.get("limit"))
    if start is not None and end is None and limit is not None:
        end = start + limit - 1
    for key in RANGE_KEYS:
        value = args.get(key)
        if isinstance(value, list) and len(value) == 2 and all(_int(v) is not None for v in value):
            start, end = _int(value[0]), _int(value[1])
    line = next((v for k in LINE_KEYS if (v := _int(args.get(k))) is not None), None)
    span: tuple[int, int] | None = None
    if start is not None:
        span = (start, end if end is not None and end >= start else start + 2 * AROUND)
    elif line is not None:
        span = (line - AROUND, line + AROUND)
    patterns = [v for k in PATTERN_KEYS if isinstance(v := args.get(k), str) and 2 <= len(v.strip()) <= 200]
    return span, patterns


def pointed_sec(arguments: str | None, lines: list[str], base: int = 0) -> _Sec | None:
    """A critical section of the output lines the call asked for, or None."""
    if not arguments:
        return None
    try:
        args = shallow_json.loads(arguments)
    except ValueError:
        return None
    if not isinstance(args, dict):
        return None
    span, patterns = _targets(args)
    picked: dict[int, None] = {}
    if span is not None:
        gutter = {int(m[1]): i for i, line in enumerate(lines) if (m := GUTTER_RE.match(line))}
        lo, hi = span
        inside = [i for k, i in gutter.items() if lo <= k <= hi]  # bounded by the output, not the range
        if inside:
            picked |= dict.fromkeys(inside)
        else:
            picked |= {i: None for i in range(max(lo - 1, 0), min(hi, len(lines)))}
    for pattern in patterns:
        needle = pattern.strip().lower()
        picked |= {i: None for i, line in enumerate(lines) if needle in line.lower()}
    if not picked:
        return None
    chosen = sorted(picked)
    return _Sec([f"L{base + i + 1}: {_clip(lines[i], LINE_W)}" for i in chosen[:MAX_POINTED]],
                "lines the call points at:", "pointed lines", 9, critical=True,
                extra=max(len(chosen) - MAX_POINTED, 0))

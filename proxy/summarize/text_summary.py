"""Line-based summaries (logs, shell output, plain text): a header, the kind's own sections, error lines with
tracebacks (repeats collapsed), the paths and ids mentioned, then head and tail lines as context."""

from __future__ import annotations

import re

from .common import HEAD_LINES, LINE_W, Unfit, _clip, _layout, _numbered, _plural, _Sec, unfit
from .detect import _Analysis
from .json_summary import _id_secs, _id_value, _is_id_key
from .salient import flag_lines, salient_secs

MAX_END_LINES, END_LINE_CHARS = 150, 200
JSON_ID_RE = re.compile(r'"([A-Za-z_][\w-]{0,40})"\s*:\s*("(?:[^"\\\n]|\\.){0,300}"|-?\d{1,30}\b)')


def _flagged(lines: list[str]) -> list[int]:
    """Error-ish lines (strong and weak), in order: what the gist counts as error lines."""
    strong, weak = flag_lines(lines)
    return sorted(strong + weak)


def _lines_summary(an: _Analysis, text: str, max_chars: int, cap: int | None = None, *,
                   label: str = "", front: list[_Sec] | None = None, shown: str = "",
                   context: bool = True, skip: set[int] | frozenset[int] = frozenset()) -> str:
    """`front`: the kind's own sections (test results, diff headers…); `shown`: text they already keep, so
    its paths and ids are not listed twice; `skip`: line indices they already show."""
    if front and unfit(front, max_chars, cap):
        raise Unfit  # (as _layout would, after the scans below: critical sections are only added)
    lines, n, base = an.lines, len(an.lines), an.base
    strong, weak = flag_lines(lines)
    flagged = set(strong) | set(weak)  # membership only, never iterated
    # A bigger budget shows more of both ends (the layout still trims them to what is left).
    ends = max(HEAD_LINES, min(MAX_END_LINES, max_chars // END_LINE_CHARS))
    split = n if n <= 2 * ends else ends
    head = [f"L{base + i + 1}: {_clip(lines[i], LINE_W)}" for i in range(split) if i not in flagged]
    tail = [f"L{base + i + 1}: {_clip(lines[i], LINE_W)}" for i in range(max(split, n - ends), n)
            if i not in flagged]
    notes = f"; starts like JSON but does not parse ({an.json_error})" if an.json_error else ""
    if len(text) >= 200 and re.fullmatch(r"[A-Za-z0-9+/=_\-\s]+", text[:100_000]):
        notes += "; looks like base64"
    kind = label or an.kind
    header = (f"{kind}, {_plural(n, 'line')}, {_plural(len(strong) + len(weak), 'error line')}, "
              f"{len(text)} chars{notes}" if text else f"{kind}, empty")
    secs = [_Sec([_clip(header, LINE_W)], weight=50, critical=True), *(front or [])]
    secs += salient_secs(lines, text, base, shown, skip=skip, flagged=(strong, weak))
    if context:
        secs += [_Sec(head, "lines:" if split == n else "first lines:", "lines", 2),
                 _Sec(tail, "last lines:", "lines", 2, tail=True)]
    if an.json_error:  # truncated or broken JSON still carries ids worth keeping
        found: dict[str, dict[str, None]] = {}
        for m in JSON_ID_RE.finditer(text):
            if _is_id_key(m[1]):
                found.setdefault(m[1], {})[_id_value(m[2][1:-1] if m[2][:1] == '"' else m[2])] = None
        secs += _id_secs(found)
    return _layout(secs, max_chars, cap)


__all__ = ["_flagged", "_lines_summary", "_numbered"]

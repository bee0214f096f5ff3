"""The fast error-line scan (a word pass over the whole text) flags exactly what a per-line regex does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.summarize.salient import FRAME_RE, STRONG_RE, TB_RE, WEAK_RE, flag_lines

PIECES = ["Error", "ERROR", "error:", "warn", "Traceback (most recent call last):", '  File "x.py", line 3',
          "FAIL", "=== 2 failed, 3 passed ===", "\u0130stanbul error", "TIMED OUT", "assert x", "HTTPError",
          "should_errors", "panic:", "==== 3 passed in 1s", "ok", "  indented", "x", "\u0130",
          "KeyboardInterrupt", "terror"]


def reference(lines: list[str]) -> tuple[list[int], list[int]]:
    """Three regex searches on every line: the obvious, slow definition."""
    strong, weak, in_tb, after_frame = [], [], False, False
    for i, line in enumerate(lines):
        frame = bool(FRAME_RE.match(line))
        hit = frame or bool(STRONG_RE.search(line)) or (after_frame and line[:1].isspace() and line.strip())
        if TB_RE.search(line):
            in_tb = True
        elif in_tb and line.strip() and not line[0].isspace():
            hit, in_tb = True, False
        after_frame = frame
        if hit:
            strong.append(i)
        elif WEAK_RE.search(line):
            weak.append(i)
    return strong, weak


line = st.lists(st.sampled_from(PIECES), max_size=5).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.one_of(line, st.text(max_size=40)), max_size=30))
def test_fast_scan_flags_the_same_lines_as_the_per_line_definition(lines):
    lines = "\n".join(lines).splitlines()  # as the summarizer sees them: no line breaks inside a line
    assert flag_lines(lines) == reference(lines)

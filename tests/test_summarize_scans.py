"""The summarizer's scans over many lines at once answer as their per-line definitions do: kind detection
(log lines, error lines, code lines, test runs, diffs) and traceback frames. Lines are built from pieces
that sit on each pattern's edges (blanks of every kind, a colon or a digit short, a word run on)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.summarize.common import has_error_word, joined, lines_with, matching_lines
from proxy.summarize.detect import CODE_LINE_RE, LEVEL_RE, TS_RE, _code_line, _error_lines, _log_lines
from proxy.summarize.diff_summary import DETECT_RE, SCAN, is_diff
from proxy.summarize.log_summary import CLIP, RESULT_RE, SESSION_RE, TAIL_SCAN, is_test_run
from proxy.summarize.salient import _FRAME_M, FRAME_RE

BLANKS = [" ", "  ", "\t", "\u3000", "\xa0", "\x1f", "\x0c"]


def lines_of(pieces: list[str]) -> st.SearchStrategy[list[str]]:
    piece = st.one_of(st.sampled_from(pieces), st.sampled_from(BLANKS), st.text(max_size=6))
    line = st.lists(piece, max_size=6).map("".join)
    # as the summarizer sees them: no line break inside a line
    return st.lists(line, max_size=12).map(lambda ls: "\n".join(ls).splitlines())


LOG = ["2024-01-02 ", "2024-01-02T", "12:30", ":45", "1:2", "12:3", " INFO ", "WARNING", "level=", "level ",
       "ERROR", "ERR", "DEBUG:", "x" * 40, "٣٤:٥٦", "¹²:³⁴"]


@settings(max_examples=300, deadline=None)
@given(lines_of(LOG))
def test_log_lines_are_counted_as_line_by_line(sample: list[str]) -> None:
    expected = sum(bool(TS_RE.search(line[:40]) or LEVEL_RE.search(line[:80])) for line in sample)
    assert _log_lines(sample) == expected


ERRORS = ["error", "ERROR", "Fail", "timed out", "timed\tout", "assert", "pan\u0131c", "a\u017fsert",
          "\u0130", "\u212a", "warn", "Exception"]


@settings(max_examples=300, deadline=None)
@given(lines_of(ERRORS))
def test_error_lines_are_counted_as_line_by_line(sample: list[str]) -> None:
    assert _error_lines(sample) == sum(map(has_error_word, sample))


CODE = ["{", "}", ";", ":", "//", "/*", "*/", "#include", "#define", "import", "import ", "from x import",
        "from  x\timport", "package ", "use ", "return", "return(", "returns", "@x", "@", "if (", "if(",
        "for  (", "while\t(", "self.", "self", "x = 1", "def f():"]


@settings(max_examples=800, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(CODE), st.sampled_from(BLANKS)), max_size=6).map("".join))
def test_a_code_line_is_told_as_the_regex_tells_it(head: str) -> None:
    head = head.splitlines()[0] if head.splitlines() else ""
    assert _code_line(head) == bool(CODE_LINE_RE.search(head))


RESULTS = ["=== 2 failed, 3 passed in 1.2s ===", "= test session starts =", "=== test session starts ===",
           "Ran 3 tests in 0.1s", "Ran x", "OK", "OK (skipped=1)", "FAILED (failures=1)", "Tests: 3",
           "Test:  4", "test result: ok.", "3 passed", "12 failed", "ok  pkg/x 0.1s", "FAIL pkg 0.2s",
           "PASS x 1.0s", "ok", "==", "no tests ran", "x" * 30]


def reference_test_run(lines: list[str]) -> bool:
    ends = lines[:50] + lines[-TAIL_SCAN:]
    return any(SESSION_RE.match(line[:CLIP]) or RESULT_RE.match(line[:CLIP].strip()) for line in ends)


@settings(max_examples=300, deadline=None)
@given(lines_of(RESULTS))
def test_a_test_run_is_told_as_line_by_line(lines: list[str]) -> None:
    assert is_test_run(lines) == reference_test_run(lines)


DIFFS = ["diff --git a/x b/x", "diff --git", "commit 0123abc", "commit 0123abcX", "commit 12",
         "@@ -1,2 +3 @@", "@@ -1 +2", "@@ -x", "+++ b/x", "--- a/x"]


def reference_diff(lines: list[str]) -> bool:
    head = lines[:SCAN]
    hits = sum(bool(DETECT_RE.match(line)) for line in head)
    return hits >= 1 and (any(line.startswith(("diff --git ", "commit ")) for line in head) or hits >= 2)


@settings(max_examples=300, deadline=None)
@given(lines_of(DIFFS))
def test_a_diff_is_told_as_line_by_line(lines: list[str]) -> None:
    assert is_diff(lines) == reference_diff(lines)


FRAMES = ['File "x.py", line 3', 'File "a\"b", line 12', "File ", "src/x.py:41: in parse",
          "x.py:3: ValueError", "x.py:3: DeprecationWarning: y", "a.b:1: ", "./t.py:12: in", "in f", ":7: x"]


@settings(max_examples=300, deadline=None)
@given(lines_of(FRAMES))
def test_frames_are_found_as_line_by_line(lines: list[str]) -> None:
    text, starts = joined(lines)
    expected = {i for i, line in enumerate(lines) if FRAME_RE.match(line)}
    assert matching_lines(_FRAME_M, text, starts) == expected


@given(lines_of(["ab", "b", "abc"]), st.lists(st.sampled_from(["ab", "b", "c", "bc"]), min_size=1,
                                             max_size=3))
def test_words_are_found_in_the_lines_that_hold_them(lines: list[str], words: list[str]) -> None:
    text, starts = joined(lines)
    expected = {i for i, line in enumerate(lines) if any(word in line for word in words)}
    assert lines_with(text, tuple(words), starts) == expected

"""The fast scans find exactly what their plain definitions do: error lines (a word pass over the whole text
against a per-line regex), paths and ids (only the words that can hold one, against the whole text)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.summarize.salient import (
    FILE_RE,
    FRAME_RE,
    ID_RE,
    MAX_TOKENS,
    PATH_RE,
    STRONG_RE,
    TB_RE,
    URL_RE,
    WEAK_RE,
    find_ids,
    find_paths,
    flag_lines,
)

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


def plain_paths(text: str) -> list[str]:
    """Both path patterns over the whole text, then URLs' tails dropped: the definition."""
    found: dict[str, None] = {}
    for regex in (PATH_RE, FILE_RE):
        for m in regex.finditer(text):
            path = m.group().rstrip(".,:;")
            if (m.start() and text[m.start() - 1] in ":/") or len(path) < 3 or path.count("/") == len(path):
                continue
            found[path] = None
            if len(found) >= MAX_TOKENS:
                break
    for m in URL_RE.finditer(text):
        found.pop(m.group().split("://", 1)[1], None)
    return list(found)


def plain_ids(text: str) -> list[str]:
    found = [m.group() for m in ID_RE.finditer(text) if not m.group().replace("-", "").isdigit()]
    return list(dict.fromkeys(found))


TOKEN_PIECES = ["src/app.py", "./run.sh", "../x", "~/y", "/etc/hosts", "/usr/bin", "a/b/c", "C:\\Users\\me",
                "x.py:12:", "file:///tmp/a.txt", "https://h.io/p/q.html", "ab12", "A-123-x", "12-34",
                "sha256:ab12cd34", "v1.2.3", "foo.bar.baz", "//", "/", ".", ":", "-", "\u2028", "\u3000",
                "\x1c", "\xa0", "\t", "\n", " ", "é1z9", "ß-42x"]
token_text = st.lists(st.one_of(st.sampled_from(TOKEN_PIECES), st.text(max_size=8)), max_size=40).map("".join)


@settings(max_examples=400, deadline=None)
@given(text=token_text)
def test_word_scans_find_the_paths_and_ids_the_whole_text_holds(text):
    assert find_paths(text) == plain_paths(text)
    assert find_ids(text) == plain_ids(text)

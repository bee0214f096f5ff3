"""Ids, paths and error lines found by content (proxy/layers/identifiers.py): the fast paths (a lazy merge
of path and id matches over the words that can hold one, cheap word checks and a whole-text check before
the line walk) find what a plain walk finds."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice

from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.layers import identifiers
from proxy.layers.identifiers import _DECISIVE, _ERROR, _ID, _PATH, clip, error_lines, ids_and_paths

PIECES = ["error", "Error", "ValueError: bad value", "FAILED tests/test_x.py::test_y",
          "=== 2 passed in 0.1s ===",
          "== 1 failed ==", "not found", "not  found", "ok", "HAT169", "src/app/main.py", "./a/b", "#W93",
          "deadbeef1234", "2024-01-02", "x", " ", "  ", "\n", "\r", "\r\n", "\x0c", "\x1c", "\u2028", "=",
          "passed", "Traceback (most recent call last):", "E   assert 1 == 2", "a.py:12", "https://x.io/a/b",
          "pa\u017f\u017fed", "\u212aEY=", "\u0130", "FAILURE", "api_key = abc123", "Password: hunter2x9",
          "token:", "x9.y/z", "v1.2.3", "usr/lib/x", "\xa0", "\t"]
texts = st.lists(st.sampled_from(PIECES), max_size=40).map("".join) | st.text(max_size=200)


def reference_error_lines(text: str, limit: int, width: int) -> list[str]:
    decisive: list[str] = []
    other: list[str] = []
    for raw in islice(identifiers._scanned(text).splitlines(), 5_000):
        line = raw.strip()
        if not line or len(line) > 2_000 or not _ERROR.search(line):
            continue
        (decisive if _DECISIVE.search(line) else other).append(line)
    chosen: dict[str, None] = {}
    for line in [*reversed(decisive), *other]:
        chosen.setdefault(clip(line, width), None)
        if len(chosen) >= limit:
            break
    return list(chosen)


def reference_merged(text: str) -> Iterator[str]:
    paths = [(m.start(), m.end(), m.group()) for m in _PATH.finditer(text)]
    taken = 0
    for match in _ID.finditer(text):
        while taken < len(paths) and paths[taken][1] <= match.start():
            yield paths[taken][2]
            taken += 1
        if taken < len(paths) and paths[taken][0] <= match.start() < paths[taken][1]:
            continue
        yield match.group().lstrip("#")
    yield from (path for _, _, path in paths[taken:])


@settings(max_examples=400, deadline=None)
@given(texts, st.integers(1, 6))
@example("abc\r=== 2 passed in 0.1s ===", 3)  # a line that starts past a \r
@example("x\x0c  ValueError: bad value\nok", 3)
def test_error_lines_are_those_of_a_walk_over_every_line(text, limit):
    assert error_lines(text, limit, 80) == reference_error_lines(text, limit, 80)


def reference_ids_and_paths(text: str, limit: int) -> list[str]:
    """The whole text scanned: no word filter, no cheap first passes."""
    text = identifiers._URL.sub(" ", identifiers._scanned(text))
    if identifiers._CREDENTIAL.search(text):
        text = "\n".join(line for line in text.splitlines() if not identifiers._CREDENTIAL.search(line))
    found: dict[str, None] = {}
    for match in reference_merged(text):
        token = match.rstrip(".")
        if len(token) >= 4 and not (identifiers._HEX_ONLY.fullmatch(token) and len(token) < 7) \
                and not identifiers._DATE.match(token):
            found.setdefault(token, None)
            if len(found) >= limit:
                break
    return list(found)


@settings(max_examples=400, deadline=None)
@given(texts, st.integers(1, 12))
def test_ids_and_paths_come_in_the_order_of_an_eager_merge(text, limit):
    assert list(identifiers._merged(text)) == list(reference_merged(text))
    assert ids_and_paths(text, limit) == reference_ids_and_paths(text, limit)
    assert len(ids_and_paths(text, limit)) <= limit


def test_an_error_free_text_has_no_error_lines_and_a_summary_line_is_found_past_a_carriage_return():
    assert error_lines("all good\n" * 1000, 3, 80) == []
    assert error_lines("collected 74 items\r=== 2 failed, 72 passed ===\n", 3, 80) == [
        "=== 2 failed, 72 passed ==="]

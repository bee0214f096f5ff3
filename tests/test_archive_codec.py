"""Column values for the archive: the fast paths for common cells (ASCII text, 64-bit integers) give
exactly what the general rules give, and whatever they return SQLite stores and gives back."""

from __future__ import annotations

import sqlite3
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.archive_codec import cell, dumps, safe_text


def _safe_text_by_the_rules(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        return dumps(value).decode()
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def _cell_by_the_rules(value: Any) -> Any:
    if value is None or isinstance(value, float | bytes):
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else str(value)
    if isinstance(value, str):
        return _safe_text_by_the_rules(value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return dumps(value).decode()


class Tag(str):
    """A str subclass (an enum's value, say): not the exact type the fast path takes."""


texts = st.text() | st.text(alphabet=st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010)) \
    | st.sampled_from(["", "plain ascii", "caf\u00e9", "lone \ud800 surrogate", "\udfff"])
integers = st.integers() | st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**80])
values = (texts | integers | st.booleans() | st.none() | st.floats(allow_nan=False) | st.binary()
          | st.builds(bytearray, st.binary()) | st.builds(Tag, texts)
          | st.dictionaries(st.text(max_size=5), integers | texts, max_size=3)
          | st.lists(integers | texts, max_size=3))


@given(values)
def test_cell_is_what_the_general_rules_give(value):
    assert cell(value) == _cell_by_the_rules(value)
    assert type(cell(value)) is type(_cell_by_the_rules(value))


@given(texts | st.none() | integers | st.builds(Tag, texts))
def test_safe_text_is_what_the_general_rules_give(value):
    assert safe_text(value) == _safe_text_by_the_rules(value)


@given(values)
def test_sqlite_stores_every_cell(value):
    with sqlite3.connect(":memory:") as conn:
        conn.execute("CREATE TABLE t (v)")
        conn.execute("INSERT INTO t VALUES (?)", [cell(value)])
        assert conn.execute("SELECT v FROM t").fetchone()[0] == cell(value)

"""proxy/wire/json_layout.py: where a body's top-level array and its elements lie, from its bytes alone."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.wire import json_layout
from proxy.wire.json_layout import element_ends, elements, layout_of
from tests.strategies import dump_styled as dump
from tests.strategies import json_styles as styles

# Strings that would confuse a careless scanner: quotes, escapes, brackets, non-ASCII, a fake key.
tricky_text = st.lists(st.sampled_from([*'ab "\\{}[]:,\n\té€😀', '"messages":[']), max_size=20).map("".join)
element = st.dictionaries(tricky_text, tricky_text | st.lists(tricky_text, max_size=2), max_size=3)
scalar = tricky_text | st.integers(-(2**63), 2**63 - 1)  # (orjson writes 64-bit integers)
keys = st.dictionaries(tricky_text.filter(lambda k: k != "messages"), scalar, max_size=3)


@given(st.lists(element, min_size=1, max_size=6), keys, keys, styles)
def test_each_element_ends_where_its_bytes_end(items: list[dict[str, Any]], before: dict[str, Any],
                                               after: dict[str, Any], style: str) -> None:
    after = {k: v for k, v in after.items() if k not in before}
    raw = dump({**before, "messages": items, **after}, style)
    layout = layout_of(raw, "messages", len(items))
    assert layout is not None
    assert layout.head == before
    starts = [layout.opening, *layout.ends[:-1]]
    for item, start, end in zip(items, starts, layout.ends, strict=True):
        assert json.loads(raw[start:end].lstrip(b", \n")) == item
    assert raw[layout.closing - 1:layout.closing] == b"]"
    assert json.loads(b"{" + raw[layout.closing:].lstrip(b", \n")) == after if after else True
    assert elements(raw, layout.opening) == (layout.ends, layout.closing)


def test_shapes_it_cannot_tell_are_none() -> None:
    assert layout_of(b'{"messages":[{}],"messages":[{}]}', "messages", 1) is None  # the key twice
    assert layout_of(b'{"messages":["text"]}', "messages", 1) is None  # a string element
    assert layout_of(b'{"messages":[{}]}', "messages", 2) is None  # not the count asked for
    assert layout_of(b'{"other":[{}]}', "messages", 1) is None


@given(st.lists(element, min_size=1, max_size=6), keys, styles, st.integers(0, 6))
def test_told_by_serialization_or_scanned_the_ends_are_the_same(items: list[dict[str, Any]],
                                                                 after: dict[str, Any], style: str,
                                                                 skip: int) -> None:
    """From the array's start or after any element, whatever the body's spacing and escapes."""
    raw = dump({"messages": items, **{k: v for k, v in after.items() if k != "messages"}}, style)
    layout = layout_of(raw, "messages", len(items))
    assert layout is not None
    skip = min(skip, len(items))
    position = layout.ends[skip - 1] if skip else layout.opening
    parsed = orjson.loads(raw)["messages"]
    assert element_ends(raw, position, parsed[skip:]) == elements(raw, position)
    assert layout_of(raw, "messages", len(items), parsed) == layout


def test_compact_elements_are_told_without_a_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    items = [{"role": "user", "content": 'a "quoted" [bracket] and \\ é ' * 50}, {"role": "assistant",
             "content": [{"type": "text", "text": "}]}"}]}]
    raw = orjson.dumps({"model": "m", "messages": items, "tools": []})
    expected = elements(raw, raw.index(b"[") + 1)
    monkeypatch.setattr(json_layout, "elements", lambda *_: pytest.fail("scanned"))
    assert element_ends(raw, raw.index(b"[") + 1, orjson.loads(raw)["messages"]) == expected
    spaced = json.dumps({"messages": items}).encode()  # ", " and ": ": the scan takes over
    monkeypatch.undo()
    assert element_ends(spaced, spaced.index(b"[") + 1, items) == elements(spaced, spaced.index(b"[") + 1)


def test_an_element_nested_past_what_orjson_writes_is_scanned() -> None:
    deep: Any = {}
    for _ in range(300):  # (orjson reads 1,024 levels, writes 255)
        deep = {"a": [deep]}
    raw = orjson.dumps({"messages": [{"role": "user"}]})[:-2] + b"," + json.dumps(deep).encode() + b"]}"
    values = orjson.loads(raw)["messages"]
    assert element_ends(raw, raw.index(b"[") + 1, values) == elements(raw, raw.index(b"[") + 1)

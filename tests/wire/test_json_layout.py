"""proxy/wire/json_layout.py: where a body's top-level array and its elements lie, from its bytes alone."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.wire.json_layout import elements, layout_of
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

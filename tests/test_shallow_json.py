"""proxy/shallow_json.py: JSON inside text is parsed as the stdlib would, except text nested past the
limit, which no parser in the proxy is sent down (a finalizer run ~1,000 frames deep fails)."""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy import shallow_json
from proxy.layers.folded import episode_from_messages
from proxy.sse import assemble
from proxy.summarize import summarize
from proxy.summarize.pointed import pointed_sec

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats(allow_nan=False)
    | st.text(alphabet="[]{}\"\\ab:,"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=30)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@given(JSON_VALUES, st.integers(0, 8))
def test_depth_of_json_text_is_told_as_the_parse_nests(value: Any, limit: int) -> None:
    raw = json.dumps(value).encode()
    assert shallow_json.nested_deeper(raw, limit) == (_depth(value) > limit)


@given(JSON_VALUES)
def test_what_it_parses_is_what_the_stdlib_parses(value: Any) -> None:
    text = json.dumps(value)
    assert shallow_json.loads(text) == json.loads(text) == shallow_json.loads(text.encode())


def test_what_only_the_stdlib_reads_is_read_and_what_is_not_json_is_a_value_error() -> None:
    big = 123456789012345678901234567890  # (orjson would give a float: the digits are kept)
    assert shallow_json.loads(f'{{"n": {big}}}') == {"n": big}
    assert math.isnan(shallow_json.loads("[NaN]")[0])
    assert shallow_json.loads('"\\ud800"') == "\ud800"
    for bad in ("{", "[1,]", "not json", ""):
        with pytest.raises(json.JSONDecodeError):
            shallow_json.loads(bad)


def test_text_nested_past_the_limit_goes_to_no_parser(monkeypatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("parsed")

    monkeypatch.setattr(shallow_json.json, "loads", refuse)
    for text in ("[" * 990 + "]" * 990, '{"a":' * 950 + "1" + "}" * 950, "[" * 5000, "[" * 129 + "]" * 129):
        with pytest.raises(ValueError, match="nested more than 128"):
            shallow_json.loads(text)
    monkeypatch.undo()
    assert shallow_json.loads("[" * 128 + "]" * 128) is not None  # (at the limit: parsed)
    assert shallow_json.loads('["' + "[" * 5000 + '"]') == ["[" * 5000]  # brackets in a string do not nest


DEEP_TEXTS = ("[" * 990 + "]" * 990, '{"a":' * 950 + "1" + "}" * 950, "[" * 5000 + "]" * 5000)


@pytest.fixture
def deep_parses(monkeypatch) -> list[int]:
    """Records the nesting of every text the stdlib's parser or serializer is handed deeper than the
    limit (their exceptions are caught by the callers, so only a record shows they went down there)."""
    deep: list[int] = []
    real_loads, real_dumps = json.loads, json.dumps

    def loads(text: Any, *args: Any, **kwargs: Any) -> Any:
        raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
        if shallow_json.nested_deeper(raw, shallow_json.DEPTH_LIMIT):
            deep.append(len(raw))
        return real_loads(text, *args, **kwargs)

    def dumps(value: Any, *args: Any, **kwargs: Any) -> str:
        if _depth_at_least(value, shallow_json.DEPTH_LIMIT + 1):
            deep.append(-1)
        return real_dumps(value, *args, **kwargs)

    monkeypatch.setattr(json, "loads", loads)
    monkeypatch.setattr(json, "dumps", dumps)
    return deep


def _depth_at_least(value: Any, levels: int) -> bool:
    while levels > 0 and isinstance(value, list | dict) and value:
        value = next(iter(value.values())) if isinstance(value, dict) else value[0]
        levels -= 1
    return levels == 0


def test_a_deep_tool_result_is_summarized_as_text_without_the_deep_parse(deep_parses: list[int]) -> None:
    for text in DEEP_TEXTS:
        assert summarize(text, tool_name="run")
        body = summarize(text + "\n" + "error: failed at /src/app.py line 12\n" * 40, tool_name="run")
        assert "/src/app.py" in body
        assert pointed_sec(text, text.splitlines()) is None
    assert deep_parses == []


def test_deep_tool_call_arguments_fold_into_a_label_without_the_deep_parse(deep_parses: list[int]) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    for turn, arguments in enumerate(DEEP_TEXTS):
        call = {"id": f"c{turn}", "type": "function", "function": {"name": "run", "arguments": arguments}}
        messages += [{"role": "assistant", "content": "I ran it.", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"c{turn}", "content": "ok"}]
    episode = episode_from_messages(messages, 1, (0, len(messages)))
    assert "run(" in orjson.dumps(episode.model_dump()).decode()
    assert deep_parses == []


def test_a_deep_stream_event_is_named_as_a_problem_without_the_deep_parse(deep_parses: list[int]) -> None:
    events = [b"data: " + DEEP_TEXTS[2].encode() + b"\n\n",
              b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n', b"data: [DONE]\n\n"]
    assembly = assemble(events)
    assert assembly.problems and deep_parses == []

"""The chat request validator: each shape the proxy relies on, named exactly in the 400's `param`."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from proxy.errors import BadRequest
from proxy.validate import MAX_DEPTH, parse_chat_request


def _body(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": list(messages) or [{"role": "user", "content": "hi"}], **fields}


def _error(raw: bytes | dict[str, Any]) -> BadRequest:
    with pytest.raises(BadRequest) as caught:
        parse_chat_request(raw if isinstance(raw, bytes) else orjson.dumps(raw))
    assert caught.value.status == 400 and caught.value.type == "invalid_request_error"
    return caught.value


CALL = {"id": "call_1", "type": "function", "function": {"name": "run", "arguments": "{}"}}
USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(("body", "param"), [
    (_body({"role": 1, "content": "x"}), "messages[0].role"),
    (_body({"content": "x"}), "messages[0].role"),
    (_body(USER, "hi"), "messages[1]"),
    (_body(USER, {"role": "user", "content": 5}), "messages[1].content"),
    (_body(USER, {"role": "user", "content": {"text": "x"}}), "messages[1].content"),
    (_body({"role": "user", "content": ["x"]}), "messages[0].content[0]"),
    (_body({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": 1}]}),
     "messages[0].content[1].text"),
    (_body({"role": "user", "content": [{"type": "text"}]}), "messages[0].content[0].text"),
    (_body({"role": "user", "content": [{"type": "image_url", "text": None}]}),
     "messages[0].content[0].text"),
    (_body({"role": "user", "content": [{"type": ["text"], "text": "a"}]}), "messages[0].content[0].type"),
    (_body(USER, {"role": "assistant", "tool_calls": {}}), "messages[1].tool_calls"),
    (_body(USER, {"role": "assistant", "tool_calls": ["call_1"]}), "messages[1].tool_calls[0]"),
    (_body(USER, {"role": "assistant", "tool_calls": [CALL, {**CALL, "id": 7}]}),
     "messages[1].tool_calls[1].id"),
    (_body(USER, {"role": "assistant", "tool_calls": [{**CALL, "id": None}]}),
     "messages[1].tool_calls[0].id"),
    (_body(USER, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}),
     "messages[1].tool_calls[0].function"),
    (_body(USER, {"role": "assistant", "tool_calls": [{**CALL, "function": "run"}]}),
     "messages[1].tool_calls[0].function"),
    (_body(USER, {"role": "assistant", "tool_calls": [{**CALL, "function": {"arguments": "{}"}}]}),
     "messages[1].tool_calls[0].function.name"),
    (_body(USER, USER, USER, {"role": "assistant", "tool_calls": [
        {**CALL, "function": {"name": "run", "arguments": {"path": "a"}}}]}),
     "messages[3].tool_calls[0].function.arguments"),
    (_body(USER, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "content": "out"}),
     "messages[2].tool_call_id"),
    (_body(USER, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": ["call_1"],
                                                            "content": "out"}),
     "messages[2].tool_call_id"),
    (_body({"role": "user", "content": "x", "name": {"first": "a"}}), "messages[0].name"),
    (_body(tools={}), "tools"),
    (_body(tools=["run"]), "tools[0]"),
    (_body(model=4), "model"),
    (_body(model=["gpt-4o"]), "model"),
    (_body(stream="true"), "stream"),
    (_body(stream=1), "stream"),
    (_body(metadata="session"), "metadata"),
    (_body(metadata=[]), "metadata"),
    ({"model": "gpt-4o"}, "messages"),
    ({"model": "gpt-4o", "messages": []}, "messages"),
    ({"model": "gpt-4o", "messages": {"role": "user"}}, "messages"),
])
def test_each_shape_is_a_400_naming_its_field(body, param):
    error = _error(body)
    assert error.param == param
    assert param in error.message or param == "messages"
    assert orjson.loads(error.body_bytes())["error"]["param"] == param


def test_messages_like_openai_type_errors():
    error = _error(_body(USER, {"role": "assistant", "tool_calls": [
        {**CALL, "function": {"name": "run", "arguments": {"a": 1}}}]}))
    assert error.message == ("Invalid type for 'messages[1].tool_calls[0].function.arguments': expected a "
                             "string, but got an object instead.")
    assert error.code == "invalid_message"
    assert _error(_body(model=1)).code == "invalid_type"
    assert _error(_body(tools=[1])).code == "invalid_tools"


@pytest.mark.parametrize("body", [
    _body({"role": "user", "content": None}),
    _body({"role": "user", "content": []}),
    _body({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}},
                                       {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
                                       {"type": "some_future_part", "payload": [1, {"x": None}]},
                                       {"type": "text", "text": "a",
                                        "cache_control": {"type": "ephemeral"}}]}),
    _body({"role": "developer", "content": "x"}, {"role": "some_future_role", "content": "x", "extra": [1]}),
    _body(USER, {"role": "assistant", "content": None, "tool_calls": None}),
    _body(USER, {"role": "assistant", "content": None, "tool_calls": []}),
    _body(USER, {"role": "assistant", "content": None, "refusal": None, "audio": {"id": "a"},
                 "tool_calls": [CALL, {"id": "c2", "type": "custom", "custom": {"name": "x", "input": "y"}}]},
          {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "ok"}]}),
    _body(USER, {"role": "function", "name": "legacy", "content": "x"}),
    _body(model=None, stream=None, metadata=None, tools=None, user=None),
    _body(stream=True, metadata={"session_id": "s"}, tools=[{"type": "function", "function": {"name": "f"}}],
          response_format={"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
          future_field={"anything": [1, 2.5, "x", None, True]}, max_tokens=2**63, temperature=1e308),
    _body({"role": "user", "content": "東京 🚀 café \u0000 \u2028"}),
])
def test_valid_and_unknown_shapes_pass(body):
    assert parse_chat_request(orjson.dumps(body)) == body


@pytest.mark.parametrize("raw", [
    b"", b"{not json", b"[1, 2]", b'"messages"', b"null", b"\xff\xfe{}", b'{"messages": NaN}',
    b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "t": Infinity}',
    b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "n": 1e400}',
    b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "n": 1' + b"0" * 400 + b"}",
    b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "n": 1' + b"0" * 5000 + b"}",
    b"\xef\xbb\xbf{}",
])
def test_not_json_is_invalid_json(raw):
    assert _error(raw).code == "invalid_json"


@pytest.mark.parametrize("depth", [MAX_DEPTH, 300, 950, 1100, 100_000])
def test_deep_nesting_is_a_400_at_any_depth(depth):
    deep = b"[" * depth + b"]" * depth
    raw = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "extra": ' + deep + b"}"
    error = _error(raw)
    assert error.code in ("nesting_too_deep", "invalid_json")
    if depth < 1000:
        assert error.param == "extra"


def test_nesting_past_orjsons_limit_is_refused_without_the_recursive_parse(monkeypatch):
    """The stdlib's parser recurses once a level: at ~1,000 levels a finalizer the garbage collector runs
    down there cannot run (an "exception ignored" at best). orjson's own depth error settles it."""
    from proxy import validate

    monkeypatch.setattr(validate.json, "loads", lambda *a, **k: pytest.fail("the recursive parse ran"))
    deep = b"[" * 5000 + b"]" * 5000
    raw = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "extra": ' + deep + b"}"
    error = _error(raw)
    assert error.code == "invalid_json" and "nested too deeply" in str(error)


def test_a_deep_body_orjson_refuses_for_another_mistake_is_not_parsed_recursively(monkeypatch):
    """900 levels, then a mistake orjson stops at before its own depth limit: the stdlib would recurse
    ~900 frames, where a finalizer the garbage collector runs fails ("exception ignored"; a fuzz case
    did). Refused as too deep without it."""
    from proxy import validate

    monkeypatch.setattr(validate.json, "loads", lambda *a, **k: pytest.fail("the recursive parse ran"))
    raw = b'{"model": "gpt-4o", "messages": [], "extra": ' + b"[" * 900 + b"x" + b"]" * 900 + b"}"
    error = _error(raw)
    assert error.code == "invalid_json" and "nested too deeply" in str(error)


@pytest.mark.parametrize(("field", "wrap", "param"), [
    ("content", lambda d: [{"type": "x", "data": d}], "messages[0].content[0].data"),
    ("extra", lambda d: d, "messages[0].extra"),
    ("tool_calls", lambda d: [{**CALL, "meta": d}], "messages[0].tool_calls[0].meta"),
    ("tool_calls", lambda d: [{**CALL, "function": {**CALL["function"], "x": d}}],
     "messages[0].tool_calls[0].function.x"),
    ("tool_call_id", lambda d: d, "messages[0].tool_call_id"),
])
def test_nesting_inside_messages_names_the_field(field, wrap, param):
    deep: Any = []
    for _ in range(MAX_DEPTH):
        deep = [deep]
    message = {"role": "assistant", "content": "x", field: wrap(deep)}
    assert _error(_body(message)).param == param


def test_nesting_up_to_the_limit_passes_and_reserializes():
    body = _body()
    for _ in range(MAX_DEPTH - 2):  # the body is level 1, "extra" starts at level 2
        body = {"model": "gpt-4o", "messages": body["messages"], "extra": body.get("extra", [])}
        body["extra"] = [body["extra"]]
    parsed = parse_chat_request(orjson.dumps(body))
    assert orjson.loads(orjson.dumps(parsed)) == body


@pytest.mark.parametrize(("raw", "param"), [
    (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages[0].content"),
    (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "\\udc00"}]}', "messages[0].content"),
    (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}]}',
     "messages[0].content[0].text"),
    (b'{"model": "gpt-\\udfff", "messages": [{"role": "user", "content": "x"}]}', "model"),
    (b'{"system": "\\ud800", "messages": [{"role": "user", "content": "x"}]}', "system"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", '
     b'"function": {"name": "f", "description": "\\ud800"}}]}', "tools[0].function.description"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x", "\\ud800": 1}]}', "messages[0]"),
    # UTF-8-encoded surrogates (CESU-8) are lone surrogates too
    (b'{"model": "m", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}', "messages[0].content"),
])
def test_lone_surrogates_are_a_400_naming_the_field(raw, param):
    error = _error(raw)
    assert error.code == "invalid_unicode" and error.param == param


def test_escaped_surrogate_pairs_are_fine():
    body = parse_chat_request(b'{"model": "m", "messages": [{"role": "user", "content": "\\ud83d\\ude80"}]}')
    assert body["messages"][0]["content"] == "🚀"


def test_integers_beyond_64_bits_parse_and_can_be_serialized_again():
    for digits in (20, 30, 300):
        raw = (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": 1'
               + b"0" * digits + b"}")
        body = parse_chat_request(raw)
        assert body["seed"] == float(10**digits)
        orjson.dumps(body)
    # the stdlib path (taken because of the surrogate) gives the same numbers as orjson
    raw = b'{"model": "\\ud800", "messages": [{"role": "user", "content": "x"}], "seed": 1' + b"0" * 30 + b"}"
    assert _error(raw).param == "model"


def test_validation_costs_well_under_a_millisecond_per_100_messages():
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys " * 500}]
    for i in range(100):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "read", "arguments": '{"p": 1}'}}
        messages += [{"role": "user", "content": f"step {i} " * 50},
                     {"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{i}", "content": "line\n" * 4000},
                     {"role": "assistant", "content": [{"type": "text", "text": "done"}]}]
    raw = orjson.dumps(_body(*messages))
    assert len(raw) > 2_000_000
    parse_best = validate_best = float("inf")
    for _ in range(20):
        started = time.perf_counter()
        orjson.loads(raw)
        parsed = time.perf_counter()
        parse_chat_request(raw)
        done = time.perf_counter()
        parse_best = min(parse_best, parsed - started)
        validate_best = min(validate_best, (done - parsed) - (parsed - started))
    per_100 = validate_best / (len(messages) / 100)
    assert per_100 < 0.0005, f"{per_100 * 1e6:.0f} us per 100 messages beyond the parse"


def test_a_resent_history_is_checked_past_what_was_checked_before():
    """A large body is parsed past the messages an earlier body had (wire/resent.py): a mistake in a new
    message, or in an earlier one the client changed, is still a 400 naming it; a lone surrogate or a
    huge integer in the new part still takes the full parser's path."""
    big = {"role": "user", "content": "x" * 70_000}
    first = _body(big, {"role": "assistant", "content": "ok"})
    assert parse_chat_request(orjson.dumps(first)) == first
    assert _error(_body(big, {"role": "assistant", "content": "ok"}, {"role": 5})).param == "messages[2].role"
    assert _error(_body(big, {"role": "assistant", "content": 7})).param == "messages[1].content"
    grown = _body(big, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"})
    assert parse_chat_request(orjson.dumps(grown)) == grown
    raw = orjson.dumps(grown)[:-len(b"]}")] + b',{"role":"user","content":"\\ud800"}]}'
    assert _error(raw).param == "messages[3].content"
    huge = orjson.dumps(grown)[:-len(b"]}")] \
        + b',{"role":"user","content":"n","n":123456789012345678901234}]}'
    assert parse_chat_request(huge)["messages"][3]["n"] == 123456789012345678901234.0


def test_a_resent_body_checks_keys_after_the_messages_unless_they_are_the_bytes_checked_before(monkeypatch):
    """OpenAI's SDKs send `tools` after `messages`: resent with the same bytes they are the objects checked
    then (not walked again); with other bytes they are checked, too deep a nesting a 400 as ever."""
    from proxy import validate
    from proxy.wire import resent

    resent.BODIES.clear()  # (process-wide)
    history = [{"role": "user", "content": f"step {n} " + "x" * 200} for n in range(40)]  # (over 8 KB)
    tools = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]
    first = parse_chat_request(orjson.dumps({"messages": history, "model": "gpt-4o", "tools": tools}))
    walked: list[str] = []
    real = validate._check_depth
    monkeypatch.setattr(validate, "_check_depth",
                        lambda value, depth, at: walked.append(at) or real(value, depth, at))
    history.append({"role": "assistant", "content": "done"})
    again = parse_chat_request(orjson.dumps({"messages": history, "model": "gpt-4o", "tools": tools}))
    assert again["tools"] is first["tools"] and "tools" not in walked
    deep: Any = {"type": "object"}
    for _ in range(MAX_DEPTH):
        deep = {"properties": deep}
    changed = [{"type": "function", "function": {"name": "run", "parameters": deep}}]
    error = _error(orjson.dumps({"messages": history, "model": "gpt-4o", "tools": changed}))
    assert error.code == "nesting_too_deep" and error.param.startswith("tools")

"""Internal and client tool calls in one assistant turn (parallel tool calls).

The proxy answers its own calls, the client gets the turn with only its calls, and later requests put
the internal calls and their results back (splices), so the model always sees what it produced.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types.chat import ChatCompletionMessage

from proxy.archive import TableRow
from proxy.layers import splices
from proxy.state import StateStore
from tests.servers import Step, stream_chunks
from tests.test_rounds import BIG, TOOLS, history, internal_call

CLIENT = {"id": "call_x", "type": "function",
          "function": {"name": "read_file", "arguments": '{"path": "b"}'}}
CLIENT_2 = {"id": "call_y", "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "c"}'}}


def recall_call(call_id: str = "int_2") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "recall", "arguments": '{"query": "x"}'}}


def echoed(message) -> dict:
    """The assistant turn as an agent sends it back: its content and the calls it got."""
    return {"role": "assistant", "content": message.content,
            "tool_calls": [{"id": c.id, "type": "function",
                            "function": {"name": c.function.name, "arguments": c.function.arguments}}
                           for c in message.tool_calls]}


def client_results(message) -> list[dict]:
    return [{"role": "tool", "tool_call_id": c.id, "content": f"contents of {c.id}"}
            for c in message.tool_calls]


def streamed_message(chunks) -> ChatCompletionMessage:
    """The assistant message an agent folds a stream into (calls whole: the proxy sends them whole)."""
    calls = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    return ChatCompletionMessage(
        role="assistant", content="".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
        tool_calls=[{"id": c.id, "type": "function", "function": c.function.model_dump()} for c in calls])


def forwarded_turn(messages: list[dict], client_ids: list[str]) -> tuple[int, dict]:
    for index, message in enumerate(messages):
        calls = message.get("tool_calls") or []
        if message.get("role") == "assistant" and any(c["id"] in client_ids for c in calls):
            return index, message
    raise AssertionError("the turn is not in the forwarded history")


# ------------------------------------------------------------------------------------- end to end

@pytest.mark.parametrize("stream", [False, True])
def test_client_sees_only_its_calls_and_the_next_request_gets_the_whole_turn(proxy, fake_upstream, stream):
    if stream:
        fake_upstream.then(Step(kind="stream", chunks=stream_chunks(["Reading both. "],
                                                                    tool_calls=[internal_call(), CLIENT])))
    else:
        fake_upstream.then(Step(content="Reading both. ", tool_calls=[internal_call(), CLIENT]))
    client = proxy.client()
    if stream:
        chunks = list(client.chat.completions.create(model="gpt-4o", messages=history(), tools=TOOLS,
                                                     stream=True))
        deltas = [c.choices[0].delta.tool_calls for c in chunks
                  if c.choices and c.choices[0].delta.tool_calls]
        assert [(d[0].index, d[0].id) for d in deltas] == [(0, "call_x")]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        message = streamed_message(chunks)
    else:
        answer = client.chat.completions.create(model="gpt-4o", messages=history(), tools=TOOLS)
        assert answer.choices[0].finish_reason == "tool_calls"
        message = answer.choices[0].message
    assert [(c.id, c.function.arguments) for c in message.tool_calls] == [("call_x", '{"path": "b"}')]
    assert message.content == "Reading both. "
    assert len(fake_upstream.chat_requests) == 1  # the model waits for the client's result: no new round

    fake_upstream.then(Step(content="Both read."))
    follow_up = [*history(), echoed(message), *client_results(message)]
    client.chat.completions.create(model="gpt-4o", messages=follow_up, tools=TOOLS)
    forwarded = fake_upstream.chat_requests[1].json()["messages"]
    index, turn = forwarded_turn(forwarded, ["call_x"])
    assert [c["id"] for c in turn["tool_calls"]] == ["int_1", "call_x"]  # where the model put them
    assert turn["tool_calls"][0] == internal_call()
    assert forwarded[index + 1] == {"role": "tool", "tool_call_id": "int_1", "content": BIG}
    assert forwarded[index + 2] == {"role": "tool", "tool_call_id": "call_x", "content": "contents of call_x"}
    assert len(forwarded) == index + 3

    # Sticky: a later request forwards the same bytes for that part of the history.
    fake_upstream.then(Step(content="ok"))
    later = [*follow_up, {"role": "assistant", "content": "Both read."}, {"role": "user", "content": "next"}]
    client.chat.completions.create(model="gpt-4o", messages=later, tools=TOOLS)
    again = fake_upstream.chat_requests[2].json()["messages"]
    assert orjson.dumps(again[:index + 3]) == orjson.dumps(forwarded)


def test_positions_are_kept_with_several_calls_of_each_kind(proxy, fake_upstream):
    turn = [CLIENT, internal_call(), CLIENT_2, recall_call()]
    fake_upstream.then(Step(tool_calls=turn), Step(content="fine"))
    client = proxy.client()
    message = client.chat.completions.create(model="gpt-4o", messages=history(),
                                             tools=TOOLS).choices[0].message
    assert [c.id for c in message.tool_calls] == ["call_x", "call_y"]
    client.chat.completions.create(model="gpt-4o", tools=TOOLS,
                                   messages=[*history(), echoed(message), *client_results(message)])
    forwarded = fake_upstream.chat_requests[1].json()["messages"]
    index, spliced = forwarded_turn(forwarded, ["call_x"])
    assert [c["id"] for c in spliced["tool_calls"]] == ["call_x", "int_1", "call_y", "int_2"]
    assert [m["tool_call_id"] for m in forwarded[index + 1:]] == ["int_1", "int_2", "call_x", "call_y"]
    assert forwarded[index + 2]["content"].startswith("recall 'x'")


def test_an_edited_turn_is_forwarded_as_the_client_sent_it(proxy, fake_upstream):
    fake_upstream.then(Step(tool_calls=[internal_call(), CLIENT]), Step(content="ok"))
    client = proxy.client()
    message = client.chat.completions.create(model="gpt-4o", messages=history(),
                                             tools=TOOLS).choices[0].message
    edited = echoed(message)
    edited["tool_calls"][0]["function"]["arguments"] = '{"path": "other"}'
    client.chat.completions.create(model="gpt-4o", tools=TOOLS,
                                   messages=[*history(), edited, *client_results(message)])
    forwarded = fake_upstream.chat_requests[1].json()["messages"]
    _, turn = forwarded_turn(forwarded, ["call_x"])
    assert [c["id"] for c in turn["tool_calls"]] == ["call_x"]
    assert not any(m.get("tool_call_id") == "int_1" for m in forwarded)


def test_splices_survive_a_restart(make_proxy, fake_upstream):
    proxy = make_proxy()
    fake_upstream.then(Step(tool_calls=[CLIENT, internal_call()]))
    message = proxy.client().chat.completions.create(
        model="gpt-4o", messages=history(), tools=TOOLS).choices[0].message
    proxy.server.__exit__()  # the archive is flushed and closed on shutdown

    restarted = make_proxy()
    fake_upstream.then(Step(content="ok"))
    follow_up = [*history(), echoed(message), *client_results(message)]
    restarted.client().chat.completions.create(model="gpt-4o", tools=TOOLS, messages=follow_up)
    forwarded = fake_upstream.chat_requests[-1].json()["messages"]
    index, turn = forwarded_turn(forwarded, ["call_x"])
    assert [c["id"] for c in turn["tool_calls"]] == ["call_x", "int_1"]
    assert forwarded[index + 1] == {"role": "tool", "tool_call_id": "int_1", "content": BIG}


def test_the_archive_keeps_the_model_turn_whole(proxy, fake_upstream):
    fake_upstream.then(Step(tool_calls=[internal_call(), CLIENT]))
    proxy.client().chat.completions.create(model="gpt-4o", messages=history(), tools=TOOLS)
    proxy.flush()
    rows = list(proxy.query("select status, error, finish_reason from exchanges"))
    assert rows == [{"status": 200, "error": None, "finish_reason": "tool_calls"}]


# --------------------------------------------------------------------------------------- unit level

BASE = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]


def call(call_id: str, name: str = "read_file", arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": f"result of {call_id}"}


def turn_of(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def splice_of(model_calls: list[dict[str, Any]]) -> splices.Splice:
    positions = [i for i, c in enumerate(model_calls) if c["function"]["name"] == "read_tool_result"]
    made = splices.make(model_calls, positions, [result(model_calls[i]["id"]) for i in positions])
    assert made is not None
    return made


def by_key(*made: splices.Splice) -> dict:
    return {s.key: s for s in made}


@pytest.mark.parametrize("order", [
    ["i1", "c1"], ["c1", "i1"], ["c1", "i1", "c2"], ["i1", "c1", "i2", "c2"], ["c1", "c2", "i1", "i2"],
    ["i1", "i2", "c1"],
])
def test_positions_are_kept(order):
    model_calls = [call(n, "read_tool_result" if n.startswith("i") else "read_file") for n in order]
    made = splice_of(model_calls)
    client_turn = turn_of(*[c for c in model_calls if c["id"].startswith("c")])
    history_ = [*BASE, client_turn, *[result(c["id"]) for c in client_turn["tool_calls"]]]
    restored = splices.restore(history_, by_key(made))
    assert restored[2]["tool_calls"] == model_calls
    internal_ids = [n for n in order if n.startswith("i")]
    client_ids = [n for n in order if n.startswith("c")]
    assert [m["tool_call_id"] for m in restored[3:]] == internal_ids + client_ids
    assert history_[2] == client_turn and len(history_) == 3 + len(client_ids)  # the input is untouched
    assert splices.restore(restored, by_key(made)) is restored  # applied once, never twice


def test_several_splices_in_one_history():
    first = splice_of([call("i1", "read_tool_result"), call("c1")])
    second = splice_of([call("c2"), call("c3"), call("i2", "read_tool_result")])
    history_ = [*BASE, turn_of(call("c1")), result("c1"), {"role": "assistant", "content": "next"},
                {"role": "user", "content": "go on"}, turn_of(call("c2"), call("c3")), result("c2"),
                result("c3")]
    restored = splices.restore(history_, by_key(first, second))
    assert [m.get("tool_call_id") or m["role"] for m in restored] == [
        "system", "user", "assistant", "i1", "c1", "assistant", "user", "assistant", "i2", "c2", "c3"]
    assert [c["id"] for c in restored[7]["tool_calls"]] == ["c2", "c3", "i2"]


@pytest.mark.parametrize("edit", ["arguments", "dropped call", "added call", "removed turn", "ids reordered",
                                  "garbage calls", "not a list"])
def test_an_edited_or_removed_turn_is_left_alone(edit):
    made = splice_of([call("i1", "read_tool_result"), call("c1"), call("c2")])
    turn = turn_of(call("c1"), call("c2"))
    if edit == "arguments":
        turn["tool_calls"][1] = call("c2", arguments='{"x": 1}')
    elif edit == "dropped call":
        turn["tool_calls"].pop()
    elif edit == "added call":
        turn["tool_calls"].append(call("c3"))
    elif edit == "ids reordered":
        turn["tool_calls"].reverse()
    elif edit == "garbage calls":
        turn["tool_calls"] = [None, 5, {"id": ["c1"]}, {"function": "x"}]
    elif edit == "not a list":
        turn["tool_calls"] = {"c1": 1}
    history_ = [*BASE] if edit == "removed turn" else [*BASE, turn, result("c1"), result("c2")]
    assert splices.restore(history_, by_key(made)) is history_


def test_restart_reloads_splices_from_the_archive():
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}

    class Archive:
        def persist(self, row: TableRow) -> None:
            if row.table == "session_memory":
                rows[(row.row["tenant"], row.row["session_id"], row.row["kind"])] = row.row

        def tool_result_rows(self, tenant: str, session_id: str) -> list:
            return []

        def tool_result_by_handle(self, tenant: str, handle: str) -> None:
            return None

        def session_window(self, tenant: str, session_id: str) -> None:
            return None

        def session_memory(self, tenant: str, session_id: str, kind: str) -> dict | None:
            return rows.get((tenant, session_id, kind))

    archive = Archive()
    store = StateStore(persist=archive.persist, lookup=archive)
    made = splice_of([call("c1"), call("i1", "read_tool_result")])
    splices.remember(store, "t", "s", made)
    history_ = [*BASE, turn_of(call("c1")), result("c1")]
    before = splices.restore(history_, store.get("t", "s").splices)

    reloaded = StateStore(persist=archive.persist, lookup=archive).get("t", "s")
    assert reloaded.splices == {made.key: made}
    assert orjson.dumps(splices.restore(history_, reloaded.splices)) == orjson.dumps(before)
    assert StateStore(persist=archive.persist, lookup=archive).get("t", "other").splices == {}


def test_unreadable_saved_splices_are_dropped():
    assert splices.loads("{not json") == {}
    assert splices.loads('{"version": 1, "splices": [{"client": 5}]}') == {}


def test_a_turn_without_identifiable_client_calls_makes_no_splice():
    assert splices.make([call("i1", "read_tool_result"), {"type": "function", "function": {}}], [0],
                        [result("i1")]) is None
    assert splices.make([call("c1")], [], []) is None

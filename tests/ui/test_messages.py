"""Marking what the client sent against what went upstream (proxy/ui/messages.py)."""

from __future__ import annotations

from proxy.layers.observations import handle_for
from proxy.layers.tool_results import placeholder_text, summary_text
from proxy.ui.messages import align


def call(call_id: str, name: str = "bash") -> dict:
    function = {"name": name, "arguments": "{}"}
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": function}]}


def result(call_id: str, text: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


SYSTEM, TASK = {"role": "system", "content": "agent"}, {"role": "user", "content": "do it"}
BLOCK = {"role": "system", "content": "[ctxproxy auto-summary: 1 earlier exchange left]"}


def test_kept_replaced_evicted_injected_and_internal():
    sent = [SYSTEM, TASK, call("c1"), result("c1", "old output"), {"role": "user", "content": "next"},
            call("c2"), result("c2", "x\n" * 500), call("c3"), result("c3", "y\n" * 50)]
    summary = result("c2", summary_text("c2", "bash", "x\n" * 500, 1000, body="a summary"))
    masked = result("c3", placeholder_text("c3", "y\n" * 50, 100))
    forwarded = [SYSTEM, TASK, BLOCK, call("c2"), summary, call("c3"), masked,
                 call("int_1", "read_tool_result"), result("int_1", "x\n" * 500)]
    sent_marks, forwarded_marks = align(sent, forwarded)
    assert [m.kind for m in sent_marks] == ["kept", "kept", "evicted", "evicted", "evicted", "kept",
                                            "replaced", "kept", "replaced"]
    assert [m.kind for m in forwarded_marks] == ["kept", "kept", "injected", "kept", "summary", "kept",
                                                 "masked", "internal", "internal"]
    assert (forwarded_marks[4].handle, forwarded_marks[6].handle) == ("c2", "c3")
    assert sent_marks[6].other == 4 and forwarded_marks[4].other == 6


def test_a_reused_call_id_and_an_observation_pair_with_their_own_originals():
    observation = "$ make\n" + "compiling\n" * 300
    sent = [SYSTEM, TASK, call("c1"), result("c1", "first"), call("c1"), result("c1", "second\n" * 200),
            {"role": "user", "content": observation}]
    handle = handle_for(observation)
    forwarded = [SYSTEM, TASK, call("c1"), result("c1", "first"), call("c1"),
                 result("c1", summary_text("c1#2", "bash", "second\n" * 200, 900, body="s")),
                 {"role": "user", "content": summary_text(handle, None, observation, 900, body="s")}]
    sent_marks, forwarded_marks = align(sent, forwarded)
    assert [m.kind for m in sent_marks] == ["kept"] * 5 + ["replaced", "replaced"]
    assert forwarded_marks[5].handle == "c1#2" and forwarded_marks[6].handle == handle


def test_a_message_the_proxy_rewrote_otherwise_is_not_taken_for_an_eviction():
    a, b = {"role": "user", "content": "a"}, {"role": "user", "content": "b"}
    sent = [SYSTEM, TASK, a, b]
    forwarded = [SYSTEM, TASK, {"role": "user", "content": "a (normalized)"}, b]
    sent_marks, forwarded_marks = align(sent, forwarded)
    assert [m.kind for m in forwarded_marks] == ["kept", "kept", "rewritten", "kept"]
    assert [m.kind for m in sent_marks] == ["kept", "kept", "rewritten", "kept"]
    assert sent_marks[2].other == 2
    # A rewritten message of another role, or one sent on unchanged later, pairs with nothing.
    _, marks = align([SYSTEM, TASK, a], [SYSTEM, TASK, {"role": "assistant", "content": "?"}, a])
    assert [m.kind for m in marks] == ["kept", "kept", "rewritten", "kept"] and marks[2].other is None

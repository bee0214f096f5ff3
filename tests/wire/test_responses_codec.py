"""Responses codec details the e2e tests reach only by chance."""

from __future__ import annotations

from proxy.wire.responses import drop_dangling_reasoning

R1 = {"type": "reasoning", "id": "rs_1", "encrypted_content": "A"}
R2 = {"type": "reasoning", "id": "rs_2", "encrypted_content": "B"}
USER = {"type": "message", "role": "user", "content": "x"}
ANSWER = {"type": "message", "role": "assistant", "content": "y"}
CALL = {"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{}"}


def test_a_reasoning_item_goes_when_nothing_it_led_to_stays():
    assert drop_dangling_reasoning([R1, R2, USER]) == [USER]  # both: the second's removal strands the first
    assert drop_dangling_reasoning([R1, CALL, USER]) == [R1, CALL, USER]
    assert drop_dangling_reasoning([R1, R2, ANSWER]) == [R1, R2, ANSWER]
    assert drop_dangling_reasoning([USER, R1]) == [USER]

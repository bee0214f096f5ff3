"""NUL characters through the real server, on each archive backend. PostgreSQL `text` cannot hold NUL
(SQLite can), yet every original must read back byte for byte: a summarized tool result, an evicted one,
a pin and an upstream error's text holding NUL are archived (never set aside as rejected rows) and come
back exactly, also to a restarted proxy that has only the database to go on."""

from __future__ import annotations

import httpx
import orjson

from proxy.store.postgres import NUL_MARK
from tests.conftest import BOTH_BACKENDS
from tests.servers import Seen, Step
from tests.test_window_e2e import WINDOW_POLICY, history_with_secret

pytestmark = BOTH_BACKENDS

# ~6k tokens (summarized at the default 2,000), NUL inside lines and at the very end, and a line that
# starts with the marker of the PostgreSQL encoding (tests/test_archive_durability.py has whole cells
# that begin with it and hold no NUL).
LOG = "\n".join(f"line {i}: value={i * 7}\x00 path=src/mod_{i % 13}.py" for i in range(500)) \
    + f"\n{NUL_MARK}\"not encoded\"\n\x00"
PIN = "Never print the \x00 byte; use \\0 instead."
SESSION = {"x-ctxproxy-session": "nul-1"}
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


def read_back(call_id: str) -> dict:
    return {"id": "int_1", "type": "function", "function": {
        "name": "read_tool_result", "arguments": orjson.dumps({"call_id": call_id}).decode()}}


def answered_with(expected: str):
    """A second round that checks the proxy answered the model's read_tool_result with `expected`."""
    def second_round(seen: Seen) -> Step:
        answer = seen.json()["messages"][-1]
        assert answer["role"] == "tool" and answer["tool_call_id"] == "int_1"
        assert answer["content"] == expected
        return Step(content="read it")
    return second_round


def test_a_summarized_result_a_pin_and_an_error_with_nul_read_back_exactly(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "nul.yaml").write_text("commands:\n  pins: project\n")
    client = proxy.client(api_key="key-nul", base_url=f"{proxy.url}/p/nul/v1")
    pinned = client.chat.completions.create(model="gpt-4o",
                                            messages=[{"role": "user", "content": f"/pin {PIN}"}])
    assert pinned.choices[0].message.content.startswith("Pinned as pin-")
    history = [{"role": "system", "content": "You are a coding agent."},
               {"role": "user", "content": "Summarize the log."},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_nul", "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "nul.log"}'}}]},
               {"role": "tool", "tool_call_id": "call_nul", "content": LOG}]
    fake_upstream.then(Step(content="ok"))
    client.chat.completions.create(model="gpt-4o", messages=history, tools=TOOLS, extra_headers=SESSION)
    forwarded = fake_upstream.chat_requests[-1].json()["messages"]
    assert 'read_tool_result(call_id="call_nul")' in forwarded[-1]["content"]  # summarized
    assert PIN in forwarded[1]["content"]
    fake_upstream.then(Step(kind="error", status=503, body=b'overloaded\x00 "retry"'))
    failed = httpx.post(f"{proxy.url}/p/nul/v1/chat/completions", headers={"authorization": "Bearer key-nul"},
                        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "again"}]})
    assert failed.status_code == 503
    proxy.flush()
    [error] = proxy.query("select error from exchanges where status = 503")
    assert error["error"] == 'overloaded\x00 "retry"'
    [stored] = proxy.query("select tenant, content from tool_results where handle = 'call_nul'")
    assert stored["content"] == LOG
    assert proxy.reader().tool_result_by_handle(stored["tenant"], "call_nul")["content"] == LOG
    assert proxy.reader().tool_result_rows(stored["tenant"], "nul-1")[0]["content"] == LOG
    assert [p.content for p in proxy.state.pins.list("nul")] == [PIN]
    proxy.server.__exit__()  # flushed and closed

    restarted = make_proxy()  # knows only what the database holds
    fake_upstream.then(Step(tool_calls=[read_back("call_nul")]), answered_with(LOG))
    again = restarted.client(api_key="key-nul", base_url=f"{restarted.url}/p/nul/v1")
    reply = again.chat.completions.create(model="gpt-4o", tools=TOOLS, extra_headers=SESSION, messages=[
        *history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "Read it whole."}])
    assert reply.choices[0].message.content == "read it"
    assert PIN in fake_upstream.chat_requests[-1].json()["messages"][1]["content"]
    assert [p.content for p in restarted.state.pins.list("nul")] == [PIN]


def test_an_evicted_result_with_nul_reads_back_exactly_after_a_restart(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "w16k.yaml").write_text(WINDOW_POLICY)
    original = "HOME=/root\x00\nKEY=KX-7731-ALPHA\x00\x00\nPATH=/bin"
    messages = history_with_secret()
    messages[3]["content"] = original  # call_cfg's output
    headers = {"authorization": "Bearer key-1", "x-ctxproxy-session": "long-1"}
    with httpx.Client(timeout=30) as http:
        for end in range(8, len(messages) + 1, 4):  # the agent's requests as the session grew
            assert http.post(f"{proxy.url}/p/w16k/v1/chat/completions", headers=headers,
                             json={"model": "gpt-4o", "messages": messages[:end]}).status_code == 200
    last = fake_upstream.chat_requests[-1].json()["messages"]
    assert not any(m.get("tool_call_id") == "call_cfg" for m in last), "call_cfg should have left"
    proxy.server.__exit__()

    restarted = make_proxy()
    fake_upstream.then(Step(tool_calls=[read_back("call_cfg")]), answered_with(original))
    reply = httpx.post(f"{restarted.url}/p/w16k/v1/chat/completions", headers=headers, timeout=30, json={
        "model": "gpt-4o", "messages": [*messages, {"role": "user", "content": "Show call_cfg again."}]})
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "read it"

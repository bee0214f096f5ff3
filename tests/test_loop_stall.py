"""The event loop never waits on input-sized or disk work: while one request is stuck in the pipeline
(or a recall is stuck in the archive), /healthz and other tenants are still answered.

The stuck work is held on a threading.Event inside the server process. Had it run on the event loop,
the loop itself would be held and the probes below would time out instead of being answered.
"""

from __future__ import annotations

import asyncio
import math
import socket
import threading

import httpx
import orjson
import pytest

from proxy import pipeline
from proxy.state import WouldBlock

TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]


def probe_while_held(proxy, release: threading.Event) -> None:
    """/healthz and a new session of another tenant answer while the other request is held."""
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        assert client.get("/healthz").status_code == 200
        other = client.post("/v1/chat/completions", headers={"authorization": "Bearer sk-other-tenant"},
                            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "ping"}]})
        assert other.status_code == 200
    release.set()


def test_pipeline_runs_off_the_event_loop(proxy, fake_upstream, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    real_run = pipeline.run

    def held_run(conversation, context):
        if context.tenant != "anonymous" and "big" in str(conversation.messages[-1].get("content"))[:10]:
            entered.set()
            assert release.wait(20), "the probes never came through"
        return real_run(conversation, context)

    monkeypatch.setattr(pipeline, "run", held_run)
    # A 20 MB tool result: parsing, counting and summarizing it is input-sized work.
    big = "\n".join(f"2026-11-22 12:00:{i % 60:02d} INFO worker-{i % 7} processed item {i}"
                    for i in range(400_000))
    body = {"model": "gpt-4o", "tools": TOOLS, "messages": [
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_big", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_big", "content": big},
        {"role": "user", "content": "big: what failed?"}]}
    result: dict = {}

    def send() -> None:
        with httpx.Client(timeout=120) as client:
            result["response"] = client.post(f"{proxy.url}/v1/chat/completions", content=orjson.dumps(body),
                                             headers={"authorization": "Bearer sk-big-tenant",
                                                      "content-type": "application/json"})

    sender = threading.Thread(target=send)
    sender.start()
    assert entered.wait(60), "the big request never reached the pipeline"
    probe_while_held(proxy, release)
    sender.join(120)
    response = result["response"]
    assert response.status_code == 200
    forwarded = fake_upstream.chat_requests[-1].json()
    assert "call_id=call_big" in forwarded["messages"][2]["content"]  # it was summarized
    assert len(fake_upstream.chat_requests[-1].body) < len(big) / 10


def test_a_small_request_of_a_busy_session_waits_in_a_thread_not_on_the_loop(proxy, monkeypatch):
    """Small requests of a session in memory are rewritten on the event loop (no thread hop); one whose
    session is being rewritten by another request must wait for it, and that wait is in a worker thread."""
    entered, release, refused = threading.Event(), threading.Event(), threading.Event()
    real_run, real_inner = pipeline.run, pipeline._run
    runs: list[bool] = []  # the session's completed pipeline runs: True when on the event loop's thread

    def recorded_run(conversation, context):
        if context.session.id != "busy-session":
            return real_run(conversation, context)
        try:
            outcome = real_run(conversation, context)
        except WouldBlock:  # nothing done: it runs again in a thread
            refused.set()
            raise
        runs.append(asyncio._get_running_loop() is not None)
        return outcome

    def held_inner(conversation, context, state):  # inside the session's lock
        if "hold" in str(conversation.messages[-1].get("content"))[:10]:
            entered.set()
            assert release.wait(20), "the probes never came through"
        return real_inner(conversation, context, state)

    monkeypatch.setattr(pipeline, "run", recorded_run)
    monkeypatch.setattr(pipeline, "_run", held_inner)
    headers = {"authorization": "Bearer sk-busy-tenant", "x-ctxproxy-session": "busy-session"}
    first = [{"role": "user", "content": "hello"}]
    with httpx.Client(base_url=proxy.url, timeout=60, headers=headers) as client:
        for _ in range(2):  # the first builds the session's state (in a thread), the second finds it
            response = client.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": first})
            assert response.status_code == 200
    assert runs == [False, True]
    refused.clear()
    results: dict[str, httpx.Response] = {}

    def send(name: str, content: str) -> None:
        with httpx.Client(base_url=proxy.url, timeout=60, headers=headers) as client:
            results[name] = client.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": [
                *first, {"role": "assistant", "content": "hi"}, {"role": "user", "content": content}]})

    # Over INLINE_BYTES: rewritten in a thread, where it holds the session until released.
    held = threading.Thread(target=send, args=("held", "hold " + "x" * 100_000))
    held.start()
    assert entered.wait(30), "the held request never reached the pipeline"
    waiting = threading.Thread(target=send, args=("waiting", "and this one"))
    waiting.start()  # small, but its session is busy: it must wait for it off the loop
    assert refused.wait(30), "the small request never tried the event loop"
    probe_while_held(proxy, release)
    held.join(60)
    waiting.join(60)
    assert results["held"].status_code == results["waiting"].status_code == 200
    assert runs[2:] == [False, False]


def test_a_resent_history_is_rewritten_on_the_loop_only_while_clear_of_a_batch(proxy, fake_upstream,
                                                                               monkeypatch):
    """A long history resent with one more turn is rewritten on the event loop (its work is what is new)
    while the session is far from a batch; the same turn of a session a batch away goes to a thread."""
    real_run = pipeline.run
    runs: dict[str, list[bool]] = {}  # completed pipeline runs by session: True when on the loop's thread

    def recorded_run(conversation, context):
        outcome = real_run(conversation, context)  # (WouldBlock: nothing done, it runs again in a thread)
        runs.setdefault(context.session.id, []).append(asyncio._get_running_loop() is not None)
        return outcome

    monkeypatch.setattr(pipeline, "run", recorded_run)
    history: list[dict] = [{"role": "user", "content": "fix the parser"}]
    for n in range(20):  # ~80 KB: over INLINE_BYTES, and nothing in it is over the summary threshold
        call = {"id": f"call_{n}", "type": "function", "function": {"name": "run", "arguments": "{}"}}
        history += [{"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"call_{n}",
                     "content": "\n".join(f"src/m{n}/f{k}.py:{k}: ok" for k in range(180))}]
    turn = [{"role": "assistant", "content": "looking"}, {"role": "user", "content": "go on"}]

    def send(client: httpx.Client, path: str, session: str, messages: list[dict]) -> httpx.Response:
        response = client.post(path, content=orjson.dumps({"model": "gpt-4o", "tools": TOOLS,
                                                           "messages": messages}),
                               headers={"x-ctxproxy-session": session, "content-type": "application/json"})
        assert response.status_code == 200, response.text
        return response

    with httpx.Client(base_url=proxy.url, timeout=60, headers={"authorization": "Bearer sk-loop"}) as client:
        first = send(client, "/v1/chat/completions", "far", history)
        send(client, "/v1/chat/completions", "far", history + turn)
        tokens = int(first.headers["x-ctxproxy-tokens-after"])
        # A window whose batch starts ~1,000 tokens past this history: the next turn may reach it.
        budget_tokens = math.ceil((tokens + 1_000) / 0.925)
        (proxy.policies_dir / "near.yaml").write_text(f"window:\n  max_tokens: {budget_tokens}\n")
        send(client, "/p/near/v1/chat/completions", "near", history)
        send(client, "/p/near/v1/chat/completions", "near", history + turn)
    assert runs == {"far": [False, True], "near": [False, False]}
    assert fake_upstream.chat_requests[-1].json()["messages"] == history + turn  # nothing to rewrite yet


def test_recall_runs_off_the_event_loop(make_proxy, fake_upstream, monkeypatch):
    proxy = make_proxy()
    entered, release = threading.Event(), threading.Event()
    reader_class = type(proxy.state.reader)  # ArchiveReader, or PostgresReader
    real_search = reader_class.search

    def held_search(self, query, **kwargs):
        entered.set()
        assert release.wait(20), "the probes never came through"
        return real_search(self, query, **kwargs)

    monkeypatch.setattr(reader_class, "search", held_search)
    result: dict = {}

    def send() -> None:
        with httpx.Client(timeout=60) as client:
            result["response"] = client.post(
                f"{proxy.url}/v1/chat/completions", headers={"authorization": "Bearer sk-recall-tenant"},
                json={"model": "gpt-4o", "messages": [{"role": "user", "content": "/recall some words"}]})

    sender = threading.Thread(target=send)
    sender.start()
    assert entered.wait(30)
    probe_while_held(proxy, release)
    sender.join(60)
    assert result["response"].status_code == 200


@pytest.mark.parametrize("declared", [1000])
def test_a_body_shorter_than_its_content_length_times_out_with_408(make_proxy, fake_upstream, declared):
    proxy = make_proxy({"server": {"body_timeout_s": 0.3}})
    port = int(proxy.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     + f"content-length: {declared}\r\n\r\n".encode() + b'{"model":')
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    error = orjson.loads(payload)["error"]
    assert error["code"] == "request_timeout" and "body_timeout_s" in error["message"]
    assert not fake_upstream.chat_requests

"""Two real proxy processes on one PostgreSQL archive, every request of a session on the other replica
than the one before: the provider receives exactly what one process sends for the same traffic, every
exchange is archived once, and a recall on one replica finds what was sent through the other."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import re
import signal
import sqlite3
import subprocess
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.servers import ServerThread
from tests.test_archive_durability import free_port, serve, wait_healthy

SESSIONS, TURNS = 30, 8
ACCOUNTED = ("session_id, round, status, gate, tokens_before, tokens_after, client_cached_tokens, "
             "forwarded_cached_tokens, summaries, masked, evicted_results, evictions, internal_rounds, "
             "reads, recalls")
READ_BACK, RECALL = "please read back ", "please recall "
# Headlines show when an exchange arrived ("Mon 10:32"): two runs a minute apart differ there only.
CLOCK = re.compile(rb"\b(Mon|Tue|Wed|Thu|Fri|Sat|Sun) \d\d:\d\d\b")


class Provider:
    """A deterministic provider: asks for a read-back when the last user turn says so, else answers
    with a digest of what it got. Records every body it receives, by the session its system prompt names."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[bytes]] = defaultdict(list)

    async def chat(self, request: Request) -> Response:
        raw = await request.body()
        body = orjson.loads(raw)
        messages = body["messages"]
        session = messages[0]["content"].split()[-1]
        self.bodies[session].append(CLOCK.sub(b"<time>", raw))
        last = messages[-1]
        offered = {t["function"]["name"] for t in body.get("tools") or []}
        text = last.get("content") if isinstance(last.get("content"), str) else ""
        asks = [(READ_BACK, "read_tool_result", "call_id"), (RECALL, "recall", "query")]
        wanted = [(name, {key: text.removeprefix(prefix)}) for prefix, name, key in asks
                  if last["role"] == "user" and text.startswith(prefix) and name in offered]
        if wanted:
            name, arguments = wanted[0]
            call = {"id": f"rb-{hashlib.sha1(raw).hexdigest()[:8]}", "type": "function",
                    "function": {"name": name, "arguments": orjson.dumps(arguments).decode()}}
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
        else:
            message = {"role": "assistant", "content": f"seen {hashlib.sha1(raw).hexdigest()[:12]}"}
        return Response(orjson.dumps({
            "id": "chatcmpl-x", "object": "chat.completion", "created": 1, "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}}),
            media_type="application/json")


def tool_output(session: int, turn: int) -> str:
    lines = [f"2026-11-23 line {n} session={session} turn={turn} path=src/mod_{session}_{turn}/file_{n}.py "
             f"status={'ERROR ValueError: bad value' if n % 17 == 0 else 'ok'} id=REQ-{session}-{turn}-{n}"
             for n in range(60)]
    return "\n".join(lines)


def conversation(session: int, turns: int) -> list[dict[str, Any]]:
    """Up to `turns` tool calls, each with a long result; a read-back request at turns 5 and 7."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are a coding agent. session {session}"},
        {"role": "user", "content": f"Fix the failing tests of service {session}."}]
    for turn in range(turns):
        call_id = f"call_{session}_{turn}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "run", "arguments": orjson.dumps(
                {"cmd": f"pytest -k case_{turn}"}).decode()}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": tool_output(session, turn)})
    if turns in (5, 7):
        messages.append({"role": "user", "content": f"{READ_BACK}call_{session}_0"})
    return messages


def run_traffic(urls: list[str]) -> None:
    """Every session's turns in order; sessions at once; turn n of a session on urls[n % len(urls)]."""
    def one(session: int) -> None:
        with httpx.Client(timeout=60) as client:
            for turn in range(1, TURNS + 1):
                url = urls[(session + turn) % len(urls)]
                answer = client.post(f"{url}/v1/chat/completions", headers={
                    "authorization": "Bearer sk-replica-test", "x-ctxproxy-session": f"s{session}"},
                    json={"model": "gpt-4o", "messages": conversation(session, turn), "tools": [
                        {"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]})
                assert answer.status_code == 200, answer.text
                assert "read_tool_result" not in answer.text  # internal calls never reach the client

    with ThreadPoolExecutor(SESSIONS) as pool:
        list(pool.map(one, range(SESSIONS)))


def write_setup(folder: Path, upstream: str, archive_url: str | None) -> tuple[Path, Path]:
    policies = folder / "policies"
    policies.mkdir(parents=True, exist_ok=True)
    (policies / "default.yaml").write_text(yaml.safe_dump({
        "tool_results": {"threshold_tokens": 400, "keep_recent": 2},
        "budget": {"max_input_tokens": 9000}, "window": {"max_tokens": 5000}}))
    configs = []
    for name in ("a", "b"):
        config: dict[str, Any] = {"upstream": {"base_url": f"{upstream}/v1", "timeout_s": 30},
                                  "data_dir": f"data-{name}", "policies_dir": "policies"}
        if archive_url:
            config["archive"] = {"url": archive_url, "pool_size": 12}
        path = folder / f"config-{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        configs.append(path)
    return configs[0], configs[1]


def start(configs: list[Path], folder: Path) -> tuple[list[subprocess.Popen], list[str]]:
    processes, urls = [], []
    for config in configs:
        port = free_port()
        process = serve(config, port, folder / f"{config.stem}.log")
        processes.append(process)
        urls.append(f"http://127.0.0.1:{port}")
    for process, url in zip(processes, urls, strict=True):
        wait_healthy(process, int(url.rsplit(":", 1)[1]))
    return processes, urls


def stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        # uvicorn shuts down cleanly (the writer flushes), then re-raises the signal it got
        assert process.wait(timeout=60) in (0, -signal.SIGTERM)


@pytest.mark.timeout(300)
def test_two_replicas_rewrite_each_session_as_one_process_would(tmp_path, postgres_url):
    provider = Provider()
    with ServerThread(Starlette(routes=[Route("/v1/chat/completions", provider.chat, methods=["POST"])])) \
            as upstream:
        single_a, _ = write_setup(tmp_path / "single", upstream.url, None)
        processes, urls = start([single_a], tmp_path / "single")
        try:
            run_traffic(urls)
        finally:
            stop(processes)
        alone = dict(provider.bodies)

        provider.bodies.clear()
        pair = write_setup(tmp_path / "pair", upstream.url, postgres_url)
        processes, urls = start(list(pair), tmp_path / "pair")
        try:
            run_traffic(urls)
            with psycopg.connect(postgres_url) as conn:  # both writers committed (a readiness poll)
                calls = sum(len(bodies) for bodies in provider.bodies.values())
                while conn.execute("select count(*) from exchanges").fetchone()[0] < calls:
                    time.sleep(0.05)
            # Session 3's turn 2 went through replica b; this recall goes to replica a.
            asked = [*conversation(3, TURNS), {"role": "user", "content": f"{RECALL}REQ-3-1-42"}]
            recall = httpx.post(f"{urls[0]}/v1/chat/completions", timeout=60, headers={
                "authorization": "Bearer sk-replica-test", "x-ctxproxy-session": "s3"}, json={
                "model": "gpt-4o", "messages": asked})
            assert recall.status_code == 200, recall.text
            answered = orjson.loads(provider.bodies["3"][-1])["messages"][-1]
            assert answered["role"] == "tool" and "REQ-3-1-42" in answered["content"]
        finally:
            stop(processes)
        together = dict(provider.bodies)

    # What the provider got, session by session, request by request (internal rounds included).
    assert sorted(alone) == sorted(together) == sorted(str(s) for s in range(SESSIONS))
    for session in alone:
        extra = 2 if session == "3" else 0  # the recall and its internal round
        assert together[session][:len(together[session]) - extra] == alone[session], f"session {session}"
    sent = list(itertools.chain.from_iterable(alone.values()))
    assert any(b"read_tool_result" in body for body in sent)  # read-backs happened
    assert any(b"[ctxproxy" in body for body in sent)  # summaries / auto-summary were applied

    with psycopg.connect(postgres_url) as conn:
        ids = [row[0] for row in conn.execute("select id from exchanges")]
        upstream_calls = sum(len(bodies) for bodies in together.values())
        assert len(ids) == len(set(ids)) == upstream_calls  # every call archived, once
        pair_rows = conn.execute(f"select {ACCOUNTED} from exchanges order by created_at, rowid").fetchall()
    # The same figures per call, accounting's cache estimates included (they follow the session too).
    with contextlib.closing(sqlite3.connect(tmp_path / "single" / "data-a" / "archive.db")) as db:
        single_rows = db.execute(f"select {ACCOUNTED} from exchanges order by created_at, rowid").fetchall()
    by_session: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for row in single_rows:
        by_session[row[0]].append(tuple(row))
    for row in pair_rows:
        by_session[row[0] + "/pair"].append(tuple(row))
    for session in (f"s{n}" for n in range(SESSIONS)):
        pair = by_session[session + "/pair"]
        assert pair[:len(by_session[session])] == by_session[session], session


@pytest.mark.timeout(120)
def test_the_official_sdk_sees_one_proxy_across_two_replicas(tmp_path, postgres_url):
    """openai's client pointed at replica a, then b, then a: a summary made on one is read back on the
    other, the client never sees our tools, and `ctxproxy report` on the shared archive counts it all."""
    import openai

    from proxy.cli import main

    provider = Provider()
    with ServerThread(Starlette(routes=[Route("/v1/chat/completions", provider.chat, methods=["POST"])])) \
            as upstream:
        pair = write_setup(tmp_path, upstream.url, postgres_url)
        processes, urls = start(list(pair), tmp_path)
        try:
            clients = [openai.OpenAI(base_url=f"{url}/v1", api_key="sk-sdk-test", max_retries=0,
                                     default_headers={"x-ctxproxy-session": "sdk"}) for url in urls]
            for turn, client in zip((3, 4, 5), (clients[0], clients[1], clients[0]), strict=True):
                answer = client.chat.completions.create(model="gpt-4o", messages=conversation(99, turn))
                assert answer.choices[0].message.tool_calls is None
                assert answer.choices[0].message.content.startswith("seen ")
            # turn 5 asked (through replica a) for call_99_0, summarized by turn 3 or 4: the provider got
            # the original back in an internal round
            readback = orjson.loads(provider.bodies["99"][-1])["messages"][-1]
            assert readback["role"] == "tool" and tool_output(99, 0) in readback["content"]
        finally:
            stop(processes)
    report = tmp_path / "report.json"
    with report.open("w") as out, contextlib.redirect_stdout(out):
        assert main(["report", "--config", str(pair[0]), "--by", "none", "--format", "json"]) == 0
    [totals] = orjson.loads(report.read_text())
    assert totals["sessions"] == 1 and totals["reads"] == 1 and totals["requests"] == 3
    assert totals["calls"] == len(provider.bodies["99"]) == 4

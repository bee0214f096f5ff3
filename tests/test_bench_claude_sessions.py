"""The agent sessions of the overhead benchmark (bench/claude_sessions.py): one valid Messages request per
model call, shaped as Claude Code sends it, with its cache markers, the newest one moving every turn; one
valid Responses request per model call, shaped as Codex sends it; the chat request its own agent sent."""

from __future__ import annotations

from pathlib import Path

import orjson

from bench import to_responses
from bench.claude_sessions import chat_requests, claude_sessions, codex_requests, session_requests
from bench.to_messages import breakpoints, violations

CONVERSATION = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Fix the failing test."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "bash", "arguments": '{"cmd": "pytest"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "FAILED tests/test_x.py::test_y - KeyError: 'id'"},
    {"role": "assistant", "content": "The key is missing; reading the file."},
    {"role": "user", "content": "Go on."},
    {"role": "assistant", "content": "Done."},
]


def test_one_marked_request_per_model_call() -> None:
    requests = [orjson.loads(body) for body in session_requests(CONVERSATION)]
    assert len(requests) == 3  # before each assistant message
    for body in requests:
        assert violations(body) == []
        assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
        assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
        assert breakpoints(body) == 2
    # Claude Code's shape: the messages first, then the system prompt and its tools, every turn the same.
    assert [list(body)[:4] for body in requests] == [["model", "messages", "system", "tools"]] * 3
    assert all(body["stream"] is True for body in requests)  # (Claude Code streams every turn)
    assert [t["name"] for t in requests[0]["tools"]][-2:] == ["KillShell", "bash"]  # (its own last)
    assert len(requests[0]["tools"]) == 17 and requests[0]["tools"] == requests[2]["tools"]
    # The earlier turn's marked block is unmarked in the next request (the marker moved).
    assert "cache_control" not in requests[1]["messages"][0]["content"][-1]
    assert requests[1]["messages"][-1]["content"][0]["type"] == "tool_result"


def test_sessions_come_half_from_each_source(tmp_path: Path) -> None:
    for name, turns in (("miniswe_gemini3pro_swebv_dev.jsonl", 1), ("tau2bench_dev.jsonl", 2)):
        lines = [orjson.dumps({"messages": [*CONVERSATION[:2 + 2 * n], CONVERSATION[-1]]})
                 for n in range(turns, turns + 2)]
        (tmp_path / name).write_bytes(b"\n".join(lines))
    sessions = claude_sessions(3, tmp_path)
    assert [len(s) for s in sessions] == [3, 2, 4]  # the longest of each first; the odd one to the first


def test_one_codex_request_per_model_call() -> None:
    requests = [orjson.loads(body) for body in codex_requests(CONVERSATION, "s1")]
    assert len(requests) == 3
    for body in requests:
        assert to_responses.violations(body) == []
        assert body["store"] is False and body["stream"] is True and body["prompt_cache_key"] == "codex-s1"
        assert body["instructions"] == "You are an agent."
    # The whole history resent, growing: each request's input starts with the one before it.
    assert requests[2]["input"][:len(requests[1]["input"])] == requests[1]["input"]
    assert [i["type"] for i in requests[1]["input"]] == ["message", "function_call", "function_call_output"]


def test_codex_sessions_come_from_the_same_conversations(tmp_path: Path) -> None:
    for name in ("miniswe_gemini3pro_swebv_dev.jsonl", "tau2bench_dev.jsonl"):
        (tmp_path / name).write_bytes(orjson.dumps({"messages": CONVERSATION}))
    assert [len(s) for s in claude_sessions(2, tmp_path, shape="codex")] == [3, 3]


def test_one_chat_request_per_model_call_as_the_agent_sent_it(tmp_path: Path) -> None:
    requests = [orjson.loads(body) for body in chat_requests(CONVERSATION)]
    assert [body["messages"] for body in requests] == [CONVERSATION[:2], CONVERSATION[:4], CONVERSATION[:6]]
    assert all(set(body) == {"model", "messages"} for body in requests)  # not streamed, no session id
    for name in ("miniswe_gemini3pro_swebv_dev.jsonl", "tau2bench_dev.jsonl"):
        (tmp_path / name).write_bytes(orjson.dumps({"messages": CONVERSATION}))
    assert [len(s) for s in claude_sessions(2, tmp_path, shape="chat")] == [3, 3]

"""The retention benchmark's metric functions on small conversations written here (no shared traces)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench import retention
from bench.replay import with_window
from bench.retention_metrics import (
    mask,
    needles,
    occurs,
    summary_queries,
    task_index,
    truncate,
    visible_handles,
)
from bench.retention_run import (
    Masking,
    Passthrough,
    Proxy,
    Setting,
    Tally,
    Truncation,
    cost_w,
    run_conversation,
)
from proxy.policy import PolicyStore
from proxy.replay import pairing_errors
from proxy.state import StateStore
from proxy.tokens import TokenCounter

ROOT = Path(__file__).resolve().parent.parent


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def tool_loop() -> list[dict[str, Any]]:
    """A task, then two turns of tool calls (one with two calls) and a final answer."""
    return [
        {"role": "system", "content": "You are an agent. Ticket SYS9001 is closed."},
        {"role": "user", "content": "Fix the crash in src/app.py for order ORD77123."},
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "read_file", {"path": "src/app.py"}),
                                                              call("c2", "grep", {"q": "ORD77123"})]},
        {"role": "tool", "tool_call_id": "c1",
         "content": "def main():\n    total = 2100\n    ref = 'lib/util.py'\n    return total"},
        {"role": "tool", "tool_call_id": "c2",
         "content": "ORD77123 amount 250.75 SYS9001 unused XY99999, pending a review by the billing team"},
        {"role": "assistant", "content": "The order costs 250.75; ticket SYS9001.", "tool_calls": [
            call("c3", "read_file", {"path": "lib/util.py"})]},
        {"role": "tool", "tool_call_id": "c3", "content": "value = 100"},
        {"role": "assistant", "content": "Fixed: lib/util.py now returns 100 for ORD77123."},
    ]


def test_task_statement_skips_greetings_and_demonstrations() -> None:
    greeting = [{"role": "system", "content": "s"}, {"role": "assistant", "content": "Hi! How can I help?"},
                {"role": "user", "content": "Cancel reservation HX12AB"}]
    assert task_index(greeting) == 2
    demo = [{"role": "system", "content": "s"}, {"role": "user", "content": "Here is a demonstration of it"},
            {"role": "user", "content": "ISSUE: crash"}]
    assert task_index(demo) == 2
    loop: list[dict[str, Any]] = [{"role": "system", "content": "s"}, {"role": "assistant", "content": None,
                                                 "tool_calls": [call("a", "f", {})]}]
    assert task_index(loop) is None


def test_occurs_matches_whole_tokens_only() -> None:
    assert occurs("100", "returns 100.")
    assert not occurs("100", "total 2100")
    assert not occurs("100", "ratio 100.5")
    assert occurs("db/models/base.py", "in django/db/models/base.py:12")
    assert not occurs("src/app.py", "src/app.pyc")


def test_needles_are_reused_tokens_not_in_the_system_prompt() -> None:
    found = needles(tool_loop(), None)
    # 2100 and XY99999 are never used again; SYS9001 is in the system prompt; 100 is used by the last answer.
    assert found == {"src/app.py", "ORD77123", "lib/util.py", "250.75", "100"}


def test_truncation_drops_oldest_and_never_orphans_a_tool_result() -> None:
    messages = tool_loop()[:-1]

    def count(kept: list[dict[str, Any]]) -> int:
        return sum(len(str(m.get("content") or "")) + 40 * len(m.get("tool_calls") or ()) for m in kept)

    for budget in range(0, count(messages) + 1, 7):
        kept = truncate(messages, budget, count)
        assert kept[0] == messages[0]
        assert kept[-1] == messages[-1]
        assert pairing_errors(kept) == []
        assert kept[1].get("role") != "tool"
        if count(kept) > budget:  # nothing fits: only the newest turn (a call with its result) is left
            assert kept == [messages[0], *messages[5:]]
    assert truncate(messages, 10**6, count) is messages


def test_masking_replaces_old_outputs_only() -> None:
    messages = tool_loop()[:-1]
    out, masked = mask(messages, 1, user_observations=False)
    assert [i for i, _ in masked] == [3, 4]  # the outputs of the older turn; the newest turn's result stays
    assert out[3]["content"].startswith("[old output omitted") and "\n" not in out[3]["content"]
    assert out[6] == messages[6] and out[5] == messages[5]
    assert pairing_errors(out) == []
    text = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"},
            {"role": "assistant", "content": "ls"},
            {"role": "user", "content": " ".join(f"file{i}.py" for i in range(20))},
            {"role": "assistant", "content": "cat a.py"}, {"role": "user", "content": "print(1)"}]
    out, masked = mask(text, 1, user_observations=True)
    assert [i for i, _ in masked] == [3] and out[1] == text[1]
    assert mask(text, 1, user_observations=False)[1] == []


def test_handles_and_queries_from_what_the_prompt_shows() -> None:
    text = ('[ctxproxy summary of tool result call_id=call_9: original 900 tokens] ... '
            'read_tool_result(call_id="call_9") [summarized: call_id=x#2] placeholder')
    assert visible_handles(text) == ["call_9:", "call_9", "x#2"]
    block = ("[ctxproxy auto-summary: 2 earlier exchanges]\n## Earlier in this session\n"
             "- (Sun 10:00, ~1.2k tokens) cat src/app.py · tools: read_file\n"
             "- (2 older exchanges not listed)\n"
             "Older history is available via recall(query).")
    assert summary_queries(block) == ["cat src/app.py · tools: read_file"]


def test_reachable_through_one_read_tool_result_of_a_visible_handle(tmp_path: Path) -> None:
    default = PolicyStore(ROOT / "policies").get("default")
    setting = Setting("gpt-4o", 16000, 9600, 10, False, False)
    conversation = {"id": "r1", "messages": tool_loop(), "tools": None}
    proxy = Proxy(default, conversation, setting, TokenCounter())
    state = proxy.store.get("retention", proxy.session.id)
    proxy.store.record(state, "c2", "ORD77123 amount 250.75 NEEDLE4242", "grep", "[summarized: call_id=c2] x",
                       "placeholder")
    forwarded = [{"role": "tool", "tool_call_id": "c2", "content": "[summarized: call_id=c2] x"}]
    tally = Tally()
    reached = proxy.reach(forwarded, {"read_tool_result"}, {"NEEDLE4242", "ABSENT999"}, tally, None)
    assert reached == {"NEEDLE4242"} and tally.reads == 1
    hidden = [{"role": "tool", "tool_call_id": "c2", "content": "a summary naming no handle"}]
    assert proxy.reach(hidden, {"read_tool_result"}, {"NEEDLE4242"}, Tally(), None) == set()
    assert isinstance(proxy.store, StateStore)


def test_every_strategy_on_one_conversation() -> None:
    """A big early tool result: ctxproxy summarizes it and reads it back; the baselines pair safely."""
    tokens = TokenCounter()
    big = "\n".join(f"row {i}: id=ITEM{i:05d} path=data/part{i}.csv status=ok" for i in range(400))
    messages = tool_loop()
    messages[3] = {**messages[3], "content": big + "\nITEM00007 is the one"}
    messages[-1] = {"role": "assistant", "content": "Done: ITEM00007 in data/part7.csv fixed."}
    conversation = {"id": "e2e", "messages": messages, "tools": None}
    default = with_window(PolicyStore(ROOT / "policies").get("default"), 128000)  # no litellm lookup
    setting = Setting("gpt-4o", 128000, 1500, 1, False, False)

    def count(kept: list[dict[str, Any]]) -> int:
        return tokens.request(kept, None, "gpt-4o")

    strategies = [Proxy(default, conversation, setting, tokens), Passthrough(None, count),
                  Truncation(None, count, 1500), Masking(None, count, 1, False)]
    result = {k: v.report() for k, v in run_conversation(conversation, strategies, setting, tokens).items()}
    for report in result.values():
        assert report["errors"] == 0 and report["pairing_errors"] == 0 and report["requests"] == 3
        assert report["needles"] >= 2
    assert result["passthrough"]["needles_in_prompt"] == 1.0 and result["passthrough"]["token_ratio"] == 1.0
    assert result["truncation"]["token_ratio"] < 1.0
    assert result["masking"]["replaced"] == 2 and result["masking"]["read_back"] is None
    proxy = result["ctxproxy:default"]
    assert proxy["replaced"] >= 1 and proxy["read_back"] == 1.0
    assert proxy["needles_reachable"] == 1.0  # the summary names its call_id: one read gives the original
    assert proxy["critical"] > 0


def test_tally_round_trip_and_write_price() -> None:
    tally = Tally(conversations=1, requests=2, needles=4, needles_in_prompt=3)
    tally.kinds["summary"] += 2
    again = Tally.from_dict(orjson.loads(orjson.dumps(tally.to_dict())))
    again.add(tally)
    assert again.report()["needles_in_prompt"] == 0.75 and again.kinds["summary"] == 4
    assert cost_w(2000, 1000) == pytest.approx(100 + 1250)
    assert cost_w(500, 0) == 500


def test_cli_on_a_fixture_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conversation: dict[str, Any] = {"id": "f1", "model": "gpt-4o", "messages": tool_loop(), "tools": None,
                                    "meta": {}}
    (tmp_path / "fixture_dev.jsonl").write_text(json.dumps(conversation) + "\n")
    retention.main(["--traces", str(tmp_path), "--windows", "16000", "--policies", "default,passthrough",
                    "--workers", "1", "--json"])
    result = json.loads(capsys.readouterr().out)
    overall = result["windows"]["16000"]["overall"]
    assert list(overall) == ["ctxproxy:default", "ctxproxy:passthrough", "passthrough", "truncation",
                             "masking"]
    assert all(row["conversations"] == 1 and row["errors"] == 0 for row in overall.values())

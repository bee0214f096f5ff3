"""Working memory and folded memory through the real server."""

from __future__ import annotations

import time

import httpx
import orjson

from tests.conftest import BOTH_BACKENDS
from tests.servers import Seen, Step

PAGES = [{"id": f"page-{i}", "title": f"Page {i}"} for i in range(1, 8)]


def post(proxy, policy, messages, session="mem-1"):
    response = httpx.post(f"{proxy.url}/p/{policy}/v1/chat/completions", timeout=30,
                          json={"model": "gpt-4o", "messages": messages},
                          headers={"x-ctxproxy-session": session})
    assert response.status_code == 200
    return response


def call(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": orjson.dumps(arguments).decode()}}


@BOTH_BACKENDS
def test_working_memory_block_names_recent_entities_before_the_last_user_message(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "wm.yaml").write_text("working_memory:\n  enabled: true\n  inject: always\n")
    messages = [
        {"role": "system", "content": "You edit a website."},
        {"role": "user", "content": "Show me the pages."},
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "list_pages", {})]},
        {"role": "tool", "tool_call_id": "c1", "content": orjson.dumps({"pages": PAGES}).decode()},
        {"role": "assistant", "content": "There are 7 pages."},
        {"role": "user", "content": "Rename it to Home."},
    ]
    post(proxy, "wm", messages)
    forwarded = fake_upstream.chat_requests[-1].json()["messages"]
    assert forwarded[-1] == messages[-1]  # the last user message stays last, unchanged
    block = forwarded[-2]["content"]
    assert block.startswith("[WORKING MEMORY]")
    assert '"Page 3" (page-3)' in block and "page-4" not in block  # at most 3 from a list
    assert forwarded[:-2] == messages[:-1]
    # The memory is per session and persisted: a restart-free follow-up keeps it, another session has none.
    post(proxy, "wm", [messages[0], {"role": "user", "content": "hello"}], session="other")
    assert "[WORKING MEMORY]" not in str(fake_upstream.chat_requests[-1].json()["messages"])
    proxy.flush()
    saved = next(proxy.query("select data from session_memory where kind = 'working'"))
    assert orjson.loads(saved["data"])["memory"]["version"] == 1


def tool_turn(k: int) -> list[dict]:
    output = "\n".join(f"module_{k}_{i}: compiled ok" for i in range(40))
    make = call(f"b{k}", "bash", {"cmd": f"make {k}"})
    return [{"role": "assistant", "content": None, "tool_calls": [make]},
            {"role": "tool", "tool_call_id": f"b{k}", "content": output},
            {"role": "assistant", "content": f"Decided to build module {k} next because it is small."},
            {"role": "user", "content": f"Continue after {k}."}]


def episode_answer(seen: Seen) -> Step:
    assert seen.json()["messages"][0]["role"] == "system"
    return Step(content="```json\n" + orjson.dumps({
        "summary": "Built the first modules with make.",
        "decisions": [{"decision": "Build small modules first", "reason": "they fail fast"}],
        "eliminated": [{"approach": "parallel make -j16", "why": "ran out of memory"}],
        "open_questions": ["Is module 9 still needed?"], "tool_results": {"make 0": "compiled ok"},
    }).decode() + "\n```")


@BOTH_BACKENDS
def test_folded_memory_round_trip_with_a_scripted_model(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "fold.yaml").write_text(
        "budget:\n  max_input_tokens: 4000\nfolded:\n  enabled: true\n  summarizer_model: fold-model\n")
    answers = iter([Step(content="not json at all"), None])  # the first answer is invalid: retried

    def fold_model(seen: Seen) -> Step:
        scripted = next(answers, None)
        return scripted or episode_answer(seen)

    fake_upstream.by_model["fold-model"] = fold_model
    messages = [{"role": "system", "content": "You are a build agent."},
                {"role": "user", "content": "Build everything."}]
    blocks = []
    for k in range(40):
        post(proxy, "fold", messages, session="fold-1")
        deadline = time.monotonic() + 10
        while proxy.state.tasks and time.monotonic() < deadline:  # condition wait: folding done
            time.sleep(0.01)
        forwarded = [r for r in fake_upstream.chat_requests if r.json()["model"] == "gpt-4o"][-1].json()
        found = [m["content"] for m in forwarded["messages"] if str(m.get("content")).startswith("## Folded")]
        if found:
            blocks.append(found[0])
            if "Build small modules first" in found[0]:
                break
        messages += tool_turn(k)
    assert blocks and "Build small modules first" in blocks[-1]  # the model's episode, validated
    fold_calls = [r for r in fake_upstream.chat_requests if r.json()["model"] == "fold-model"]
    assert len(fold_calls) >= 2  # the invalid answer was retried
    proxy.flush()
    saved = next(proxy.query("select data from session_memory where kind = 'folded'"))
    assert "Build small modules first" in saved["data"] and "parallel make -j16" in saved["data"]


def test_folded_memory_without_a_model_uses_the_deterministic_fallback(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "fold.yaml").write_text(
        "budget:\n  max_input_tokens: 4000\nfolded:\n  enabled: true\n")
    messages = [{"role": "system", "content": "You are a build agent."},
                {"role": "user", "content": "Build everything."}]
    for k in range(30):
        post(proxy, "fold", messages, session="fold-2")
        messages += tool_turn(k)
    forwarded = fake_upstream.chat_requests[-1].json()["messages"]
    block = next(m["content"] for m in forwarded if str(m.get("content")).startswith("## Folded"))
    assert "build module" in block.lower()  # decisions extracted from the evicted assistant turns

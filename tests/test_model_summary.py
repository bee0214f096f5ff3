"""The optional summarizer model: used once per tool result, sticky, with a deterministic fallback."""

from __future__ import annotations

import httpx

from tests.servers import Seen, Step
from tests.test_rounds import BIG, TOOLS, history


def summarizer_answer(seen: Seen) -> Step:
    body = seen.json()
    assert body["model"] == "summ-model" and body["temperature"] == 0
    assert BIG[:200] in body["messages"][-1]["content"]
    return Step(content="500 lines of `line N: value=...` records; paths src/mod_0.py..src/mod_12.py.")


def post(proxy, messages, policy="summ"):
    return httpx.post(f"{proxy.url}/p/{policy}/v1/chat/completions",
                      json={"model": "gpt-4o", "messages": messages, "tools": TOOLS},
                      headers={"authorization": "Bearer k"})


def test_model_summary_is_used_once_and_stays(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "summ.yaml").write_text("tool_results:\n  summarizer_model: summ-model\n")
    fake_upstream.then(summarizer_answer, Step(content="first answer"), Step(content="second answer"))
    assert post(proxy, history()).status_code == 200
    summarize_call, first = fake_upstream.chat_requests
    tool_message = first.json()["messages"][-1]["content"]
    assert "This is a summary, not the output" in tool_message
    assert "paths src/mod_0.py..src/mod_12.py" in tool_message
    assert summarize_call.headers["authorization"] == "Bearer k"  # billed to the same key
    later = [*history(), {"role": "assistant", "content": "first answer"},
             {"role": "user", "content": "more"}]
    assert post(proxy, later).status_code == 200
    assert len(fake_upstream.chat_requests) == 3  # no second summarizer call
    assert fake_upstream.chat_requests[2].json()["messages"][3]["content"] == tool_message


def test_failed_summarizer_falls_back_to_the_deterministic_summary(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "summ.yaml").write_text("tool_results:\n  summarizer_model: summ-model\n")
    fake_upstream.then(Step(kind="error", status=500, body=b'{"error": {"message": "down"}}'),
                       Step(content="answer"))
    assert post(proxy, history()).status_code == 200
    tool_message = fake_upstream.chat_requests[1].json()["messages"][-1]["content"]
    assert "This is a summary, not the output" in tool_message
    assert "500 lines" in tool_message and "L1: line 0: value=0 path=src/mod_0.py" in tool_message

"""Issue 9 through the real server and the openai SDK: a text-protocol agent (mini-swe-agent's shape, no
tool calls; command output comes back as user messages) gets its long observations summarized like tool
results, and the model reads one back byte for byte with read_tool_result by the handle the summary
names, streaming and not — the client never sees the internal call."""

from __future__ import annotations

import orjson
import pytest

from proxy.layers.observations import handle_for
from tests.servers import Seen, Step, stream_chunks

POLICY = "tool_results:\n  threshold_tokens: 300\n"


def observation(turn: int) -> str:
    listing = "\n".join(f"-rw-r--r-- 1 root root {4000 + i:5d} Oct 24 django/db/models/file_{turn}_{i:03d}.py"
                        for i in range(120))
    return f"<returncode>0</returncode>\n<output>\n{listing}\n</output>"


def history() -> list[dict]:
    messages = [{"role": "system", "content": "You run exactly one bash command per turn."},
                {"role": "user", "content": "<pr_description>Fix models.W042 on inherited primary keys"
                                            "</pr_description>"}]
    for turn in range(3):
        command = f"THOUGHT: list the models.\n```bash\nls -la m{turn}\n```"
        messages += [{"role": "assistant", "content": command},
                     {"role": "user", "content": observation(turn)}]
    return messages


@pytest.mark.parametrize("stream", [False, True])
def test_observations_are_summarized_and_read_back_through_the_proxy(make_proxy, fake_upstream, stream):
    proxy = make_proxy()
    (proxy.policies_dir / "swe.yaml").write_text(POLICY)
    messages = history()
    wanted = handle_for(messages[3]["content"])
    read = {"id": "int_read", "type": "function",
            "function": {"name": "read_tool_result", "arguments": orjson.dumps({"call_id": wanted}).decode()}}

    def first_round(seen: Seen) -> Step:
        forwarded = seen.json()["messages"]
        assert forwarded[1] == messages[1], "the task statement is never summarized"
        assert forwarded[3]["role"] == "user" and f"call_id={wanted}" in forwarded[3]["content"]
        assert len(forwarded[3]["content"]) < len(messages[3]["content"]) // 2
        assert [t["function"]["name"] for t in seen.json()["tools"]] == ["read_tool_result", "recall"]
        if stream:
            return Step(kind="stream", chunks=stream_chunks([], tool_calls=[read]))
        return Step(tool_calls=[read])

    def second_round(seen: Seen) -> Step:
        answer = seen.json()["messages"][-1]
        assert answer == {"role": "tool", "tool_call_id": "int_read", "content": messages[3]["content"]}
        text = ["THOUGHT: file_0_042.py it is.\n```bash\ncat django/db/models/file_0_042.py\n```"]
        return Step(kind="stream", chunks=stream_chunks(text)) if stream else Step(content=text[0])

    fake_upstream.then(first_round, second_round)
    client = proxy.client(base_url=f"{proxy.url}/p/swe/v1")
    headers = {"x-ctxproxy-session": f"swe-{stream}"}
    if stream:
        chunks = list(client.chat.completions.create(model="gpt-4o", messages=messages, stream=True,
                                                     extra_headers=headers))
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    else:
        reply = client.chat.completions.create(model="gpt-4o", messages=messages, extra_headers=headers)
        content = reply.choices[0].message.content or ""
        assert reply.choices[0].message.tool_calls is None
    assert content.startswith("THOUGHT: file_0_042.py it is.")
